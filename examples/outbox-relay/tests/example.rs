//! The example run as a user runs it, its binary unchanged on every backend:
//! SQLite (a temp file) and PostgreSQL (a schema of the test's own) for the
//! orders and the outbox, the native `events` stream or a Redis stream
//! (keys under a prefix of the test's own), and NATS JetStream (a stream of
//! the test's own on its own subjects, deleted at the end).
//!
//! The binary checks its own counts and exits non-zero on a difference; the
//! tests do not take its word for it. Each reads the outbox (which events
//! were placed, which are poison by their payload, what was dead-lettered
//! and why) and every downstream itself, and counts the copies of each
//! event by message id.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use async_nats::jetstream;
use courier::postgres::PgStore;
use courier::redis::RedisStreamStore;
use courier::sqlite::SqliteStore;
use courier::{
    AdminStore, DeadLetterFilter, DeadLetterStore, MessageFilter, StreamEntryId, StreamKey,
    StreamStore,
};
use courier_testkit::PgFixture;
use futures_util::StreamExt;
use uuid::Uuid;

const BINARY: &str = env!("CARGO_BIN_EXE_outbox-relay");
const TOPIC: &str = "order.placed";
const STREAM_SUBSCRIPTION: &str = "relay-events";
const NATS_SUBSCRIPTION: &str = "relay-nats";

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A short random tag for names of the test's own.
fn tag() -> String {
    Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// Runs the binary with `args`, none of the caller's settings leaking in.
async fn run(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new(BINARY);
    command.args(args);
    for name in [
        "DATABASE_URL",
        "OUTBOX_RELAY_ENABLED",
        "OUTBOX_RELAY_BATCH_SIZE",
        "OUTBOX_RELAY_INTERVAL_MS",
        "OUTBOX_RELAY_REDIS_URL",
        "OUTBOX_RELAY_NATS_URL",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    Ok(command.output().await?)
}

/// Runs the binary and insists that it succeeded and said so.
async fn must(args: &[&str]) -> anyhow::Result<String> {
    let output = run(args, &[]).await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        stdout.contains("ok: every event reached each downstream exactly once"),
        "{stdout}"
    );
    Ok(stdout)
}

/// A SQLite file in a directory of the test's own.
struct SqliteFile {
    _dir: tempfile::TempDir,
    path: String,
}

impl SqliteFile {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir
            .path()
            .join("outbox-relay.db")
            .to_str()
            .context("path is not UTF-8")?
            .to_owned();
        Ok(Self { _dir: dir, path })
    }

    async fn store(&self) -> anyhow::Result<SqliteStore> {
        Ok(SqliteStore::new(
            courier::sqlite::connect(&self.path, 2).await?,
        ))
    }
}

/// What the outbox says about a run: the events placed (poison or not, by
/// their payload) and each subscription's dead letters with their errors.
#[derive(Debug)]
struct Outbox {
    good: BTreeSet<Uuid>,
    poison: BTreeSet<Uuid>,
    dead: BTreeMap<String, BTreeMap<Uuid, (i32, String)>>,
}

async fn outbox<S: AdminStore + DeadLetterStore>(store: &S) -> anyhow::Result<Outbox> {
    let filter = MessageFilter {
        topic: Some(TOPIC.into()),
        ..MessageFilter::default()
    };
    let (mut good, mut poison) = (BTreeSet::new(), BTreeSet::new());
    let mut before = None;
    loop {
        let page = store.list_messages(&filter, before, 1000).await?;
        for message in &page.items {
            let payload: serde_json::Value = serde_json::from_str(&message.payload)?;
            // The contract's amount is a whole number of cents; poison
            // events carry it as a decimal string.
            if payload["amount_cents"].is_u64() {
                good.insert(message.id);
            } else {
                poison.insert(message.id);
            }
        }
        match page.next_cursor {
            Some(cursor) => before = Some(cursor),
            None => break,
        }
    }
    let mut dead = BTreeMap::new();
    for subscription in [STREAM_SUBSCRIPTION, NATS_SUBSCRIPTION] {
        let filter = DeadLetterFilter {
            subscription: Some(subscription.into()),
            ..DeadLetterFilter::default()
        };
        let page = store.list_dead_letters(&filter, None, 1000).await?;
        let letters: BTreeMap<Uuid, (i32, String)> = page
            .items
            .into_iter()
            .map(|letter| {
                let error = letter
                    .errors
                    .last()
                    .map(|e| e.message.clone())
                    .unwrap_or_default();
                (letter.message_id, (letter.attempts, error))
            })
            .collect();
        dead.insert(subscription.to_owned(), letters);
    }
    Ok(Outbox { good, poison, dead })
}

/// Copies of each message id in the stream `acme/events` of `store`.
async fn stream_copies<S: StreamStore>(store: &S) -> anyhow::Result<BTreeMap<Uuid, usize>> {
    let key = StreamKey::new("acme", "events")?;
    let mut copies = BTreeMap::new();
    let mut after = StreamEntryId::ZERO;
    loop {
        let page = store.range(&key, after, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(copies);
        };
        after = last.id;
        for entry in &page {
            let origin = entry
                .origin
                .as_ref()
                .context("a relayed entry has an origin")?;
            *copies.entry(origin.message_id).or_insert(0) += 1;
        }
    }
}

/// The native stream's copies, waiting on PostgreSQL until `expected`
/// message ids are readable (entries are handed out below the oldest
/// running writer's snapshot, and other tests hold transactions open).
async fn native_copies<S: StreamStore>(
    store: &S,
    expected: usize,
) -> anyhow::Result<BTreeMap<Uuid, usize>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let copies = stream_copies(store).await?;
        if copies.len() >= expected || Instant::now() > deadline {
            return Ok(copies);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies of each `Courier-Message-Id` in the JetStream stream `name`,
/// read by a consumer of the test's own.
async fn jetstream_copies(
    client: &async_nats::Client,
    name: &str,
) -> anyhow::Result<BTreeMap<Uuid, usize>> {
    let context = jetstream::new(client.clone());
    let stream = context.get_stream(name).await?;
    let mut consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let total = consumer.info().await?.num_pending;
    let mut copies = BTreeMap::new();
    let mut read = 0_u64;
    while read < total {
        let mut batch = consumer
            .fetch()
            .max_messages(500)
            .expires(Duration::from_secs(1))
            .messages()
            .await?;
        let before = read;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            read += 1;
            let headers = message.headers.as_ref().context("relayed with headers")?;
            let id: Uuid = headers
                .get("Courier-Message-Id")
                .context("relayed with its message id")?
                .as_str()
                .parse()?;
            let msg_id = headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned());
            ensure!(
                msg_id == Some(format!("{}:{id}", message.subject)),
                "Nats-Msg-Id is {msg_id:?}"
            );
            *copies.entry(id).or_insert(0) += 1;
        }
        ensure!(read > before, "the consumer stopped at {read} of {total}");
    }
    Ok(copies)
}

/// Checks that `copies` holds every good event once and nothing else.
/// (Errors, not panics: a test cleans up its Redis keys and JetStream
/// stream after its checks, whatever they found.)
fn check_each_good_event_once(
    downstream: &str,
    outbox: &Outbox,
    copies: &BTreeMap<Uuid, usize>,
) -> anyhow::Result<()> {
    let held: BTreeSet<Uuid> = copies.keys().copied().collect();
    ensure!(
        held.len() == outbox.good.len(),
        "{downstream} holds {} events, {} good ones were placed",
        held.len(),
        outbox.good.len()
    );
    ensure!(held == outbox.good, "{downstream} holds other events");
    let doubled: Vec<_> = copies.iter().filter(|(_, n)| **n != 1).collect();
    ensure!(doubled.is_empty(), "{downstream} holds twice: {doubled:?}");
    Ok(())
}

/// Checks that `subscription` dead-lettered exactly the poison events, at
/// their first attempt, with the contract's reason.
fn check_poison_dead_lettered(subscription: &str, outbox: &Outbox) -> anyhow::Result<()> {
    let dead = outbox
        .dead
        .get(subscription)
        .context("dead letters listed")?;
    let ids: BTreeSet<Uuid> = dead.keys().copied().collect();
    ensure!(
        ids == outbox.poison,
        "{subscription} dead-lettered {ids:?}, the poison events are {:?}",
        outbox.poison
    );
    for (id, (attempts, error)) in dead {
        ensure!(*attempts == 1, "{id} was tried {attempts} times");
        ensure!(
            error.contains("breaks the order.placed v1 contract"),
            "{id}: {error}"
        );
    }
    Ok(())
}

async fn orders_on_sqlite(store: &SqliteStore) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await?)
}

async fn orders_on_postgres(pg: &PgFixture) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pg.pool)
        .await?)
}

/// A JetStream stream name and subject prefix of the test's own, deleted
/// when the test ends.
struct JetStreamOfOurOwn {
    client: async_nats::Client,
    stream: String,
    subject_prefix: String,
}

impl JetStreamOfOurOwn {
    async fn new() -> anyhow::Result<Self> {
        let tag = tag();
        Ok(Self {
            client: async_nats::connect(nats_url()).await?,
            stream: format!("OUTBOX_RELAY_{tag}"),
            subject_prefix: format!("outbox_relay_{tag}"),
        })
    }

    async fn exists(&self) -> bool {
        jetstream::new(self.client.clone())
            .get_stream(&self.stream)
            .await
            .is_ok()
    }

    async fn delete(&self) {
        let _ = jetstream::new(self.client.clone())
            .delete_stream(&self.stream)
            .await;
    }
}

/// Keys under `prefix` on the test Redis.
async fn redis_keys(prefix: &str) -> anyhow::Result<Vec<String>> {
    use courier::redis::redis::AsyncCommands;
    let client = courier::redis::redis::Client::open(courier_testkit::redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut keys = Vec::new();
    let mut iter: courier::redis::redis::AsyncIter<'_, String> =
        conn.scan_match(format!("{prefix}*")).await?;
    while let Some(key) = iter.next_item().await {
        keys.push(key?);
    }
    Ok(keys)
}

async fn delete_redis_prefix(prefix: &str) -> anyhow::Result<()> {
    use courier::redis::redis::AsyncCommands;
    let keys = redis_keys(prefix).await?;
    let client = courier::redis::redis::Client::open(courier_testkit::redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for chunk in keys.chunks(500) {
        let _: () = conn.del(chunk).await?;
    }
    Ok(())
}

#[tokio::test]
async fn every_event_reaches_the_native_stream_once_on_sqlite() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    let out = must(&[
        "--database-url",
        &db.path,
        "--count",
        "300",
        "--poison",
        "3",
    ])
    .await?;
    assert!(
        out.contains("native stream acme/events: 297 entries for 297 events"),
        "{out}"
    );

    let store = db.store().await?;
    assert_eq!(orders_on_sqlite(&store).await?, 300);
    let outbox = outbox(&store).await?;
    assert_eq!((outbox.good.len(), outbox.poison.len()), (297, 3));
    check_each_good_event_once("native stream", &outbox, &stream_copies(&store).await?)?;
    check_poison_dead_lettered(STREAM_SUBSCRIPTION, &outbox)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_native_stream_and_jetstream_once_on_postgres() -> anyhow::Result<()>
{
    let pg = PgFixture::new().await?;
    let nats = JetStreamOfOurOwn::new().await?;
    let url = courier_testkit::database_url();
    let result = async {
        let out = must(&[
            "--database-url",
            &url,
            "--schema",
            &pg.schema,
            "--nats-url",
            &nats_url(),
            "--nats-stream",
            &nats.stream,
            "--nats-subject-prefix",
            &nats.subject_prefix,
            "--count",
            "300",
            "--poison",
            "2",
        ])
        .await?;
        ensure!(out.contains("298 entries for 298 events"), "{out}");

        let store: PgStore = courier_testkit::Backend::courier(&pg).store().clone();
        ensure!(orders_on_postgres(&pg).await? == 300, "orders");
        let outbox = outbox(&store).await?;
        ensure!(
            (outbox.good.len(), outbox.poison.len()) == (298, 2),
            "{outbox:?}"
        );
        let native = native_copies(&store, outbox.good.len()).await?;
        check_each_good_event_once("native stream", &outbox, &native)?;
        let jetstream = jetstream_copies(&nats.client, &nats.stream).await?;
        check_each_good_event_once("JetStream", &outbox, &jetstream)?;
        check_poison_dead_lettered(STREAM_SUBSCRIPTION, &outbox)?;
        check_poison_dead_lettered(NATS_SUBSCRIPTION, &outbox)?;
        anyhow::Ok(())
    }
    .await;
    nats.delete().await;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_the_redis_stream_and_jetstream_once() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    let nats = JetStreamOfOurOwn::new().await?;
    let prefix = format!("outbox-relay-test:{}:", tag());
    let result = async {
        must(&[
            "--database-url",
            &db.path,
            "--redis-url",
            &courier_testkit::redis_url(),
            "--key-prefix",
            &prefix,
            "--nats-url",
            &nats_url(),
            "--nats-stream",
            &nats.stream,
            "--nats-subject-prefix",
            &nats.subject_prefix,
            "--count",
            "300",
            "--poison",
            "3",
            "--batch-size",
            "50",
        ])
        .await?;

        let store = db.store().await?;
        ensure!(orders_on_sqlite(&store).await? == 300, "orders");
        let outbox = outbox(&store).await?;
        ensure!(
            (outbox.good.len(), outbox.poison.len()) == (297, 3),
            "{outbox:?}"
        );
        let redis = RedisStreamStore::connect(&courier_testkit::redis_url(), &prefix).await?;
        check_each_good_event_once("Redis stream", &outbox, &stream_copies(&redis).await?)?;
        ensure!(
            stream_copies(&store).await?.is_empty(),
            "with Redis, nothing goes to the native stream"
        );
        let jetstream = jetstream_copies(&nats.client, &nats.stream).await?;
        check_each_good_event_once("JetStream", &outbox, &jetstream)?;
        check_poison_dead_lettered(STREAM_SUBSCRIPTION, &outbox)?;
        check_poison_dead_lettered(NATS_SUBSCRIPTION, &outbox)?;
        anyhow::Ok(())
    }
    .await;
    nats.delete().await;
    delete_redis_prefix(&prefix).await?;
    result
}

/// Every event is in the relays' first claim (they start after the orders
/// are placed, and claim up to `--batch-size` = `--count`), so each poison
/// event shares its batch with every good one. The native relay runs a
/// claim's deliveries in transactions of up to 64: a poison event fails
/// alone, its group-mates still commit, each once.
#[tokio::test]
async fn poison_events_are_dead_lettered_and_their_batch_mates_delivered() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    let out = must(&[
        "--database-url",
        &db.path,
        "--count",
        "120",
        "--poison",
        "5",
        "--batch-size",
        "120",
    ])
    .await?;
    assert!(out.contains("5 dead-lettered by relay-events"), "{out}");

    let store = db.store().await?;
    let outbox = outbox(&store).await?;
    assert_eq!((outbox.good.len(), outbox.poison.len()), (115, 5));
    check_each_good_event_once("native stream", &outbox, &stream_copies(&store).await?)?;
    check_poison_dead_lettered(STREAM_SUBSCRIPTION, &outbox)?;
    Ok(())
}

/// The interval is ten minutes and the backlog 40 claims of 10: a relay
/// that slept the interval after a claim would still be at its first
/// batches when the binary stops waiting (60 s) and reports a mismatch.
#[tokio::test]
async fn a_backlog_is_relayed_without_waiting_for_the_interval() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    must(&[
        "--database-url",
        &db.path,
        "--count",
        "400",
        "--poison",
        "1",
        "--batch-size",
        "10",
        "--interval-ms",
        "600000",
        "--timeout-seconds",
        "60",
    ])
    .await?;
    let store = db.store().await?;
    let outbox = outbox(&store).await?;
    assert_eq!(outbox.good.len(), 399);
    check_each_good_event_once("native stream", &outbox, &stream_copies(&store).await?)?;
    Ok(())
}

/// `enabled = false` (here from its environment variable) exits 0 having
/// created no database, written no Redis key and made no JetStream stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_relay_stores_and_relays_nothing() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    let nats = JetStreamOfOurOwn::new().await?;
    let prefix = format!("outbox-relay-test:{}:", tag());
    let output = run(
        &[
            "--database-url",
            &db.path,
            "--redis-url",
            &courier_testkit::redis_url(),
            "--key-prefix",
            &prefix,
            "--nats-url",
            &nats_url(),
            "--nats-stream",
            &nats.stream,
            "--nats-subject-prefix",
            &nats.subject_prefix,
            "--count",
            "50",
        ],
        &[("OUTBOX_RELAY_ENABLED", "false")],
    )
    .await?;
    let keys = redis_keys(&prefix).await?;
    let created = nats.exists().await;
    nats.delete().await;
    delete_redis_prefix(&prefix).await?;

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("relay disabled"), "{stderr}");
    assert!(
        !std::path::Path::new(&db.path).exists(),
        "the database was created"
    );
    assert_eq!(keys, Vec::<String>::new(), "Redis keys were written");
    assert!(!created, "the JetStream stream was created");
    Ok(())
}

/// The binary's own check can fail: given no time to wait, it finds events
/// missing downstream and exits non-zero, naming the difference.
#[tokio::test]
async fn the_binary_exits_non_zero_when_downstream_counts_differ() -> anyhow::Result<()> {
    let db = SqliteFile::new()?;
    let output = run(
        &[
            "--database-url",
            &db.path,
            "--count",
            "500",
            "--batch-size",
            "1",
            "--timeout-seconds",
            "0",
        ],
        &[],
    )
    .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("mismatch: native stream acme/events:"),
        "{stdout}"
    );
    assert!(!stdout.contains("ok: every event"), "{stdout}");
    Ok(())
}
