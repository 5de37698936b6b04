//! Relays end to end: the daemon (`courier_server::bind` on port 0) relays
//! to the shared Redis (keys under a prefix of each test's own), the shared
//! NATS (a JetStream stream of each test's own, deleted at the end) and
//! native streams, on PostgreSQL and SQLite; a worker that published
//! downstream dies before completing, and the daemon's redelivery appends
//! nothing twice.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod relay_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier::{
    Courier, EntryOrigin, Handler, HandlerError, Message, NewMessage, NewStreamEntry, OutboxStore,
    TransactionalHandler,
};
use courier_server::config::SubscriptionConfig;
use courier_server::relay::{NativeRelay, NativeStreamStore, NatsRelay, RedisRelay, Relayed};
use courier_server::RawPayload;
use relay_support::*;
use serde_json::{json, Value};
use uuid::Uuid;

const TOPICS: [&str; 2] = ["order.placed", "order.paid"];
const TENANTS: [&str; 2] = ["acme", "globex"];

/// 20 messages over two tenants and two topics, and one on a topic the
/// subscription does not take.
fn bodies() -> Vec<Value> {
    let mut bodies: Vec<Value> = (0..20)
        .map(|n| message(TENANTS[n % 2], TOPICS[(n / 2) % 2], n))
        .collect();
    bodies.push(message("acme", "invoice.paid", 99));
    bodies
}

/// One copy of a message as read downstream.
#[derive(Debug)]
struct Copy {
    tenant: String,
    topic: String,
    schema_version: i32,
    payload: Value,
    headers: BTreeMap<String, String>,
}

/// The copies found downstream, by message id.
type Found = BTreeMap<Uuid, Vec<Copy>>;

/// Checks that every relayed message is there once, with its origin,
/// payload and headers, and nothing else is.
fn assert_each_once(ids: &[Uuid], bodies: &[Value], found: &Found) {
    let expected: Vec<(Uuid, &Value)> = ids
        .iter()
        .copied()
        .zip(bodies)
        .filter(|(_, body)| body["topic"] != json!("invoice.paid"))
        .collect();
    assert_eq!(found.len(), expected.len(), "{found:?}");
    for (id, body) in expected {
        let copies = found
            .get(&id)
            .unwrap_or_else(|| panic!("{id} is missing downstream"));
        assert_eq!(copies.len(), 1, "{id} is downstream {} times", copies.len());
        let copy = &copies[0];
        assert_eq!(json!(copy.tenant), body["tenant"]);
        assert_eq!(json!(copy.topic), body["topic"]);
        assert_eq!(copy.schema_version, 2);
        assert_eq!(copy.payload, body["payload"]);
        assert_eq!(
            copy.headers.get("trace").map(String::as_str),
            body["headers"]["trace"].as_str()
        );
    }
}

fn found_in(entries: &[courier::StreamEntry]) -> Found {
    let mut found = Found::new();
    for entry in entries {
        let origin = entry
            .origin
            .clone()
            .expect("relayed entries carry their origin");
        found.entry(origin.message_id).or_default().push(Copy {
            tenant: origin.tenant,
            topic: origin.topic,
            schema_version: origin.schema_version,
            payload: entry.payload.clone(),
            headers: entry.headers.clone(),
        });
    }
    found
}

async fn redis_entries(
    prefix: &str,
    stream_of: impl Fn(&str) -> String,
) -> Vec<courier::StreamEntry> {
    let store = redis_store(&redis_url(), prefix).await;
    let mut entries = Vec::new();
    for tenant in TENANTS {
        for topic in TOPICS {
            entries.extend(read_all(&store, &key(tenant, &stream_of(topic))).await);
        }
    }
    entries
}

async fn every_message_reaches_the_redis_stream_once_with_its_origin(db: Db) {
    courier_server::metrics::prometheus();
    let prefix = format!("t_{}:", tag());
    let name = format!("to-redis-{}-{}", db.kind(), tag());
    let mut target = redis_target("relay.{topic}");
    if let courier_server::config::TargetConfig::RedisStream(redis) = &mut target {
        redis.maxlen = Some(1_000_000);
    }
    let mut config = db.config(vec![subscription(&name, &["order.*"], target)]);
    config.redis = redis_section(&redis_url(), &prefix);
    let daemon = Daemon::start(config).await.unwrap();

    let bodies = bodies();
    let ids = daemon.publish(bodies.clone()).await;
    db.wait_drained(&name, Duration::from_secs(30)).await;

    let entries = redis_entries(&prefix, |topic| format!("relay.{topic}")).await;
    assert_each_once(&ids, &bodies, &found_in(&entries));
    // Each entry went to its tenant's stream of its topic.
    let store = redis_store(&redis_url(), &prefix).await;
    for entry in read_all(&store, &key("acme", "relay.order.paid")).await {
        let origin = entry.origin.unwrap();
        assert_eq!(
            (origin.tenant.as_str(), origin.topic.as_str()),
            ("acme", "order.paid")
        );
    }
    let metrics = daemon.metrics().await;
    let stored = counter(
        &metrics,
        "courier_relay_published_total",
        &[("subscription", &name), ("outcome", "stored")],
    );
    assert_eq!(stored, 20, "{metrics}");
    assert!(
        metrics.contains("courier_relay_duration_seconds"),
        "{metrics}"
    );
    daemon.shutdown().await;
    delete_prefix(&redis_url(), &prefix).await;
}

async fn every_message_reaches_the_native_stream_once_with_its_origin(db: Db) {
    let name = format!("to-native-{}-{}", db.kind(), tag());
    let config = db.config(vec![subscription(
        &name,
        &["order.*"],
        native_target("relay.{topic}"),
    )]);
    let daemon = Daemon::start(config).await.unwrap();
    let bodies = bodies();
    let ids = daemon.publish(bodies.clone()).await;
    db.wait_drained(&name, Duration::from_secs(30)).await;

    // On PostgreSQL a committed append is readable once every older writing
    // transaction on the server has ended (other tests hold some): read
    // until every relayed message is there, or 30 s passed.
    let expected = bodies
        .iter()
        .filter(|body| body["topic"] != json!("invoice.paid"))
        .count();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let mut entries = Vec::new();
        for tenant in TENANTS {
            for topic in TOPICS {
                entries.extend(
                    db.native_entries(&key(tenant, &format!("relay.{topic}")))
                        .await,
                );
            }
        }
        if entries.len() >= expected || std::time::Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_each_once(&ids, &bodies, &found_in(&entries));
    daemon.shutdown().await;
}

async fn every_message_reaches_the_jetstream_once_with_its_origin(db: Db) {
    let tag = tag();
    let stream = format!("T_{tag}");
    let client = nats_client(&nats_url()).await;
    create_jetstream(
        &client,
        &stream,
        &format!("t_{tag}.>"),
        Duration::from_secs(3600),
    )
    .await;
    let name = format!("to-nats-{}-{tag}", db.kind());
    let mut config = db.config(vec![subscription(
        &name,
        &["order.*"],
        nats_target(&format!("t_{tag}.{{tenant}}.{{topic}}"), &stream),
    )]);
    config.nats = nats_section(&nats_url());
    let daemon = Daemon::start(config).await.unwrap();
    let bodies = bodies();
    let ids = daemon.publish(bodies.clone()).await;
    db.wait_drained(&name, Duration::from_secs(30)).await;

    let stored = jetstream_messages(&client, &stream).await;
    let mut found = Found::new();
    for message in &stored {
        let id: Uuid = message.headers["Courier-Message-Id"].parse().unwrap();
        let tenant = message.headers["Courier-Tenant"].clone();
        let topic = message.headers["Courier-Topic"].clone();
        assert_eq!(message.subject, format!("t_{tag}.{tenant}.{topic}"));
        assert_eq!(message.msg_id, format!("{}:{id}", message.subject));
        let schema_version = message.headers["Courier-Schema-Version"].parse().unwrap();
        let headers = message
            .headers
            .iter()
            .filter(|(k, _)| k.as_str() == "trace")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        found.entry(id).or_default().push(Copy {
            tenant,
            topic,
            schema_version,
            payload: message.payload.clone(),
            headers,
        });
    }
    assert_each_once(&ids, &bodies, &found);
    daemon.shutdown().await;
    delete_jetstream(&client, &stream).await;
}

/// Two subscriptions relaying the same messages to two subjects of one
/// JetStream stream each store every message once: JetStream remembers
/// `Nats-Msg-Id`s per stream, whatever the subject, so the id carries the
/// subject (a bare message id made the second publish a "duplicate" stored
/// nowhere).
async fn two_relays_into_one_jetstream_each_store_every_message(db: Db) {
    let tag = tag();
    let stream = format!("T_{tag}");
    let client = nats_client(&nats_url()).await;
    create_jetstream(
        &client,
        &stream,
        &format!("t_{tag}.>"),
        Duration::from_secs(3600),
    )
    .await;
    let names = ["billing", "audit"].map(|route| (route, format!("{route}-{}-{tag}", db.kind())));
    let mut config = db.config(
        names
            .iter()
            .map(|(route, name)| {
                subscription(
                    name,
                    &["order.*"],
                    nats_target(&format!("t_{tag}.{route}.{{tenant}}.{{topic}}"), &stream),
                )
            })
            .collect(),
    );
    config.nats = nats_section(&nats_url());
    let daemon = Daemon::start(config).await.unwrap();
    // The last of them is on a topic neither subscription takes.
    let mut ids = daemon.publish(bodies()).await;
    ids.pop();
    for (_, name) in &names {
        db.wait_drained(name, Duration::from_secs(30)).await;
    }

    let stored = jetstream_messages(&client, &stream).await;
    for (route, _) in &names {
        let on_route: Vec<_> = stored
            .iter()
            .filter(|message| message.subject.starts_with(&format!("t_{tag}.{route}.")))
            .cloned()
            .collect();
        let counts = count_by_message_id(&on_route);
        assert_eq!(counts.len(), ids.len(), "{route}: {counts:?}");
        for id in &ids {
            assert_eq!(counts.get(&id.to_string()), Some(&1), "{route}: {id}");
        }
    }
    daemon.shutdown().await;
    delete_jetstream(&client, &stream).await;
}

/// A native relay finds an entry of the same message already in the stream
/// (a replay) and appends nothing; it counts a duplicate.
async fn a_message_the_native_stream_already_holds_is_not_appended_again(db: Db) {
    courier_server::metrics::prometheus();
    let name = format!("replay-native-{}-{}", db.kind(), tag());
    let config = db.config(vec![subscription(
        &name,
        &["order.*"],
        native_target("replayed"),
    )]);
    let daemon = Daemon::start(config).await.unwrap();
    let message = NewMessage::new("acme", "order.placed", &json!({"n": 1})).unwrap();
    let stream = key("acme", "replayed");
    let earlier = NewStreamEntry {
        payload: json!({"n": 1}),
        headers: BTreeMap::new(),
        origin: Some(EntryOrigin {
            message_id: message.id,
            tenant: "acme".into(),
            topic: "order.placed".into(),
            schema_version: 1,
        }),
    };
    db.native_append(&stream, &[earlier]).await;
    let fresh = NewMessage::new("acme", "order.placed", &json!({"n": 2})).unwrap();
    match &db {
        Db::Postgres(f) => courier_testkit::Backend::courier(f)
            .publish(&[message.clone(), fresh.clone()])
            .await
            .unwrap(),
        Db::Sqlite(f) => courier_testkit::Backend::courier(f)
            .publish(&[message.clone(), fresh.clone()])
            .await
            .unwrap(),
    };
    db.wait_drained(&name, Duration::from_secs(30)).await;
    let counts = by_message_id(&db.native_entries(&stream).await);
    assert_eq!(counts.get(&message.id), Some(&1), "{counts:?}");
    assert_eq!(counts.get(&fresh.id), Some(&1), "{counts:?}");
    let metrics = daemon.metrics().await;
    let duplicate = counter(
        &metrics,
        "courier_relay_published_total",
        &[("subscription", &name), ("outcome", "duplicate")],
    );
    assert_eq!(duplicate, 1, "{metrics}");
    daemon.shutdown().await;
}

/// Where the dying worker's process finds the outbox database.
#[derive(Clone)]
enum Address {
    Postgres { schema: String },
    Sqlite { path: String },
}

fn address(db: &Db) -> Address {
    match db {
        Db::Postgres(f) => Address::Postgres {
            schema: f.schema.clone(),
        },
        Db::Sqlite(f) => Address::Sqlite {
            path: f.path.to_str().unwrap().to_owned(),
        },
    }
}

/// Runs `work` on a runtime of its own (its own pools and connections, as
/// another process would have) and then drops that runtime with every task
/// still in it: a `kill -9` of that process, as far as the database and the
/// downstream server can tell.
async fn in_a_process_that_dies<F, Fut>(work: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(work());
        runtime.shutdown_background();
    })
    .await
    .unwrap();
}

/// Relays through `relay`, then never returns: the delivery is written
/// downstream and never completed.
struct PublishThenHang<R> {
    relay: R,
    published: Arc<AtomicUsize>,
}

/// The publish step of a plain relay.
trait PublishStep: Send + Sync + 'static {
    fn publish(
        &self,
        message: &Message<RawPayload>,
    ) -> impl std::future::Future<Output = Result<Relayed, HandlerError>> + Send;
}

impl PublishStep for RedisRelay {
    async fn publish(&self, message: &Message<RawPayload>) -> Result<Relayed, HandlerError> {
        RedisRelay::publish(self, message).await
    }
}

impl PublishStep for NatsRelay {
    async fn publish(&self, message: &Message<RawPayload>) -> Result<Relayed, HandlerError> {
        NatsRelay::publish(self, message).await
    }
}

impl<R: PublishStep> Handler for PublishThenHang<R> {
    type Payload = RawPayload;

    async fn handle(&self, message: Message<RawPayload>) -> Result<(), HandlerError> {
        let relayed = self.relay.publish(&message).await?;
        assert!(matches!(relayed, Relayed::Stored(_)), "{relayed:?}");
        self.published.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        Ok(())
    }
}

/// The same for a native relay: the append is made in the delivery's
/// transaction, which then never commits.
struct AppendThenHang<S> {
    relay: NativeRelay<S>,
    published: Arc<AtomicUsize>,
}

impl<S: NativeStreamStore> TransactionalHandler<S::Connection> for AppendThenHang<S> {
    type Payload = RawPayload;

    async fn handle(
        &self,
        message: &Message<RawPayload>,
        conn: &mut S::Connection,
    ) -> Result<(), HandlerError> {
        let relayed = self.relay.publish(message, conn).await?;
        assert!(matches!(relayed, Relayed::Stored(_)), "{relayed:?}");
        self.published.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        Ok(())
    }
}

async fn open_pg(schema: &str) -> Courier<courier::postgres::PgStore> {
    let pool = courier::postgres::connect(&courier_testkit::database_url(), 4)
        .await
        .unwrap();
    Courier::postgres_with_schema(pool, schema).unwrap()
}

async fn open_sqlite(path: &str) -> Courier<courier::sqlite::SqliteStore> {
    Courier::sqlite(courier::sqlite::connect(path, 4).await.unwrap())
}

/// Starts a worker of `subscription` with `handler` and waits until
/// `published` reaches `count`.
async fn work_until<S: OutboxStore + courier::DeadLetterStore, H: Handler>(
    courier: &Courier<S>,
    subscription: &SubscriptionConfig,
    handler: H,
    published: &AtomicUsize,
    count: usize,
) -> courier::WorkerHandle {
    let worker = courier
        .worker(subscription.name.clone())
        .handle_all(subscription.topics.clone(), handler)
        .lease(Duration::from_secs(60))
        .handler_timeout(None)
        .concurrency(64)
        .maintenance(None)
        .build()
        .await
        .unwrap()
        .start();
    let reached = until(Duration::from_secs(30), || async {
        published.load(Ordering::SeqCst) >= count
    })
    .await;
    assert!(
        reached,
        "only {} of {count} published",
        published.load(Ordering::SeqCst)
    );
    worker
}

/// The redelivery half of a crash test: expire the dead worker's leases,
/// start the daemon, and wait until everything is completed.
async fn redeliver(db: &Db, config: courier_server::Config, name: &str, count: usize) -> Daemon {
    assert_eq!(
        db.running(name).await,
        count as i64,
        "the dead worker's claims are still leased"
    );
    assert!(db.expire_leases().await >= count as u64);
    let daemon = Daemon::start(config).await.unwrap();
    db.wait_drained(name, Duration::from_secs(60)).await;
    assert_eq!(db.open_and_dead(name).await, (0, 0));
    daemon
}

const CRASH_MESSAGES: usize = 10;

/// Publishes `CRASH_MESSAGES` messages to a subscription registered first
/// (by a daemon started and stopped for it, so they are owed to it).
async fn publish_for(db: &Db, config: &courier_server::Config) -> Vec<Uuid> {
    let registrar = Daemon::start(config.clone()).await.unwrap();
    // Pause so the registering daemon delivers none of them.
    let name = &config.subscriptions[0].name;
    let paused = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/subscriptions/{name}/pause",
            registrar.address
        ))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(paused.status().is_success(), "{:?}", paused.text().await);
    let bodies: Vec<Value> = (0..CRASH_MESSAGES)
        .map(|n| message(TENANTS[n % 2], "order.placed", n))
        .collect();
    let ids = registrar.publish(bodies).await;
    registrar.shutdown().await;
    resume(db, name).await;
    ids
}

async fn resume(db: &Db, name: &str) {
    use courier::AdminStore;
    let resumed = match db {
        Db::Postgres(f) => courier_testkit::Backend::courier(f)
            .store()
            .set_subscription_paused(name, false)
            .await
            .unwrap(),
        Db::Sqlite(f) => courier_testkit::Backend::courier(f)
            .store()
            .set_subscription_paused(name, false)
            .await
            .unwrap(),
    };
    assert!(resumed);
}

fn counted(metrics: &str, name: &str, outcome: &str) -> u64 {
    counter(
        metrics,
        "courier_relay_published_total",
        &[("subscription", name), ("outcome", outcome)],
    )
}

async fn a_redis_relay_killed_between_append_and_complete_appends_once(db: Db) {
    courier_server::metrics::prometheus();
    let prefix = format!("t_{}:", tag());
    let name = format!("crash-redis-{}-{}", db.kind(), tag());
    let sub = subscription(&name, &["order.*"], redis_target("crash"));
    let mut config = db.config(vec![sub.clone()]);
    config.redis = redis_section(&redis_url(), &prefix);
    let ids = publish_for(&db, &config).await;

    let (where_, dying_prefix, dying_sub) = (address(&db), prefix.clone(), sub.clone());
    in_a_process_that_dies(move || async move {
        let store = courier::redis::RedisStreamStore::connect(&redis_url(), &dying_prefix)
            .await
            .unwrap();
        let published = Arc::new(AtomicUsize::new(0));
        let handler = PublishThenHang {
            relay: RedisRelay::new(&dying_sub, store).unwrap(),
            published: Arc::clone(&published),
        };
        let _worker = match where_ {
            Address::Postgres { schema } => {
                work_until(
                    &open_pg(&schema).await,
                    &dying_sub,
                    handler,
                    &published,
                    CRASH_MESSAGES,
                )
                .await
            }
            Address::Sqlite { path } => {
                work_until(
                    &open_sqlite(&path).await,
                    &dying_sub,
                    handler,
                    &published,
                    CRASH_MESSAGES,
                )
                .await
            }
        };
    })
    .await;

    let store = redis_store(&redis_url(), &prefix).await;
    let downstream = || async {
        let mut entries = Vec::new();
        for tenant in TENANTS {
            entries.extend(read_all(&store, &key(tenant, "crash")).await);
        }
        by_message_id(&entries)
    };
    let before = downstream().await;
    assert_eq!(
        before.len(),
        CRASH_MESSAGES,
        "published before the crash: {before:?}"
    );

    let daemon = redeliver(&db, config, &name, CRASH_MESSAGES).await;
    let after = downstream().await;
    assert_eq!(after.len(), CRASH_MESSAGES);
    for id in &ids {
        assert_eq!(after.get(id), Some(&1), "{id}: {after:?}");
    }
    let metrics = daemon.metrics().await;
    assert_eq!(
        counted(&metrics, &name, "duplicate"),
        CRASH_MESSAGES as u64,
        "{metrics}"
    );
    daemon.shutdown().await;
    delete_prefix(&redis_url(), &prefix).await;
}

async fn a_nats_relay_killed_between_ack_and_complete_publishes_once(db: Db) {
    courier_server::metrics::prometheus();
    let tag = tag();
    let stream = format!("T_{tag}");
    let client = nats_client(&nats_url()).await;
    create_jetstream(
        &client,
        &stream,
        &format!("t_{tag}.>"),
        Duration::from_secs(3600),
    )
    .await;
    let name = format!("crash-nats-{}-{tag}", db.kind());
    let sub = subscription(
        &name,
        &["order.*"],
        nats_target(&format!("t_{tag}.{{tenant}}"), &stream),
    );
    let mut config = db.config(vec![sub.clone()]);
    config.nats = nats_section(&nats_url());
    let ids = publish_for(&db, &config).await;

    let (where_, dying_sub) = (address(&db), sub.clone());
    in_a_process_that_dies(move || async move {
        let nats = courier_server::relay::connect_nats(&nats_url())
            .await
            .unwrap();
        let published = Arc::new(AtomicUsize::new(0));
        let handler = PublishThenHang {
            relay: NatsRelay::start(&dying_sub, nats).await.unwrap(),
            published: Arc::clone(&published),
        };
        let _worker = match where_ {
            Address::Postgres { schema } => {
                work_until(
                    &open_pg(&schema).await,
                    &dying_sub,
                    handler,
                    &published,
                    CRASH_MESSAGES,
                )
                .await
            }
            Address::Sqlite { path } => {
                work_until(
                    &open_sqlite(&path).await,
                    &dying_sub,
                    handler,
                    &published,
                    CRASH_MESSAGES,
                )
                .await
            }
        };
    })
    .await;
    assert_eq!(
        count_by_message_id(&jetstream_messages(&client, &stream).await).len(),
        CRASH_MESSAGES
    );

    let daemon = redeliver(&db, config, &name, CRASH_MESSAGES).await;
    let counts = count_by_message_id(&jetstream_messages(&client, &stream).await);
    assert_eq!(counts.len(), CRASH_MESSAGES, "{counts:?}");
    for id in &ids {
        assert_eq!(counts.get(&id.to_string()), Some(&1), "{id}: {counts:?}");
    }
    let metrics = daemon.metrics().await;
    assert_eq!(
        counted(&metrics, &name, "duplicate"),
        CRASH_MESSAGES as u64,
        "{metrics}"
    );
    daemon.shutdown().await;
    delete_jetstream(&client, &stream).await;
}

/// The native relay appends in the delivery's transaction: a worker killed
/// after appending and before committing leaves no entry, and the
/// redelivery appends each message once.
async fn a_native_relay_killed_between_append_and_commit_appends_once(db: Db) {
    let name = format!("crash-native-{}-{}", db.kind(), tag());
    let sub = subscription(&name, &["order.*"], native_target("crash"));
    let config = db.config(vec![sub.clone()]);
    let ids = publish_for(&db, &config).await;

    let (where_, dying_sub) = (address(&db), sub.clone());
    in_a_process_that_dies(move || async move {
        let published = Arc::new(AtomicUsize::new(0));
        macro_rules! run {
            ($courier:expr) => {{
                let courier = $courier;
                let handler = AppendThenHang {
                    relay: NativeRelay::new(&dying_sub, courier.store().clone()).unwrap(),
                    published: Arc::clone(&published),
                };
                let worker = courier
                    .worker(dying_sub.name.clone())
                    .handle_all_transactional(dying_sub.topics.clone(), handler)
                    .lease(Duration::from_secs(60))
                    .handler_timeout(None)
                    .concurrency(1)
                    .transaction_batch_size(1)
                    .maintenance(None)
                    .build()
                    .await
                    .unwrap()
                    .start();
                let reached = until(Duration::from_secs(30), || async {
                    published.load(Ordering::SeqCst) >= 1
                })
                .await;
                assert!(reached, "the append never ran");
                worker
            }};
        }
        // The worker handles are dropped here, but the worker runs on (a
        // dropped handle does not stop it) until its runtime dies.
        match where_ {
            Address::Postgres { schema } => drop(run!(open_pg(&schema).await)),
            Address::Sqlite { path } => drop(run!(open_sqlite(&path).await)),
        }
    })
    .await;

    let stream = key("acme", "crash");
    let other = key("globex", "crash");
    // The dead transaction is rolled back once its connection is gone.
    let empty = until(Duration::from_secs(20), || async {
        db.native_entries(&stream).await.is_empty() && db.native_entries(&other).await.is_empty()
    })
    .await;
    assert!(empty, "an append outlived its transaction");
    assert_eq!(db.running(&name).await, 1);
    assert!(db.expire_leases().await >= 1);
    let daemon = Daemon::start(config).await.unwrap();
    db.wait_drained(&name, Duration::from_secs(60)).await;
    let mut entries = db.native_entries(&stream).await;
    entries.extend(db.native_entries(&other).await);
    let counts = by_message_id(&entries);
    assert_eq!(counts.len(), CRASH_MESSAGES, "{counts:?}");
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "{id}: {counts:?}");
    }
    daemon.shutdown().await;
}

macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Db::postgres().await).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Db::sqlite().await).await
                }
            )*
        }
    };
}

on_both_databases!(
    every_message_reaches_the_redis_stream_once_with_its_origin,
    every_message_reaches_the_native_stream_once_with_its_origin,
    every_message_reaches_the_jetstream_once_with_its_origin,
    two_relays_into_one_jetstream_each_store_every_message,
    a_message_the_native_stream_already_holds_is_not_appended_again,
    a_redis_relay_killed_between_append_and_complete_appends_once,
    a_nats_relay_killed_between_ack_and_complete_publishes_once,
    a_native_relay_killed_between_append_and_commit_appends_once,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_refuses_a_jetstream_that_forgets_message_ids_before_a_redelivery() {
    let db = Db::sqlite().await;
    let tag = tag();
    let stream = format!("T_{tag}");
    let client = nats_client(&nats_url()).await;
    create_jetstream(
        &client,
        &stream,
        &format!("t_{tag}.>"),
        Duration::from_secs(120),
    )
    .await;
    let name = format!("short-window-{tag}");
    let mut sub = subscription(
        &name,
        &["order.*"],
        nats_target(&format!("t_{tag}.x"), &stream),
    );
    sub.retry.cap_ms = 600_000;
    let mut config = db.config(vec![sub]);
    config.nats = nats_section(&nats_url());
    let error = Daemon::start(config.clone())
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains(&name), "{error}");
    assert!(error.contains(&stream), "{error}");
    assert!(error.contains("duplicate_window of 120s"), "{error}");
    // lease 30 s + retry cap 600 s + ten rescue intervals of 5 s
    assert!(error.contains("redelivery horizon is 680s"), "{error}");
    assert!(
        error.contains("retry cap") || error.contains("backoff cap"),
        "{error}"
    );

    // A missing stream is refused too, by name.
    delete_jetstream(&client, &stream).await;
    let error = Daemon::start(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains(&format!("JetStream stream {stream}")),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_refuses_to_start_when_redis_or_nats_is_unreachable() {
    let db = Db::sqlite().await;
    let port = free_port();
    let mut config = db.config(vec![subscription("r", &["a"], redis_target("{topic}"))]);
    config.redis = redis_section(&format!("redis://127.0.0.1:{port}"), "t:");
    let error = Daemon::start(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("subscription r") && error.contains("[redis] url"),
        "{error}"
    );
    let mut config = db.config(vec![subscription(
        "n",
        &["a"],
        nats_target("x.{topic}", "X"),
    )]);
    config.nats = nats_section(&format!("nats://127.0.0.1:{port}"));
    let error = Daemon::start(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("[nats] url"), "{error}");
}

/// A message a relay can never write — its stream name renders invalid, its
/// Redis key holds another type, it carries a header reserved by NATS — is
/// dead-lettered at its first attempt, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_relay_can_never_write_are_dead_lettered_at_once_with_the_reason() {
    let db = Db::sqlite().await;
    let tag = tag();
    let prefix = format!("t_{tag}:");
    let stream = format!("T_{tag}");
    let client = nats_client(&nats_url()).await;
    create_jetstream(
        &client,
        &stream,
        &format!("t_{tag}.>"),
        Duration::from_secs(3600),
    )
    .await;
    let store = redis_store(&redis_url(), &prefix).await;
    let taken = store.redis_key(&key("acme", "wrong.type"));
    let mut conn = store.connection();
    let _: () = courier::redis::redis::cmd("SET")
        .arg(&taken)
        .arg("a string")
        .query_async(&mut conn)
        .await
        .unwrap();

    let mut config = db.config(vec![
        subscription("bad-native", &["long.*"], native_target("relay.{topic}")),
        subscription("bad-redis", &["wrong.*"], redis_target("{topic}")),
        subscription(
            "bad-nats",
            &["header.*"],
            nats_target(&format!("t_{tag}.{{topic}}"), &stream),
        ),
    ]);
    config.redis = redis_section(&redis_url(), &prefix);
    config.nats = nats_section(&nats_url());
    let daemon = Daemon::start(config).await.unwrap();
    let long_topic = format!("long.{}", "x".repeat(123));
    let mut reserved = message("acme", "header.set", 1);
    reserved["headers"] = json!({"Nats-Rollup": "all"});
    daemon
        .publish(vec![
            message("acme", &long_topic, 0),
            message("acme", "wrong.type", 0),
            reserved,
        ])
        .await;

    for (name, reason) in [
        ("bad-native", "rendered from \"relay.{topic}\""),
        ("bad-redis", "holds a value that is not a stream"),
        ("bad-nats", "\"Nats-Rollup\" is reserved"),
    ] {
        let dead = until(Duration::from_secs(30), || async {
            db.open_and_dead(name).await == (0, 1)
        })
        .await;
        assert!(dead, "{name}: {:?}", db.open_and_dead(name).await);
        let letters = daemon.dead_letters(name).await;
        assert_eq!(letters.len(), 1, "{letters:?}");
        assert_eq!(
            letters[0]["attempts"],
            json!(1),
            "{name}: permanent at once"
        );
        let error = letters[0]["errors"][0]["message"].as_str().unwrap();
        assert!(error.contains(reason), "{name}: {error}");
    }
    assert_eq!(
        jetstream_count(&client, &stream).await,
        0,
        "nothing reached NATS"
    );
    daemon.shutdown().await;
    delete_jetstream(&client, &stream).await;
    delete_prefix(&redis_url(), &prefix).await;
}
