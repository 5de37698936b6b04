//! Fixtures for Courier's tests: every test gets a fresh PostgreSQL schema or
//! a fresh SQLite file, so the suite runs in parallel against real databases.
//!
//! [`Backend`] is what the engine suite is written against; it is implemented
//! by [`PgFixture`] and [`SqliteFixture`], and `backend_tests!` generates each
//! test once per backend. [`StoreFixture`] is what the store conformance
//! suite ([`store_suite`]) is written against; `store_conformance_tests!`
//! expands it for one backend. [`StreamFixture`] is what the stream
//! conformance suite ([`stream_suite`]) is written against;
//! `stream_backend_tests!` expands it for one stream backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{Courier, DeadLetterStore, HandlerError, Message, OutboxStore, TransactionalHandler};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, SqliteConnection, SqlitePool};
use uuid::Uuid;

pub mod servers;
pub mod spans;
pub mod store_suite;
pub mod stream_suite;
pub use store_suite::{HeldSnapshot, StoreFixture, SuiteConnection};
pub use stream_suite::{
    redis_url, PgStreamFixture, ReadablePgStore, RedisStreamFixture, SqliteStreamFixture,
    StreamFixture,
};

/// The PostgreSQL server tests use: `DATABASE_URL`, or the project machines' default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A backend under test: Courier over a fresh database, plus raw SQL access.
pub trait Backend: Send + Sync + 'static {
    /// The store.
    type Store: OutboxStore<Connection: EffectConnection> + DeadLetterStore + courier::AdminStore;

    /// Which database this is (`postgres` or `sqlite`), for the few
    /// assertions only one of them can make.
    const KIND: &'static str;

    /// Courier over the fresh database.
    fn courier(&self) -> &Courier<Self::Store>;

    /// Runs a statement (DDL, setup) on the test database.
    fn execute(&self, sql: &str) -> impl std::future::Future<Output = anyhow::Result<u64>> + Send;

    /// Runs a query returning one integer.
    fn scalar(&self, sql: &str) -> impl std::future::Future<Output = anyhow::Result<i64>> + Send;

    /// Creates the `effects` table the [`RecordEffect`] handler writes.
    fn create_effects_table(&self) -> impl std::future::Future<Output = anyhow::Result<()>> + Send {
        async {
            self.execute(
                "CREATE TABLE effects (
                   subscription text NOT NULL,
                   message_id text NOT NULL,
                   calls integer NOT NULL,
                   PRIMARY KEY (subscription, message_id))",
            )
            .await?;
            Ok(())
        }
    }

    /// Enqueues `messages` inside a transaction that commits.
    fn enqueue_committed(
        &self,
        messages: &[courier::NewMessage],
    ) -> impl std::future::Future<Output = anyhow::Result<Vec<courier::EnqueueOutcome>>> + Send;

    /// Enqueues `messages` inside a transaction that rolls back.
    fn enqueue_rolled_back(
        &self,
        messages: &[courier::NewMessage],
    ) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;

    /// Shortens every lease on the database so the next expiry check sees them expired.
    fn expire_leases(&self) -> impl std::future::Future<Output = anyhow::Result<u64>> + Send;

    /// Another store over the same database with a pool (and memory) of its
    /// own, as another process would have.
    fn another_store(
        &self,
    ) -> impl std::future::Future<Output = anyhow::Result<Self::Store>> + Send;
}

/// A fresh PostgreSQL schema holding Courier's tables and the test's own.
pub struct PgFixture {
    courier: Courier<PgStore>,
    /// A pool whose `search_path` is the test schema.
    pub pool: PgPool,
    /// The test schema's name.
    pub schema: String,
}

impl PgFixture {
    /// A new schema, migrated, with a pool of `max_connections`.
    pub async fn new() -> anyhow::Result<Self> {
        Self::with_connections(10).await
    }

    /// A new schema, migrated, with a pool of `max_connections`.
    pub async fn with_connections(max_connections: u32) -> anyhow::Result<Self> {
        let schema = format!("t_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let pool = pg_pool(&schema, max_connections).await?;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await?;
        let courier = Courier::postgres_with_schema(pool.clone(), &schema)?;
        courier.migrate().await?;
        Ok(Self {
            courier,
            pool,
            schema,
        })
    }
}

impl PgFixture {
    /// A store of its own over this schema (pool and memory, as another
    /// process would have) whose connections name themselves
    /// `{schema}-{name}` in `pg_stat_activity`, so a test can see what it
    /// waits for ([`PgFixture::waits_on_a_lock`]).
    pub async fn named_store(&self, name: &str) -> anyhow::Result<PgStore> {
        let options: PgConnectOptions = database_url().parse()?;
        let options = options
            .options([("search_path", self.schema.as_str()), ("jit", "off")])
            .application_name(&format!("{}-{name}", self.schema));
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        Ok(PgStore::with_schema(pool, &self.schema)?)
    }

    /// Whether a connection of the store [`named_store`](Self::named_store)
    /// `name` is waiting on a lock.
    pub async fn waits_on_a_lock(&self, name: &str) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(format!("{}-{name}", self.schema))
        .fetch_one(&self.pool)
        .await
        .is_ok_and(|n| n > 0)
    }
}

/// A pool on the test server whose `search_path` is `schema`.
pub async fn pg_pool(schema: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = database_url().parse()?;
    let options = options.options([("search_path", schema), ("jit", "off")]);
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?)
}

impl Backend for PgFixture {
    type Store = PgStore;
    const KIND: &'static str = "postgres";

    fn courier(&self) -> &Courier<PgStore> {
        &self.courier
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        Ok(sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        let value: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(value)
    }

    async fn enqueue_committed(
        &self,
        messages: &[courier::NewMessage],
    ) -> anyhow::Result<Vec<courier::EnqueueOutcome>> {
        let mut tx = self.pool.begin().await?;
        let outcomes = self.courier.enqueue_batch(&mut tx, messages).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn enqueue_rolled_back(&self, messages: &[courier::NewMessage]) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        self.courier.enqueue_batch(&mut tx, messages).await?;
        tx.rollback().await?;
        Ok(())
    }

    async fn expire_leases(&self) -> anyhow::Result<u64> {
        Backend::execute(
            self,
            "UPDATE deliveries SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE state = 'running'",
        )
        .await
    }

    async fn another_store(&self) -> anyhow::Result<PgStore> {
        StoreFixture::open_store(self, 4).await
    }
}

/// A fresh SQLite database file in a temporary directory.
pub struct SqliteFixture {
    courier: Courier<SqliteStore>,
    /// The store's pool.
    pub pool: SqlitePool,
    /// The database file.
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SqliteFixture {
    /// A new database file, migrated.
    pub async fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("courier.db");
        let path_text = path
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))?;
        let pool = courier::sqlite::connect(path_text, 8).await?;
        let courier = Courier::sqlite(pool.clone());
        courier.migrate().await?;
        Ok(Self {
            courier,
            pool,
            path,
            _dir: dir,
        })
    }
}

impl Backend for SqliteFixture {
    type Store = SqliteStore;
    const KIND: &'static str = "sqlite";

    fn courier(&self) -> &Courier<SqliteStore> {
        &self.courier
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        Ok(sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        let value: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(value)
    }

    async fn enqueue_committed(
        &self,
        messages: &[courier::NewMessage],
    ) -> anyhow::Result<Vec<courier::EnqueueOutcome>> {
        let mut tx = self.pool.begin().await?;
        let outcomes = self.courier.enqueue_batch(&mut tx, messages).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn enqueue_rolled_back(&self, messages: &[courier::NewMessage]) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        self.courier.enqueue_batch(&mut tx, messages).await?;
        tx.rollback().await?;
        Ok(())
    }

    async fn expire_leases(&self) -> anyhow::Result<u64> {
        Backend::execute(
            self,
            "UPDATE deliveries SET lease_expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) - 1000 WHERE state = 'running'",
        )
        .await
    }

    async fn another_store(&self) -> anyhow::Result<SqliteStore> {
        StoreFixture::open_store(self, 4).await
    }
}

/// The payload most tests send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// A number the test can check.
    pub n: i64,
}

/// Counts handler invocations per message id, across every attempt.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    calls: Arc<Mutex<HashMap<Uuid, u32>>>,
    order: Arc<Mutex<Vec<(Uuid, i64)>>>,
}

impl CallCounter {
    /// Records one call.
    pub fn record(&self, id: Uuid, n: i64) {
        if let Ok(mut calls) = self.calls.lock() {
            *calls.entry(id).or_insert(0) += 1;
        }
        if let Ok(mut order) = self.order.lock() {
            order.push((id, n));
        }
    }

    /// Calls made for `id`.
    pub fn calls(&self, id: Uuid) -> u32 {
        self.calls
            .lock()
            .map(|c| c.get(&id).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Calls made in all.
    pub fn total(&self) -> u64 {
        self.calls
            .lock()
            .map(|c| c.values().map(|v| u64::from(*v)).sum())
            .unwrap_or(0)
    }

    /// Distinct messages called.
    pub fn distinct(&self) -> usize {
        self.calls.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// The payload numbers in call order.
    pub fn order(&self) -> Vec<i64> {
        self.order
            .lock()
            .map(|o| o.iter().map(|(_, n)| *n).collect())
            .unwrap_or_default()
    }
}

/// A plain handler that records every call on `counter`.
pub fn counting(counter: CallCounter) -> impl courier::Handler<Payload = Event> {
    courier::handler_fn(move |message: Message<Event>| {
        let counter = counter.clone();
        async move {
            counter.record(message.id, message.payload.n);
            Ok::<(), HandlerError>(())
        }
    })
}

/// A transactional handler that upserts `effects(subscription, message_id)`,
/// incrementing `calls`: a committed effect applied twice would show `calls = 2`.
#[derive(Debug, Clone, Default)]
pub struct RecordEffect {
    /// Counts invocations (committed or not).
    pub counter: CallCounter,
    /// Sleep this long inside the transaction before writing.
    pub delay: Duration,
}

/// A connection the [`RecordEffect`] handler can write its effect through.
pub trait EffectConnection: Send + 'static {
    /// Upserts `effects(subscription, message_id)`, incrementing `calls`.
    fn record_effect<'a>(
        &'a mut self,
        subscription: &'a str,
        message_id: String,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a;
}

impl EffectConnection for PgConnection {
    async fn record_effect<'a>(
        &'a mut self,
        subscription: &'a str,
        message_id: String,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO effects (subscription, message_id, calls) VALUES ($1, $2, 1)
             ON CONFLICT (subscription, message_id) DO UPDATE SET calls = effects.calls + 1",
        )
        .bind(subscription)
        .bind(message_id)
        .execute(self)
        .await?;
        Ok(())
    }
}

impl EffectConnection for SqliteConnection {
    async fn record_effect<'a>(
        &'a mut self,
        subscription: &'a str,
        message_id: String,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO effects (subscription, message_id, calls) VALUES (?1, ?2, 1)
             ON CONFLICT (subscription, message_id) DO UPDATE SET calls = effects.calls + 1",
        )
        .bind(subscription)
        .bind(message_id)
        .execute(self)
        .await?;
        Ok(())
    }
}

impl<C: EffectConnection> TransactionalHandler<C> for RecordEffect {
    type Payload = Event;

    async fn handle(&self, message: &Message<Event>, conn: &mut C) -> Result<(), HandlerError> {
        self.counter.record(message.id, message.payload.n);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        conn.record_effect(&message.subscription, message.id.to_string())
            .await?;
        Ok(())
    }
}

/// Maintenance whose rescues offer expired deliveries again after a
/// millisecond (the default backs off seconds), for tests that rescue and
/// claim again at once.
pub fn rescue_at_once() -> courier::MaintenanceConfig {
    courier::MaintenanceConfig {
        rescue_backoff: courier::RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(1),
            ..courier::RetryPolicy::default()
        },
        ..courier::MaintenanceConfig::default()
    }
}

/// The first entries of `key` (up to 100) once at least `at_least` are
/// readable, or what there is after 30 s. On PostgreSQL a reader sees only
/// entries of transactions below its snapshot's xmin, so another test's open
/// transaction on the shared server can delay an entry just appended (see
/// `tests/pg_streams.rs`).
///
/// # Errors
///
/// The store's error, if a read fails.
pub async fn readable_entries<S: courier::StreamStore>(
    store: &S,
    key: &courier::StreamKey,
    at_least: usize,
) -> Result<Vec<courier::StreamEntry>, courier::StoreError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let entries = store.range(key, courier::StreamEntryId::ZERO, 100).await?;
        if entries.len() >= at_least || tokio::time::Instant::now() >= deadline {
            return Ok(entries);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `check` returns true, polling every 20 ms, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` messages for `tenant` on `topic` with payloads `0..n`.
pub fn events(tenant: &str, topic: &str, n: i64) -> anyhow::Result<Vec<courier::NewMessage>> {
    (0..n)
        .map(|i| Ok(courier::NewMessage::new(tenant, topic, &Event { n: i })?))
        .collect()
}

/// Generates one `#[tokio::test]` per backend for each named generic test
/// function `async fn name<B: Backend>(backend: B) -> anyhow::Result<()>`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name($crate::PgFixture::new().await?).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name($crate::SqliteFixture::new().await?).await
                }
            )*
        }
    };
}

/// A fault injector: a store whose lease extensions hang while stalled, as
/// when a worker's heartbeat connection is stuck. Everything else goes to the
/// wrapped store unchanged.
#[derive(Clone)]
pub struct StalledHeartbeat<S> {
    inner: S,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: OutboxStore> StalledHeartbeat<S> {
    /// Wraps `inner` with extensions stalled from the start.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            stalled: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Lets extensions through again (`false`) or stalls them (`true`).
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled
            .store(stalled, std::sync::atomic::Ordering::SeqCst);
    }
}

impl<S: OutboxStore> OutboxStore for StalledHeartbeat<S> {
    type Connection = S::Connection;
    const EXCLUSIVE_TRANSACTIONS: bool = S::EXCLUSIVE_TRANSACTIONS;

    fn migrate(&self) -> impl std::future::Future<Output = Result<(), courier::StoreError>> + Send {
        self.inner.migrate()
    }

    fn enqueue_batch<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        messages: &'c [courier::NewMessage],
    ) -> impl std::future::Future<Output = Result<Vec<courier::EnqueueOutcome>, courier::StoreError>>
           + Send
           + 'c {
        self.inner.enqueue_batch(conn, messages)
    }

    fn publish_batch<'c>(
        &'c self,
        messages: &'c [courier::NewMessage],
    ) -> impl std::future::Future<Output = Result<Vec<courier::EnqueueOutcome>, courier::StoreError>>
           + Send
           + 'c {
        self.inner.publish_batch(messages)
    }

    fn register_subscription<'c>(
        &'c self,
        spec: &'c courier::SubscriptionSpec,
    ) -> impl std::future::Future<Output = Result<courier::Registration, courier::StoreError>> + Send + 'c
    {
        self.inner.register_subscription(spec)
    }

    fn claim<'c>(
        &'c self,
        params: &'c courier::ClaimParams,
    ) -> impl std::future::Future<Output = Result<courier::ClaimBatch, courier::StoreError>> + Send + 'c
    {
        self.inner.claim(params)
    }

    fn complete_many<'c>(
        &'c self,
        completions: &'c [courier::LeaseRef],
    ) -> impl std::future::Future<Output = Result<Vec<i64>, courier::StoreError>> + Send + 'c {
        self.inner.complete_many(completions)
    }

    fn fail_many<'c>(
        &'c self,
        failures: &'c [courier::Failure],
    ) -> impl std::future::Future<Output = Result<Vec<courier::FailureApplied>, courier::StoreError>>
           + Send
           + 'c {
        self.inner.fail_many(failures)
    }

    fn snooze_many<'c>(
        &'c self,
        snoozes: &'c [courier::Snooze],
    ) -> impl std::future::Future<Output = Result<Vec<courier::FailureApplied>, courier::StoreError>>
           + Send
           + 'c {
        self.inner.snooze_many(snoozes)
    }

    async fn extend_many<'c>(
        &'c self,
        leases: &'c [courier::LeaseRef],
        lease: Duration,
    ) -> Result<courier::Extended, courier::StoreError> {
        while self.stalled.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.inner.extend_many(leases, lease).await
    }

    fn release_many<'c>(
        &'c self,
        leases: &'c [courier::LeaseRef],
    ) -> impl std::future::Future<Output = Result<Vec<i64>, courier::StoreError>> + Send + 'c {
        self.inner.release_many(leases)
    }

    fn rescue_expired<'c>(
        &'c self,
        params: &'c courier::RescueParams,
    ) -> impl std::future::Future<Output = Result<u64, courier::StoreError>> + Send + 'c {
        self.inner.rescue_expired(params)
    }

    fn run_transactional<'c>(
        &'c self,
        delivery: &'c courier::ClaimedDelivery,
        work: courier::TxWork<Self::Connection>,
    ) -> impl std::future::Future<Output = Result<courier::TransactionalOutcome, courier::StoreError>>
           + Send
           + 'c {
        self.inner.run_transactional(delivery, work)
    }

    fn run_transactional_batch<'c>(
        &'c self,
        batch: Vec<(
            &'c courier::ClaimedDelivery,
            courier::TxWork<Self::Connection>,
        )>,
        isolate_failures: bool,
    ) -> impl std::future::Future<
        Output = Result<courier::TransactionalBatchOutcome, courier::StoreError>,
    > + Send
           + 'c {
        self.inner.run_transactional_batch(batch, isolate_failures)
    }

    fn announce_idle<'c>(
        &'c self,
        subscription: &'c str,
        worker_id: &'c str,
        idle: bool,
    ) -> impl std::future::Future<Output = Result<bool, courier::StoreError>> + Send + 'c {
        self.inner.announce_idle(subscription, worker_id, idle)
    }

    fn lead_maintenance<'c>(
        &'c self,
        holder: &'c str,
        lease: Duration,
    ) -> impl std::future::Future<Output = Result<bool, courier::StoreError>> + Send + 'c {
        self.inner.lead_maintenance(holder, lease)
    }

    fn resign_maintenance<'c>(
        &'c self,
        holder: &'c str,
    ) -> impl std::future::Future<Output = Result<(), courier::StoreError>> + Send + 'c {
        self.inner.resign_maintenance(holder)
    }

    fn prune(
        &self,
        older_than: Duration,
        batch: usize,
    ) -> impl std::future::Future<Output = Result<courier::PruneReport, courier::StoreError>> + Send
    {
        self.inner.prune(older_than, batch)
    }
}

/// How many messages the admin view ([`courier::AdminStore::list_messages`]
/// with state `completed`) reports completed by `subscription`: what a plain
/// handler's completions leave to count, as they write no receipt.
pub async fn completed_by<S: courier::AdminStore>(
    store: &S,
    subscription: &str,
) -> anyhow::Result<i64> {
    let filter = courier::MessageFilter {
        state: Some("completed".into()),
        subscription: Some(subscription.into()),
        ..courier::MessageFilter::default()
    };
    let mut total = 0;
    let mut before = None;
    loop {
        let page = store
            .list_messages(&filter, before, courier::MAX_MESSAGE_PAGE)
            .await?;
        total += i64::try_from(page.items.len())?;
        match page.next_cursor {
            Some(cursor) => before = Some(cursor),
            None => return Ok(total),
        }
    }
}

/// Each subscription's (name, state) of message `id`, as
/// [`courier::AdminStore::get_message`] reports it; an error if it is gone.
pub async fn states_of<S: courier::AdminStore>(
    store: &S,
    id: Uuid,
) -> anyhow::Result<Vec<(String, String)>> {
    let (_, deliveries) = store
        .get_message(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("message {id} is gone"))?;
    Ok(deliveries
        .into_iter()
        .map(|d| (d.subscription, d.state))
        .collect())
}
