//! Stream subscriptions (`courier::StreamSubscription`) on every stream
//! backend: PostgreSQL and SQLite with their receipts in the same database,
//! Redis with its receipts in SQLite: every entry takes effect once, receipts skip repeated effects,
//! poison entries are dead-lettered after exactly `max_deliveries`, deferrals
//! never count and pause the subscription, crashed consumers' entries are
//! claimed once idle, and a restarted consumer re-reads its own pending
//! entries first. Each case runs once per backend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::postgres::PgStore;
use courier::redis::RedisStreamStore;
use courier::sqlite::SqliteStore;
use courier::{
    stream_handler_fn, ClaimIdle, GroupStart, HandlerError, NewStreamEntry, ReadNew, StreamEntryId,
    StreamKey, StreamMessage, StreamReceipts, StreamStore, StreamSubscription,
    StreamSubscriptionConfig, TransactionalStreamHandler,
};
use courier_testkit::{
    Backend, EffectConnection, PgFixture, RedisStreamFixture, SqliteFixture, StreamFixture,
};
use serde_json::json;

/// Where a case's streams and receipts live.
trait Harness: Send + Sync + 'static {
    /// The stream backend.
    type Streams: StreamStore;
    /// The database the receipts (and transactional effects) are in.
    type Receipts: StreamReceipts<Connection: EffectConnection>;

    fn streams(&self) -> Self::Streams;

    fn receipts(&self) -> Self::Receipts;

    /// Makes every pending entry of `group` on `key` idle for at least `by`.
    fn age_pending(
        &self,
        key: &StreamKey,
        group: &str,
        by: Duration,
    ) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;

    /// Creates the `effects` table in the receipts' database.
    fn create_effects_table(&self) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;

    /// One integer from the receipts' database.
    fn scalar(&self, sql: &str) -> impl std::future::Future<Output = anyhow::Result<i64>> + Send;
}

impl Harness for PgFixture {
    type Streams = PgStore;
    type Receipts = PgStore;

    fn streams(&self) -> PgStore {
        self.courier().store().clone()
    }

    fn receipts(&self) -> PgStore {
        self.courier().store().clone()
    }

    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        sqlx::query(
            "UPDATE stream_pending SET delivered_at = delivered_at - $4::bigint * interval '1 millisecond'
             WHERE tenant = $1 AND stream = $2 AND grp = $3",
        )
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .bind(i64::try_from(by.as_millis())?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn create_effects_table(&self) -> anyhow::Result<()> {
        Backend::create_effects_table(self).await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Backend::scalar(self, sql).await
    }
}

impl Harness for SqliteFixture {
    type Streams = SqliteStore;
    type Receipts = SqliteStore;

    fn streams(&self) -> SqliteStore {
        self.courier().store().clone()
    }

    fn receipts(&self) -> SqliteStore {
        self.courier().store().clone()
    }

    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        sqlx::query(
            "UPDATE stream_pending SET delivered_at = delivered_at - ?4
             WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3",
        )
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .bind(i64::try_from(by.as_millis())?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn create_effects_table(&self) -> anyhow::Result<()> {
        Backend::create_effects_table(self).await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Backend::scalar(self, sql).await
    }
}

/// Streams on Redis (a fresh key prefix), receipts in SQLite (a fresh file).
struct RedisHarness {
    redis: RedisStreamFixture,
    db: SqliteFixture,
}

impl RedisHarness {
    async fn new() -> anyhow::Result<Self> {
        Ok(Self {
            redis: RedisStreamFixture::fresh().await?,
            db: SqliteFixture::new().await?,
        })
    }
}

impl Harness for RedisHarness {
    type Streams = RedisStreamStore;
    type Receipts = SqliteStore;

    fn streams(&self) -> RedisStreamStore {
        self.redis.store().clone()
    }

    fn receipts(&self) -> SqliteStore {
        self.db.courier().store().clone()
    }

    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        self.redis.age_pending(key, group, by).await
    }

    async fn create_effects_table(&self) -> anyhow::Result<()> {
        Backend::create_effects_table(&self.db).await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Backend::scalar(&self.db, sql).await
    }
}

fn key() -> anyhow::Result<StreamKey> {
    Ok(StreamKey::new("acme", "events")?)
}

async fn append_numbered<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    range: std::ops::Range<u64>,
) -> anyhow::Result<Vec<StreamEntryId>> {
    let entries: Vec<_> = range
        .map(|n| NewStreamEntry::new(json!({ "n": n })))
        .collect();
    Ok(store.append(key, &entries).await?)
}

fn config(name: &str, key: &StreamKey) -> anyhow::Result<StreamSubscriptionConfig> {
    let mut config = StreamSubscriptionConfig::new(name, key.clone())?;
    config.consumer = format!("{name}-test");
    config.start = GroupStart::Beginning;
    config.min_idle = Duration::from_secs(60);
    Ok(config)
}

/// Handler calls per payload number.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<BTreeMap<u64, u64>>>);

impl Calls {
    fn record(&self, n: u64) -> u64 {
        let mut calls = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = calls.entry(n).or_default();
        *count += 1;
        *count
    }

    fn snapshot(&self) -> BTreeMap<u64, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A handler that records each call and succeeds.
    fn recording(&self) -> impl courier::StreamHandler<Payload = serde_json::Value> {
        let calls = self.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                calls.record(number(&message));
                Ok::<(), HandlerError>(())
            }
        })
    }

    fn of(&self, n: u64) -> u64 {
        self.snapshot().get(&n).copied().unwrap_or(0)
    }
}

/// A handler over a spent quota: counts its calls in `calls` and defers
/// every entry, asking for `delay`.
fn always_snoozing(
    calls: &Arc<AtomicU64>,
    delay: Duration,
) -> impl courier::StreamHandler<Payload = serde_json::Value> {
    let calls = calls.clone();
    stream_handler_fn(move |_message: StreamMessage<serde_json::Value>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(HandlerError::snooze(delay, "quota"))
        }
    })
}

fn number(message: &StreamMessage<serde_json::Value>) -> u64 {
    message.payload["n"].as_u64().unwrap_or(u64::MAX)
}

/// Steps the subscription until `done` holds or 30 s pass; between steps,
/// ages the group's pending entries when `age` (so failed ones are claimed).
async fn step_until<B: Harness>(
    backend: &B,
    subscription: &StreamSubscription<B::Streams, B::Receipts>,
    age: bool,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not done within 30 s"
        );
        subscription.step().await?;
        if age {
            let c = subscription.config();
            backend
                .age_pending(&c.key, &c.name, Duration::from_secs(120))
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn every_entry_takes_effect_once_and_is_acked<B: Harness>(backend: B) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = calls.recording();
    let subscription = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    let ids = append_numbered(&store, &key, 0..250).await?;
    step_until(&backend, &subscription, false, || {
        calls.snapshot().len() == 250
    })
    .await?;
    assert!(
        calls.snapshot().values().all(|&n| n == 1),
        "each entry handled once"
    );
    assert_eq!(
        store.pending_summary(&key, "billing").await?.count,
        0,
        "all acked"
    );
    let correlation: Vec<String> = ids
        .iter()
        .map(|id| format!("billing:events:{id}"))
        .collect();
    assert_eq!(
        receipts
            .find_stream_receipts("billing", &correlation)
            .await?
            .len(),
        250
    );
    Ok(())
}

async fn two_subscriptions_on_a_stream_each_get_every_entry<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut subscriptions = Vec::new();
    let mut counters = Vec::new();
    for name in ["workflow-a", "workflow-b"] {
        let calls = Calls::default();
        counters.push(calls.clone());
        let handler = calls.recording();
        let subscription = StreamSubscription::new(
            store.clone(),
            receipts.clone(),
            config(name, &key)?,
            handler,
        )?;
        subscription.ensure_group().await?;
        subscriptions.push(subscription);
    }
    append_numbered(&store, &key, 0..40).await?;
    for (subscription, calls) in subscriptions.iter().zip(&counters) {
        step_until(&backend, subscription, false, || {
            calls.snapshot().len() == 40
        })
        .await?;
        assert!(calls.snapshot().values().all(|&n| n == 1));
    }
    Ok(())
}

async fn a_found_receipt_skips_the_effect_and_acks<B: Harness>(backend: B) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = calls.recording();
    let config = config("billing", &key)?;
    let subscription =
        StreamSubscription::new(store.clone(), receipts.clone(), config.clone(), handler)?;
    subscription.ensure_group().await?;
    let ids = append_numbered(&store, &key, 0..3).await?;
    // Entry 1's effect was made before a crash that came before its ack.
    receipts
        .record_stream_receipts("billing", &[config.correlation_id(ids[1])])
        .await?;
    step_until(&backend, &subscription, false, || {
        calls.snapshot().len() == 2
    })
    .await?;
    assert_eq!(calls.of(1), 0, "the receipt skipped the effect");
    assert_eq!(
        store.pending_summary(&key, "billing").await?.count,
        0,
        "and the entry was acked"
    );
    Ok(())
}

async fn a_poison_entry_is_dead_lettered_after_exactly_max_deliveries<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                let n = number(&message);
                let call = calls.record(n);
                if n == 1 {
                    return Err(HandlerError::retry(format!("poison, call {call}")));
                }
                Ok(())
            }
        })
    };
    let mut config = config("billing", &key)?;
    config.max_deliveries = 3;
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    let ids = append_numbered(&store, &key, 0..3).await?;
    let dead = key.dead_letters()?;
    step_until(&backend, &subscription, true, || {
        calls.of(1) >= 3 && calls.snapshot().len() == 3
    })
    .await?;
    // A few more rounds: nothing may run it a fourth time.
    for _ in 0..3 {
        subscription.step().await?;
        backend
            .age_pending(&key, "billing", Duration::from_secs(120))
            .await?;
    }
    assert_eq!(
        calls.of(1),
        3,
        "the poison entry ran exactly max_deliveries times"
    );
    assert_eq!(calls.of(0), 1);
    assert_eq!(calls.of(2), 1);
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    let letters = courier_testkit::readable_entries(&store, &dead, 1).await?;
    assert_eq!(letters.len(), 1, "one dead letter");
    assert_eq!(
        letters[0].headers.get("courier-original-id"),
        Some(&ids[1].to_string())
    );
    let errors: Vec<String> = serde_json::from_str(
        letters[0]
            .headers
            .get("courier-errors")
            .map(String::as_str)
            .unwrap_or("[]"),
    )?;
    assert_eq!(errors.len(), 3, "every error kept: {errors:?}");
    assert_eq!(letters[0].payload, json!({"n": 1}));
    Ok(())
}

async fn a_permanent_failure_is_dead_lettered_at_once<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                calls.record(number(&message));
                Err::<(), _>(HandlerError::permanent("not a valid order"))
            }
        })
    };
    let subscription = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    step_until(&backend, &subscription, true, || calls.of(0) == 1).await?;
    subscription.step().await?;
    assert_eq!(calls.of(0), 1);
    assert_eq!(
        courier_testkit::readable_entries(&store, &key.dead_letters()?, 1)
            .await?
            .len(),
        1
    );
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

async fn deferrals_never_count_toward_max_deliveries<B: Harness>(backend: B) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                if calls.record(number(&message)) <= 5 {
                    return Err(HandlerError::snooze(
                        Duration::from_millis(1),
                        "run quota exhausted",
                    ));
                }
                Ok(())
            }
        })
    };
    let mut config = config("billing", &key)?;
    config.max_deliveries = 2;
    config.defer_min = Duration::from_millis(1);
    config.defer_max = Duration::from_millis(2);
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    step_until(&backend, &subscription, true, || calls.of(0) == 6).await?;
    subscription.step().await?;
    assert_eq!(calls.of(0), 6, "five deferrals, then the success");
    assert!(store
        .range(&key.dead_letters()?, StreamEntryId::ZERO, 10)
        .await?
        .is_empty());
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

/// Deferrals are not counted in the backend either: an entry deferred three
/// times by one consumer and then claimed by another (or by the same
/// consumer after a restart) is run at its first counted delivery, not
/// dead-lettered past `max_deliveries` without ever running.
async fn deferrals_do_not_count_after_a_claim_or_a_restart<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut config = config("billing", &key)?;
    config.max_deliveries = 2;
    config.defer_min = Duration::from_millis(1);
    config.defer_max = Duration::from_millis(2);
    let deferred = Arc::new(AtomicU64::new(0));
    let first = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config.clone(),
        always_snoozing(&deferred, Duration::from_millis(1)),
    )?;
    first.ensure_group().await?;
    append_numbered(&store, &key, 0..2).await?;
    step_until(&backend, &first, false, || {
        deferred.load(Ordering::SeqCst) >= 6
    })
    .await?;
    drop(first);

    // Entry 0 goes to another consumer of the subscription, by a claim;
    // entry 1 to this consumer restarted, by its own-pending re-read.
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let recording = |seen: &Arc<Mutex<BTreeMap<u64, u64>>>| {
        let seen = seen.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(number(&message), message.deliveries);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let claim = ClaimIdle {
        group: config.name.clone(),
        consumer: "billing-other".to_owned(),
        min_idle: Duration::from_secs(60),
        cursor: StreamEntryId::ZERO,
        count: 1,
    };
    backend
        .age_pending(&key, &config.name, Duration::from_secs(120))
        .await?;
    let claimed = store.claim_idle(&key, &claim).await?;
    assert_eq!(claimed.entries.len(), 1);
    assert_eq!(claimed.entries[0].entry.payload["n"], 0);
    assert_eq!(
        claimed.entries[0].deliveries, 1,
        "the first consumer's deferrals counted as deliveries"
    );
    let seen_len = |seen: &Arc<Mutex<BTreeMap<u64, u64>>>| {
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    };
    // The restarted consumer re-reads entry 1 (entry 0, just claimed, is
    // not idle enough for its claims).
    let restarted = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config.clone(),
        recording(&seen),
    )?;
    step_until(&backend, &restarted, false, || seen_len(&seen) == 1).await?;
    let mut other = config.clone();
    other.consumer = "billing-other".to_owned();
    let claiming =
        StreamSubscription::new(store.clone(), receipts.clone(), other, recording(&seen))?;
    step_until(&backend, &claiming, false, || seen_len(&seen) == 2).await?;
    assert_eq!(
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        BTreeMap::from([(0, 2), (1, 1)]),
        "each ran at its first counted delivery (entry 0's claim above was one)"
    );
    assert!(store
        .range(&key.dead_letters()?, StreamEntryId::ZERO, 10)
        .await?
        .is_empty());
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

async fn a_deferring_subscription_stops_reading_and_claiming_for_its_backoff<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Arc::new(AtomicU64::new(0));
    let handler = always_snoozing(&calls, Duration::from_millis(1));
    let mut config = config("billing", &key)?;
    config.min_idle = Duration::ZERO;
    config.claim_interval = Duration::from_millis(20);
    config.block = Duration::from_millis(20);
    // A pause of 2 to 4 s (the jitter halves at most): over a second of
    // margin beside the 0.9 s looked at, for a slow machine's shutdown.
    config.defer_min = Duration::from_secs(4);
    config.defer_max = Duration::from_secs(8);
    config.batch = 1;
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..5).await?;
    let running = subscription.start();
    // Without the pause, claims every 20 ms of entries idle 0 ms would call
    // the handler dozens of times in this second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while calls.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    running.shutdown().await;
    let calls = calls.load(Ordering::SeqCst);
    assert_eq!(
        calls, 1,
        "one deferral pauses reads and claims for at least 2 s"
    );
    Ok(())
}

async fn a_deferred_entry_is_taken_up_again_after_the_pause_not_after_min_idle<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                if calls.record(number(&message)) <= 2 {
                    return Err(HandlerError::snooze(Duration::from_millis(1), "quota"));
                }
                Ok(())
            }
        })
    };
    let mut config = config("billing", &key)?;
    config.min_idle = Duration::from_secs(600);
    config.claim_interval = Duration::from_secs(600);
    config.block = Duration::from_millis(50);
    config.defer_min = Duration::from_millis(50);
    config.defer_max = Duration::from_millis(100);
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    let running = subscription.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.pending_summary(&key, "billing").await?.count > 0 || calls.of(0) < 3 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the deferred entry waited for min_idle (calls: {})",
            calls.of(0)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.shutdown().await;
    assert_eq!(calls.of(0), 3, "two deferrals, then the run");
    Ok(())
}

async fn a_crashed_consumer_s_entries_are_claimed_once_idle<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = calls.recording();
    let subscription = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..10).await?;
    // Another process's consumer read them all and died before acking.
    let read = ReadNew {
        group: "billing".into(),
        consumer: "crashed".into(),
        count: 10,
        block: None,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut taken = 0;
    while taken < 10 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "entries not readable"
        );
        taken += store.read_new(&key, &read).await?.len();
    }
    subscription.step().await?;
    assert!(
        calls.snapshot().is_empty(),
        "not idle long enough yet: not claimed"
    );
    backend
        .age_pending(&key, "billing", Duration::from_secs(120))
        .await?;
    subscription.step().await?;
    assert_eq!(calls.snapshot().len(), 10, "all ten claimed and handled");
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

async fn a_restarted_consumer_handles_its_own_pending_entries_first<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let config = config("billing", &key)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((number(&message), message.deliveries));
                Ok::<(), HandlerError>(())
            }
        })
    };
    let subscription =
        StreamSubscription::new(store.clone(), receipts.clone(), config.clone(), handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..3).await?;
    // The previous run of this consumer read them; its reply was lost.
    take_as_own_pending(&store, &config, 3).await?;
    append_numbered(&store, &key, 3..4).await?;
    step_until(&backend, &subscription, false, || {
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
            == 4
    })
    .await?;
    let seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(
        seen[..3],
        [(0, 2), (1, 2), (2, 2)],
        "own pending first, delivered a second time"
    );
    assert_eq!(seen[3], (3, 1));
    Ok(())
}

async fn a_panicking_handler_leaves_its_entry_pending<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                if calls.record(number(&message)) == 1 {
                    panic!("handler bug");
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let subscription = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    step_until(&backend, &subscription, false, || calls.of(0) == 1).await?;
    assert_eq!(
        store.pending_summary(&key, "billing").await?.count,
        1,
        "the panic left it pending"
    );
    backend
        .age_pending(&key, "billing", Duration::from_secs(120))
        .await?;
    subscription.step().await?;
    assert_eq!(calls.of(0), 2);
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

/// A handler's panic inside its transaction is a failed delivery like a
/// plain handler's: its writes roll back, the entry stays pending and is
/// delivered again, and the subscription goes on (the panic once unwound
/// through the subscription and ended it).
async fn a_panicking_transactional_handler_leaves_its_entry_pending<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let handler = PanicAfterWriting::default();
    let calls = handler.calls.clone();
    let subscription = StreamSubscription::transactional(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    step_until(&backend, &subscription, false, || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await?;
    assert_eq!(
        store.pending_summary(&key, "billing").await?.count,
        1,
        "the panic left it pending"
    );
    assert_eq!(
        backend.scalar("SELECT count(*) FROM effects").await?,
        0,
        "the panicking delivery's write rolled back"
    );
    backend
        .age_pending(&key, "billing", Duration::from_secs(120))
        .await?;
    subscription.step().await?;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    assert_eq!(backend.scalar("SELECT sum(calls) FROM effects").await?, 1);
    Ok(())
}

/// Writes its effect, then panics on an entry's first delivery.
#[derive(Default)]
struct PanicAfterWriting {
    calls: Arc<AtomicU64>,
}

impl<C: EffectConnection> TransactionalStreamHandler<C> for PanicAfterWriting {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &StreamMessage<serde_json::Value>,
        conn: &mut C,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        conn.record_effect(&message.subscription, message.correlation_id.clone())
            .await
            .map_err(HandlerError::from)?;
        if message.deliveries == 1 {
            panic!("handler bug after writing");
        }
        Ok(())
    }
}

/// An entry with as many headers as an append takes is dead-lettered like
/// any other: the dead letter's own headers (original id, stream,
/// deliveries, errors) come on top of the limit. Its batch-mates settle in
/// the same step. (On PostgreSQL and SQLite the dead letter was once held
/// to append's header limit: the step failed, the batch-mates' outcomes
/// were dropped and they ran again, step after step.)
async fn an_entry_with_the_most_headers_is_dead_lettered_and_its_batch_mates_settle<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                let n = number(&message);
                calls.record(n);
                if n == 0 {
                    return Err(HandlerError::permanent("not a valid order"));
                }
                Ok(())
            }
        })
    };
    let subscription = StreamSubscription::new(
        store.clone(),
        receipts.clone(),
        config("billing", &key)?,
        handler,
    )?;
    subscription.ensure_group().await?;
    let mut first = NewStreamEntry::new(json!({ "n": 0 }));
    first.headers = (0..courier::MAX_HEADERS)
        .map(|i| (format!("h{i}"), i.to_string()))
        .collect();
    store
        .append(
            &key,
            &[
                first,
                NewStreamEntry::new(json!({ "n": 1 })),
                NewStreamEntry::new(json!({ "n": 2 })),
            ],
        )
        .await?;
    step_until(&backend, &subscription, true, || {
        calls.of(0) == 1 && calls.of(1) == 1 && calls.of(2) == 1
    })
    .await?;
    subscription.step().await?;
    assert_eq!(
        calls.snapshot(),
        BTreeMap::from([(0, 1), (1, 1), (2, 1)]),
        "each ran once"
    );
    let dead = courier_testkit::readable_entries(&store, &key.dead_letters()?, 1).await?;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].headers.len(),
        courier::MAX_HEADERS + courier::DEAD_LETTER_HEADERS
    );
    assert_eq!(dead[0].headers["h63"], "63");
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

/// Once shutdown begins no further entry of a batch starts; the one in
/// flight finishes and is settled, the rest stay pending and are delivered
/// once each later (they were all started, one after another, until the
/// shutdown timeout).
async fn after_shutdown_begins_no_entry_starts_and_each_takes_effect_once<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut config = config("billing", &key)?;
    config.batch = 5;
    config.concurrency = 1;
    config.block = Duration::from_millis(20);
    config.shutdown_timeout = Duration::from_secs(20);
    let (started, calls) = (Arc::new(AtomicU64::new(0)), Calls::default());
    let handler = {
        let (started, calls) = (started.clone(), calls.clone());
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let (started, calls) = (started.clone(), calls.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                calls.record(number(&message));
                Ok::<(), HandlerError>(())
            }
        })
    };
    let subscription =
        StreamSubscription::new(store.clone(), receipts.clone(), config.clone(), handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..5).await?;
    let running = subscription.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while started.load(Ordering::SeqCst) == 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the handler never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;
    assert_eq!(started.load(Ordering::SeqCst), 1, "one entry started");
    assert_eq!(calls.snapshot(), BTreeMap::from([(0, 1)]), "and finished");
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 4);

    let again =
        StreamSubscription::new(store.clone(), receipts.clone(), config, calls.recording())?;
    step_until(&backend, &again, true, || calls.snapshot().len() == 5).await?;
    again.step().await?;
    assert_eq!(
        calls.snapshot(),
        (0..5).map(|n| (n, 1)).collect::<BTreeMap<_, _>>()
    );
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

/// A deferral (the handler's quota is spent) leaves the rest of its batch
/// unrun and pending: they would only defer too (every one of them was run).
async fn a_deferral_leaves_the_rest_of_its_batch_unrun<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Arc::new(AtomicU64::new(0));
    let handler = always_snoozing(&calls, Duration::from_millis(1));
    let mut config = config("billing", &key)?;
    config.batch = 20;
    config.concurrency = 1;
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..20).await?;
    let step = subscription.step().await?;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{step:?}");
    assert_eq!(step.deferred, 1);
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 20);
    Ok(())
}

/// The entries a consumer holds — running, waiting their turn in its
/// batch, waiting for their ack — are touched while it works, so another
/// consumer of the subscription never claims them as idle and runs them a
/// second time beside it, although the batch takes longer than `min_idle`
/// (here 4 entries of 1.2 s each against 2 s; the default `min_idle`, 30 s,
/// is below the default handler timeout, 60 s).
async fn entries_a_consumer_is_working_on_are_not_claimed_by_another<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut config = config("billing", &key)?;
    config.min_idle = Duration::from_secs(2);
    config.claim_interval = Duration::from_millis(100);
    config.block = Duration::from_millis(50);
    config.batch = 4;
    config.concurrency = 1;
    let (started, calls) = (Arc::new(AtomicU64::new(0)), Calls::default());
    let consumer = |name: &str| -> anyhow::Result<_> {
        let (started, calls) = (started.clone(), calls.clone());
        let handler = stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let (started, calls) = (started.clone(), calls.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1200)).await;
                calls.record(number(&message));
                Ok::<(), HandlerError>(())
            }
        });
        let mut config = config.clone();
        config.consumer = name.to_owned();
        Ok(StreamSubscription::new(
            store.clone(),
            receipts.clone(),
            config,
            handler,
        )?)
    };
    let a = consumer("a")?;
    a.ensure_group().await?;
    append_numbered(&store, &key, 0..4).await?;
    let a = a.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while started.load(Ordering::SeqCst) == 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "a never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = consumer("b")?.start();
    while calls.snapshot().len() < 4 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "not done in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Time for b to claim anything it (wrongly) found idle.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(
        calls.snapshot(),
        (0..4).map(|n| (n, 1)).collect::<BTreeMap<_, _>>(),
        "each entry ran once"
    );
    assert_eq!(store.pending_summary(&key, "billing").await?.count, 0);
    Ok(())
}

/// Writes one `effects` row per entry through the receipt's transaction;
/// fails (after writing) on the first delivery of entry 1.
struct RecordEffect;

impl<C: EffectConnection> TransactionalStreamHandler<C> for RecordEffect {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &StreamMessage<serde_json::Value>,
        conn: &mut C,
    ) -> Result<(), HandlerError> {
        conn.record_effect(&message.subscription, message.correlation_id.clone())
            .await
            .map_err(HandlerError::from)?;
        if message.payload["n"] == 1 && message.deliveries == 1 {
            return Err(HandlerError::retry("failed after writing"));
        }
        Ok(())
    }
}

async fn a_transactional_handler_s_writes_commit_with_its_receipt<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let config = config("billing", &key)?;
    let subscription = StreamSubscription::transactional(
        store.clone(),
        receipts.clone(),
        config.clone(),
        RecordEffect,
    )?;
    subscription.ensure_group().await?;
    let ids = append_numbered(&store, &key, 0..3).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        subscription.step().await?;
        backend
            .age_pending(&key, "billing", Duration::from_secs(120))
            .await?;
        if store.pending_summary(&key, "billing").await?.count == 0
            && backend.scalar("SELECT count(*) FROM effects").await? == 3
        {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not done within 30 s"
        );
    }
    // The failed first delivery of entry 1 rolled its write back.
    assert_eq!(backend.scalar("SELECT sum(calls) FROM effects").await?, 3);
    // A receipt for each: handing them in again changes nothing.
    let correlation: Vec<String> = ids.iter().map(|id| config.correlation_id(*id)).collect();
    assert_eq!(
        receipts
            .find_stream_receipts("billing", &correlation)
            .await?
            .len(),
        3
    );
    Ok(())
}

/// A started subscription over a backlog of many full batches reads ahead,
/// settles earlier batches while it handles the next and drains it all,
/// once each, without stalling: on SQLite every one of those steps waits for
/// the one write turn, and a step left unpolled while holding it stalled the
/// rest for the turn's 10 s timeout.
async fn a_running_subscription_drains_a_backlog_of_full_batches_once_each<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    const ENTRIES: u64 = 2_000;
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let mut config = config("backlog", &key)?;
    config.batch = 20;
    config.block = Duration::from_millis(100);
    let subscription =
        StreamSubscription::new(store.clone(), receipts.clone(), config, calls.recording())?;
    subscription.ensure_group().await?;
    for start in (0..ENTRIES).step_by(500) {
        append_numbered(&store, &key, start..start + 500).await?;
    }
    let running = subscription.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let drained = loop {
        let handled = calls.snapshot().len() as u64;
        let pending = store.pending_summary(&key, "backlog").await?.count;
        if handled == ENTRIES && pending == 0 {
            break true;
        }
        if tokio::time::Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    running.shutdown().await;
    let handled = calls.snapshot();
    assert!(
        drained,
        "{} of {ENTRIES} entries handled within 30 s",
        handled.len()
    );
    assert!(handled.values().all(|&n| n == 1), "each entry handled once");
    Ok(())
}

/// Reads `n` new entries as `config`'s consumer, as a previous run of it did
/// before its replies were lost: they are its own pending entries.
async fn take_as_own_pending<S: StreamStore>(
    store: &S,
    config: &StreamSubscriptionConfig,
    n: usize,
) -> anyhow::Result<()> {
    let read = ReadNew {
        group: config.name.clone(),
        consumer: config.consumer.clone(),
        count: n,
        block: None,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut taken = 0;
    while taken < n {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "entries not readable"
        );
        taken += store.read_new(&config.key, &read).await?.len();
    }
    Ok(())
}

/// A deferral while a restarted consumer re-reads its own pending entries
/// stops that drain too: the next pages wait for the pause like new reads.
async fn a_deferral_stops_the_drain_of_own_pending_entries<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut config = config("billing", &key)?;
    config.batch = 2;
    config.defer_min = Duration::from_secs(5);
    config.defer_max = Duration::from_secs(5);
    let calls = Arc::new(AtomicU64::new(0));
    let handler = always_snoozing(&calls, Duration::from_secs(5));
    let subscription =
        StreamSubscription::new(store.clone(), receipts.clone(), config.clone(), handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..6).await?;
    take_as_own_pending(&store, &config, 6).await?;
    subscription.step().await?;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the first entry deferred; the rest of its page and the other two pages of own \
         pending entries must wait"
    );
    Ok(())
}

/// A plain handler still running when shutdown gives up on it is stopped:
/// its entry is left pending for another delivery, so no effect of this
/// run may happen after shutdown returned.
async fn a_plain_handler_past_the_shutdown_timeout_has_no_effect_after_shutdown<B: Harness>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let mut config = config("billing", &key)?;
    config.block = Duration::from_millis(20);
    config.shutdown_timeout = Duration::from_millis(100);
    let (started, effects) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let handler = {
        let (started, effects) = (started.clone(), effects.clone());
        stream_handler_fn(move |_message: StreamMessage<serde_json::Value>| {
            let (started, effects) = (started.clone(), effects.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(800)).await;
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    let running = subscription.start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while started.load(Ordering::SeqCst) == 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the handler never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "the handler ran on after shutdown returned"
    );
    Ok(())
}

macro_rules! stream_subscription_tests {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(courier_testkit::PgFixture::new().await?).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(super::RedisHarness::new().await?).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case(courier_testkit::SqliteFixture::new().await?).await
                }
            )*
        }
    };
}

stream_subscription_tests!(
    every_entry_takes_effect_once_and_is_acked,
    two_subscriptions_on_a_stream_each_get_every_entry,
    a_found_receipt_skips_the_effect_and_acks,
    a_poison_entry_is_dead_lettered_after_exactly_max_deliveries,
    a_permanent_failure_is_dead_lettered_at_once,
    deferrals_never_count_toward_max_deliveries,
    deferrals_do_not_count_after_a_claim_or_a_restart,
    a_deferring_subscription_stops_reading_and_claiming_for_its_backoff,
    a_deferred_entry_is_taken_up_again_after_the_pause_not_after_min_idle,
    a_crashed_consumer_s_entries_are_claimed_once_idle,
    a_restarted_consumer_handles_its_own_pending_entries_first,
    a_panicking_handler_leaves_its_entry_pending,
    a_panicking_transactional_handler_leaves_its_entry_pending,
    after_shutdown_begins_no_entry_starts_and_each_takes_effect_once,
    a_deferral_leaves_the_rest_of_its_batch_unrun,
    entries_a_consumer_is_working_on_are_not_claimed_by_another,
    an_entry_with_the_most_headers_is_dead_lettered_and_its_batch_mates_settle,
    a_transactional_handler_s_writes_commit_with_its_receipt,
    a_running_subscription_drains_a_backlog_of_full_batches_once_each,
    a_deferral_stops_the_drain_of_own_pending_entries,
    a_plain_handler_past_the_shutdown_timeout_has_no_effect_after_shutdown,
);

/// A take-back that went through although the worker stopped waiting for
/// it is not discounted a second time: on PostgreSQL the take-back's
/// `UPDATE` waits on a row lock the handler took, the worker gives up after
/// its limit (1 s) and discounts the delivery itself, and then the `UPDATE`
/// commits when the lock is let go. A poison entry deferred once that way
/// still runs exactly `max_deliveries` times before it is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_take_back_that_went_through_unanswered_is_not_discounted_twice(
) -> anyhow::Result<()> {
    a_take_back_past_the_worker_s_limit(true).await
}

/// The same take-back, given up on by the worker and then not applied (its
/// backend is terminated while it waits): the worker's own discount keeps
/// the deferral from counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_take_back_that_never_went_through_is_discounted_once() -> anyhow::Result<()> {
    a_take_back_past_the_worker_s_limit(false).await
}

/// A poison entry (`max_deliveries` 2) whose first delivery is deferred
/// while its take-back waits on a row lock past the worker's limit; then
/// the take-back is `applied` or terminated. Either way the entry runs
/// exactly twice more and is dead-lettered.
async fn a_take_back_past_the_worker_s_limit(applied: bool) -> anyhow::Result<()> {
    let backend = courier_testkit::PgFixture::new().await?;
    let store = backend.streams();
    let receipts = backend.receipts();
    let key = key()?;
    let calls = Calls::default();
    let held: Arc<Mutex<Option<tokio::task::JoinHandle<anyhow::Result<()>>>>> = Arc::default();
    let handler = {
        let (calls, held, pool) = (calls.clone(), held.clone(), backend.pool.clone());
        let (tenant, stream) = (key.tenant().to_owned(), key.stream().to_owned());
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let (calls, held, pool) = (calls.clone(), held.clone(), pool.clone());
            let (tenant, stream) = (tenant.clone(), stream.clone());
            async move {
                let call = calls.record(number(&message));
                if call > 1 {
                    return Err(HandlerError::retry(format!("poison, call {call}")));
                }
                // Holds the entry's pending row past the worker's limit on
                // the take-back, then lets it go.
                let mut tx = pool.begin().await.map_err(HandlerError::retry)?;
                sqlx::query(
                    "SELECT 1 FROM stream_pending WHERE tenant = $1 AND stream = $2 FOR UPDATE",
                )
                .bind(&tenant)
                .bind(&stream)
                .fetch_all(&mut *tx)
                .await
                .map_err(HandlerError::retry)?;
                let release = tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    tx.commit().await?;
                    Ok(())
                });
                *held
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(release);
                Err(HandlerError::snooze(Duration::from_millis(1), "quota"))
            }
        })
    };
    let mut config = config("billing", &key)?;
    config.max_deliveries = 2;
    config.defer_min = Duration::from_millis(1);
    config.defer_max = Duration::from_millis(2);
    let subscription = StreamSubscription::new(store.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    append_numbered(&store, &key, 0..1).await?;
    let dead = key.dead_letters()?;
    step_until(&backend, &subscription, false, || calls.of(0) >= 1).await?;
    let release = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .ok_or_else(|| anyhow::anyhow!("the handler holds no lock"))?;
    anyhow::ensure!(
        !release.is_finished(),
        "the step waited for the row lock instead of giving the take-back up"
    );
    // The given-up take-back still waits on the lock in its own backend.
    let waiting = format!("%{}.stream_pending%", backend.schema);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let pid = loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE $1 AND query LIKE '%UPDATE%'",
        )
        .bind(&waiting)
        .fetch_optional(&backend.pool)
        .await?;
        if let Some(pid) = pid {
            break pid;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no take-back waits on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if !applied {
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&backend.pool)
            .await?;
        anyhow::ensure!(terminated);
    }
    release.await??;
    let detail = || {
        store.pending_detail(
            &key,
            "billing",
            &courier::PendingQuery {
                after: StreamEntryId::ZERO,
                count: 10,
                consumer: None,
                min_idle: None,
            },
        )
    };
    // Once the take-back's backend has let go of the row (committed or
    // ended), the count shows whether it went through.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let still: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
        )
        .bind(pid)
        .fetch_optional(&backend.pool)
        .await?;
        if still.is_none() {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the take-back still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliveries = detail().await?;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(
        deliveries[0].deliveries,
        if applied { 0 } else { 1 },
        "the take-back went through: {applied}"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.pending_summary(&key, "billing").await?.count > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not dead-lettered within 30 s"
        );
        subscription.step().await?;
        backend
            .age_pending(&key, "billing", Duration::from_secs(120))
            .await?;
    }
    assert_eq!(
        calls.of(0),
        3,
        "one deferral, then exactly max_deliveries (2) runs"
    );
    assert_eq!(
        courier_testkit::readable_entries(&store, &dead, 1)
            .await?
            .len(),
        1
    );
    Ok(())
}
