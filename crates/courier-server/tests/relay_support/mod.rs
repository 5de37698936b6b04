//! Helpers for the relay tests: a database per test, a daemon on port 0,
//! Redis keys under a prefix of the test's own, JetStream streams of the
//! test's own (deleted at the end), and Redis and NATS servers a test starts,
//! kills with SIGKILL and restarts itself.
// Test helpers: a panic is the failure report, and not every test uses every helper.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream;
use courier::redis::redis::{self, AsyncCommands};
use courier::redis::RedisStreamStore;
use courier::{AdminStore, StreamEntry, StreamEntryId, StreamKey, StreamStore};
use courier_server::config::{
    Config, NativeStreamTargetConfig, NatsSection, NatsTargetConfig, RedisSection,
    RedisStreamTargetConfig, RetryConfig, SubscriptionConfig, TargetConfig,
};
use courier_testkit::{PgFixture, SqliteFixture};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use uuid::Uuid;

/// The shared Redis the end-to-end tests use (under a prefix of their own).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The shared NATS the end-to-end tests use (streams of their own).
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A short random tag for names (`a1b2c3d4e5f6`).
pub fn tag() -> String {
    Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// The outbox database of a test.
pub enum Db {
    Postgres(PgFixture),
    Sqlite(SqliteFixture),
}

impl Db {
    pub async fn postgres() -> Self {
        Db::Postgres(PgFixture::new().await.unwrap())
    }

    pub async fn sqlite() -> Self {
        Db::Sqlite(SqliteFixture::new().await.unwrap())
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    /// A daemon config on this database, listening on port 0.
    pub fn config(&self, subscriptions: Vec<SubscriptionConfig>) -> Config {
        let (database_url, schema) = match self {
            Db::Postgres(fixture) => (courier_testkit::database_url(), fixture.schema.clone()),
            Db::Sqlite(fixture) => (
                fixture.path.to_str().unwrap().to_owned(),
                "courier".to_owned(),
            ),
        };
        Config {
            database_url,
            schema,
            listen: "127.0.0.1:0".parse().unwrap(),
            shutdown_timeout_ms: 5_000,
            subscriptions,
            ..Config::default()
        }
    }

    /// Open deliveries of `subscription`, by state.
    async fn totals(&self, subscription: &str) -> courier::DeliveryTotals {
        match self {
            Db::Postgres(f) => courier_testkit::Backend::courier(f)
                .store()
                .delivery_totals(None, Some(subscription))
                .await
                .unwrap(),
            Db::Sqlite(f) => courier_testkit::Backend::courier(f)
                .store()
                .delivery_totals(None, Some(subscription))
                .await
                .unwrap(),
        }
    }

    /// (open, dead) deliveries of `subscription`.
    pub async fn open_and_dead(&self, subscription: &str) -> (i64, i64) {
        let totals = self.totals(subscription).await;
        (totals.available + totals.running, totals.dead)
    }

    /// Running deliveries of `subscription`.
    pub async fn running(&self, subscription: &str) -> i64 {
        self.totals(subscription).await.running
    }

    /// Waits until `subscription` has nothing open; panics after `limit`.
    pub async fn wait_drained(&self, subscription: &str, limit: Duration) {
        let drained = courier_testkit::eventually(limit, || async {
            self.open_and_dead(subscription).await.0 == 0
        })
        .await;
        assert!(
            drained,
            "{subscription} still has open deliveries: {:?}",
            self.open_and_dead(subscription).await
        );
    }

    /// Makes every running lease look expired to the next rescue.
    pub async fn expire_leases(&self) -> u64 {
        match self {
            Db::Postgres(f) => courier_testkit::Backend::expire_leases(f).await.unwrap(),
            Db::Sqlite(f) => courier_testkit::Backend::expire_leases(f).await.unwrap(),
        }
    }

    /// Every entry of a native stream (waiting, on PostgreSQL, until the
    /// newest committed append is readable).
    pub async fn native_entries(&self, key: &StreamKey) -> Vec<StreamEntry> {
        match self {
            Db::Postgres(f) => {
                let store = courier_testkit::Backend::courier(f).store().clone();
                // Entries are handed out below the xmin horizon, which other
                // tests' open transactions hold back: wait until everything
                // committed by now is readable.
                let next_xid: i64 = sqlx::query_scalar(
                    "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
                )
                .fetch_one(store.pool())
                .await
                .unwrap();
                let newest = courier::StreamEntryId::new(next_xid as u64 - 1, 0);
                assert!(
                    store
                        .wait_until_readable(newest, Duration::from_secs(30))
                        .await
                        .unwrap(),
                    "the stream's entries did not become readable within 30 s"
                );
                read_all(&store, key).await
            }
            Db::Sqlite(f) => {
                let store = courier_testkit::Backend::courier(f).store().clone();
                read_all(&store, key).await
            }
        }
    }

    /// Appends `entries` to a native stream.
    pub async fn native_append(&self, key: &StreamKey, entries: &[courier::NewStreamEntry]) {
        match self {
            Db::Postgres(f) => {
                courier_testkit::Backend::courier(f)
                    .store()
                    .append(key, entries)
                    .await
                    .unwrap();
            }
            Db::Sqlite(f) => {
                courier_testkit::Backend::courier(f)
                    .store()
                    .append(key, entries)
                    .await
                    .unwrap();
            }
        }
    }
}

/// Every entry of `key`, paging with `range`.
pub async fn read_all<S: StreamStore>(store: &S, key: &StreamKey) -> Vec<StreamEntry> {
    let mut entries = Vec::new();
    let mut after = StreamEntryId::ZERO;
    loop {
        let page = store.range(key, after, 1000).await.unwrap();
        let Some(last) = page.last() else {
            return entries;
        };
        after = last.id;
        entries.extend(page);
    }
}

/// A subscription with fast retries (and many of them: outages cost attempts).
pub fn subscription(name: &str, topics: &[&str], target: TargetConfig) -> SubscriptionConfig {
    SubscriptionConfig {
        name: name.into(),
        topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        tenants: None,
        versions: None,
        topic_retry: Default::default(),
        retry: RetryConfig {
            max_attempts: 200,
            base_ms: 20,
            cap_ms: 200,
        },
        concurrency: 16,
        replay: None,
        target,
    }
}

pub fn redis_target(stream: &str) -> TargetConfig {
    TargetConfig::RedisStream(RedisStreamTargetConfig {
        stream: stream.into(),
        maxlen: None,
        dedupe_ttl_ms: None,
    })
}

pub fn nats_target(subject: &str, stream: &str) -> TargetConfig {
    TargetConfig::Nats(NatsTargetConfig {
        subject: subject.into(),
        stream: stream.into(),
        timeout_ms: 2_000,
    })
}

pub fn native_target(stream: &str) -> TargetConfig {
    TargetConfig::Stream(NativeStreamTargetConfig {
        stream: stream.into(),
    })
}

pub fn redis_section(url: &str, prefix: &str) -> Option<RedisSection> {
    Some(RedisSection {
        url: url.into(),
        key_prefix: prefix.into(),
    })
}

pub fn nats_section(url: &str) -> Option<NatsSection> {
    Some(NatsSection { url: url.into() })
}

/// A daemon started with `courier_server::bind`.
pub struct Daemon {
    pub address: SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), courier_server::ServeError>>,
    client: reqwest::Client,
}

impl Daemon {
    pub async fn start(config: Config) -> Result<Self, courier_server::ServeError> {
        let (stop, stopped) = oneshot::channel::<()>();
        let running = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await?;
        let address = running.local_addr();
        let done = tokio::spawn(running.finished());
        Ok(Self {
            address,
            stop,
            done,
            client: reqwest::Client::new(),
        })
    }

    /// Publishes `messages` (API bodies) in one batch; returns their ids.
    pub async fn publish(&self, messages: Vec<Value>) -> Vec<Uuid> {
        let response = self
            .client
            .post(format!("http://{}/v1/messages/batch", self.address))
            .header("content-type", "application/json")
            .body(json!({ "messages": messages }).to_string())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(status, 201, "{body}");
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().parse().unwrap())
            .collect()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("http://{}/metrics", self.address))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The dead letters of `subscription` (API items).
    pub async fn dead_letters(&self, subscription: &str) -> Vec<Value> {
        let bytes = self
            .client
            .get(format!(
                "http://{}/v1/dead-letters?subscription={subscription}",
                self.address
            ))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        body["items"].as_array().cloned().unwrap_or_default()
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let result = tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("the daemon did not stop within 30 s")
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
}

/// The value of the counter `name` with exactly these labels in a Prometheus
/// text (0 when absent).
pub fn counter(metrics: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .map(|v| v as u64)
        .sum()
}

/// A message body for the API.
pub fn message(tenant: &str, topic: &str, n: usize) -> Value {
    json!({
        "tenant": tenant,
        "topic": topic,
        "schema_version": 2,
        "payload": {"n": n, "nested": {"text": format!("message {n}")}},
        "headers": {"trace": format!("t-{n}")},
    })
}

/// Counts entries by their origin message id.
pub fn by_message_id(entries: &[StreamEntry]) -> BTreeMap<Uuid, usize> {
    let mut counts = BTreeMap::new();
    for entry in entries {
        let origin = entry
            .origin
            .as_ref()
            .expect("a relayed entry has an origin");
        *counts.entry(origin.message_id).or_insert(0) += 1;
    }
    counts
}

/// Deletes every key under `prefix` on the Redis at `url`.
pub async fn delete_prefix(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = {
        let mut keys = Vec::new();
        let mut iter: redis::AsyncIter<'_, String> =
            conn.scan_match(format!("{prefix}*")).await.unwrap();
        while let Some(key) = iter.next_item().await {
            keys.push(key.unwrap());
        }
        keys
    };
    for chunk in keys.chunks(500) {
        let _: () = conn.del(chunk).await.unwrap();
    }
}

/// A Redis stream store on `url` under `prefix`.
pub async fn redis_store(url: &str, prefix: &str) -> RedisStreamStore {
    RedisStreamStore::connect(url, prefix).await.unwrap()
}

/// Creates a JetStream file stream `name` on `subjects` with `duplicate_window`.
pub async fn create_jetstream(
    client: &async_nats::Client,
    name: &str,
    subjects: &str,
    duplicate_window: Duration,
) -> jetstream::stream::Stream {
    let context = jetstream::new(client.clone());
    context
        .create_stream(jetstream::stream::Config {
            name: name.into(),
            subjects: vec![subjects.into()],
            duplicate_window,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap()
}

pub async fn delete_jetstream(client: &async_nats::Client, name: &str) {
    let _ = jetstream::new(client.clone()).delete_stream(name).await;
}

/// How many messages JetStream stream `name` holds.
pub async fn jetstream_count(client: &async_nats::Client, name: &str) -> u64 {
    let context = jetstream::new(client.clone());
    let mut stream = context.get_stream(name).await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// A message read back from JetStream.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub msg_id: String,
    pub headers: BTreeMap<String, String>,
    pub payload: Value,
}

/// Every message `stream` holds, read by a JetStream pull consumer of the
/// test's own (deleted afterwards).
pub async fn jetstream_messages(client: &async_nats::Client, name: &str) -> Vec<Stored> {
    use futures_util::StreamExt;
    let context = jetstream::new(client.clone());
    let mut stream = context.get_stream(name).await.unwrap();
    let total = stream.info().await.unwrap().state.messages;
    let durable = format!("reader-{}", tag());
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(durable.clone()),
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    while (out.len() as u64) < total {
        let mut batch = consumer
            .fetch()
            .max_messages(500)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.unwrap();
            got += 1;
            let mut headers = BTreeMap::new();
            if let Some(map) = &message.headers {
                for (name, values) in map.iter() {
                    if let Some(value) = values.first() {
                        headers.insert(name.to_string(), value.as_str().to_owned());
                    }
                }
            }
            out.push(Stored {
                subject: message.subject.to_string(),
                msg_id: headers.get("Nats-Msg-Id").cloned().unwrap_or_default(),
                headers,
                payload: serde_json::from_slice(&message.payload).unwrap(),
            });
        }
        assert!(got > 0, "the consumer stopped at {} of {total}", out.len());
    }
    let _ = stream.delete_consumer(&durable).await;
    out
}

/// A free TCP port on 127.0.0.1 (bound and released: a test races nobody
/// for it but other tests, which pick their own).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Waits until something accepts TCP connections on `port`.
pub async fn wait_for_port(port: u16, limit: Duration) -> bool {
    courier_testkit::eventually(limit, || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await
}

/// A redis-server of the test's own: AOF with an fsync per write, on a
/// fixed port and directory, so a SIGKILL loses nothing that was answered
/// and a restart finds everything again.
pub struct OwnRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    pub async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.spawn().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        let up = courier_testkit::eventually(Duration::from_secs(20), || {
            let client = client.clone();
            async move {
                match client.get_multiplexed_async_connection().await {
                    Ok(mut conn) => redis::cmd("PING")
                        .query_async::<String>(&mut conn)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        assert!(up, "redis-server on port {} did not come up", self.port);
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// Starts again on the same port and directory.
    pub async fn restart(&mut self) {
        self.spawn().await;
    }
}

/// A nats-server with JetStream of the test's own, storing in a directory
/// that survives its restarts.
pub struct OwnNats {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnNats {
    pub async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.spawn().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn store_dir(&self) -> &Path {
        self.dir.path()
    }

    async fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
            .arg("-sd")
            .arg(PathBuf::from(self.dir.path()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed");
        self.child = Some(child);
        assert!(
            wait_for_port(self.port, Duration::from_secs(20)).await,
            "nats-server on port {} did not come up",
            self.port
        );
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// Starts again on the same port and store directory.
    pub async fn restart(&mut self) {
        self.spawn().await;
    }
}

/// Connects a test's own NATS client.
pub async fn nats_client(url: &str) -> async_nats::Client {
    async_nats::connect(url).await.unwrap()
}

/// Counts JetStream messages by their outbox message id
/// (`Courier-Message-Id`), checking each one's `Nats-Msg-Id` is
/// `{subject}:{message id}`.
pub fn count_by_message_id(stored: &[Stored]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for message in stored {
        let id = message.headers["Courier-Message-Id"].clone();
        assert_eq!(message.msg_id, format!("{}:{id}", message.subject));
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// The Redis stream key of `(tenant, stream)` under `prefix`.
pub fn key(tenant: &str, stream: &str) -> StreamKey {
    StreamKey::new(tenant, stream).unwrap()
}

/// Waits (up to `limit`) until `check` holds, polling.
pub async fn until<F, Fut>(limit: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    courier_testkit::eventually(limit, check).await
}

/// XLEN of `key` on `url`, or `None` while the server is down.
pub async fn xlen(url: &str, key: &str) -> Option<u64> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    conn.xlen(key).await.ok()
}
