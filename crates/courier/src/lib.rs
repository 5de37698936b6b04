//! Courier: durable event delivery for services.
//!
//! Write an event in the same database transaction as the change that caused
//! it ([`Courier::enqueue`]); Courier delivers it to every subscription whose
//! topics match, under leases, with retries, dead letters and receipts, so
//! each event takes effect exactly once although workers crash and handlers
//! fail.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use courier::{handler_fn, Courier, HandlerError, Message, NewMessage};
//!
//! let courier = Courier::connect_sqlite("./app.db").await?;
//! courier.migrate().await?;
//!
//! // Producer: the message commits or rolls back with the application's data.
//! let mut tx = courier.store().begin().await?; // BEGIN IMMEDIATE on SQLite
//! courier
//!     .enqueue(&mut tx, &NewMessage::new("acme", "invoice.paid", &serde_json::json!({"id": 7}))?)
//!     .await?;
//! tx.commit().await?;
//!
//! // Consumer: a worker for the `billing` subscription.
//! let worker = courier
//!     .worker("billing")
//!     .handle("invoice.paid", 1, handler_fn(|message: Message<serde_json::Value>| async move {
//!         println!("paid: {}", message.payload);
//!         Ok::<(), HandlerError>(())
//!     }))
//!     .build()
//!     .await?
//!     .start();
//! worker.shutdown().await;
//! # Ok(()) }
//! ```

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use courier_core::{
    dead_letter_entry, ClaimIdle, ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry,
    EntryOrigin, GroupStart, GroupSummary, NewStreamEntry, PendingDetail, PendingEntry,
    PendingQuery, PendingSummary, ReadNew, ReceiptOutcome, StreamEntry, StreamEntryId, StreamKey,
    StreamPage, StreamReceipts, StreamStore, StreamSummary, TrimBound, DEAD_LETTER_HEADERS,
    DEAD_STREAM_SUFFIX, MAX_STREAM_BATCH, MAX_STREAM_BLOCK, MAX_STREAM_PAGE,
};
pub use courier_core::{
    error_fingerprint, lease_expired_fingerprint, normalise_error, validate_fingerprint,
    DeadLetterGroup, ErrorKind, MAX_DEAD_LETTER_GROUPS, UNKNOWN_FINGERPRINT,
};
pub use courier_core::{
    topic_matches, truncate_chars, validate_name, AdminStore, Availability, BatchItem,
    BatchRollback, CancelOutcome, ClaimBatch, ClaimParams, ClaimedDelivery, DatabaseHealth,
    DeadLetter, DeadLetterFilter, DeadLetterKey, DeadLetterPage, DeadLetterStore, DeliveryStats,
    DeliveryStatsPage, DeliverySummary, DeliveryTotals, EnqueueOutcome, ErrorEntry, Extended,
    Failure, FailureApplied, HandlerError, LeaseRef, Message, MessageFilter, MessageKey,
    MessagePage, NewMessage, OutboxStore, PruneReport, RateLimit, Registration, Replay,
    RescueParams, RetryPolicy, Route, Snooze, StatsKey, StoreError, StoredMessage,
    SubscriptionInfo, SubscriptionPage, SubscriptionSpec, TransactionalBatchOutcome,
    TransactionalOutcome, TxWork, ValidationError, MAX_ERROR_CHARS, MAX_HOLD, MAX_LIST_PAGE,
    MAX_MESSAGE_PAGE, MAX_PAYLOAD_BYTES, MAX_SNOOZES,
};
pub use courier_engine::{
    handler_fn, stream_handler_fn, EngineError, Handler, Maintenance, MaintenanceConfig,
    StreamHandler, StreamMessage, StreamStep, StreamSubscription, StreamSubscriptionConfig,
    StreamSubscriptionHandle, TransactionalHandler, TransactionalStreamHandler, Worker,
    WorkerBuilder, WorkerConfig, WorkerHandle,
};
// What the daemon's configuration and streams API build on.
pub use courier_core::{validate_count, MAX_HEADERS};
// What `courier migrate status` and the migration runners speak.
pub use courier_core::{
    migration_refusal, migration_status, Migration, MigrationState, MigrationStatus,
};
pub use courier_engine::stream_worker::{
    default_consumer, DEFAULT_CLAIM_INTERVAL, DEFAULT_DEFER_MAX, DEFAULT_DEFER_MIN,
    DEFAULT_MAX_DELIVERIES, DEFAULT_MIN_IDLE, DEFAULT_STREAM_BATCH, DEFAULT_STREAM_BLOCK,
};
pub use courier_engine::DEFAULT_HANDLER_TIMEOUT;
// How far a slow maintenance pass spaces out the next (relays' dedupe
// horizons count it).
pub use courier_engine::maintenance::MAX_SPACING as MAX_MAINTENANCE_SPACING;
// Traces across the outbox: the header keys and their rules, and (with the
// `otel` feature) the current span's context.
pub use courier_core::{
    entries_with_current_context, has_trace_context, insert_trace_context, replace_trace_context,
    traceparent_trace_id, valid_traceparent, TRACEPARENT, TRACESTATE,
};
pub use courier_engine::trace_context;

/// The PostgreSQL backend.
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use courier_postgres::*;
}

/// The SQLite backend.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use courier_sqlite::*;
}

/// The Redis Streams backend of [`StreamStore`].
#[cfg(feature = "redis")]
pub mod redis {
    pub use courier_redis::*;
}

/// Handlers running at once per worker by default on PostgreSQL: one and a
/// half times the batch size, so that while one full claim's handlers run a
/// second claim can be on its way (each claim reserves the slots it may fill;
/// at 256 / 256 the first claim reserved them all). Claims of 256 rows halve
/// the round trips per message against 64. On the 2-core bench machine
/// (`courier bench`, medians of 3 full runs before and after) the no-op drain
/// went 24,381 -> 27,663 msg/s and exactly-once 15,157 -> 18,481. Twice the
/// batch size drained no-op messages at most ~5 % faster in single runs but
/// usually halved the drain of 1,000 ordering keys (mostly 6,500-8,900 msg/s against
/// 14,400-15,300 at 384): with more deliveries in flight fewer keys have a
/// claimable message, claims come back short and each walks the backlog.
pub const POSTGRES_CONCURRENCY: usize = 384;
/// Deliveries claimed per round trip by default on PostgreSQL.
pub const POSTGRES_BATCH_SIZE: usize = 256;
/// Pool size of [`Courier::connect_postgres`]: a worker at the default
/// settings uses up to 11 at once (two claims, the settler, the heartbeat,
/// the LISTEN connection, and one per running group of transactional
/// handlers: 384 / 64 = 6), leaving room for producers.
pub const POSTGRES_CONNECTIONS: u32 = 16;
/// Pool size of [`Courier::connect_sqlite`]: SQLite has one writer, so
/// more connections only add readers waiting on it.
pub const SQLITE_CONNECTIONS: u32 = 8;
/// Handlers running at once per worker by default on SQLite: twice the batch
/// size, so a second full claim can be on its way while the first one's
/// handlers run. Each claim and each settle takes SQLite's single write lock
/// in turn, so larger claims mean fewer turns per message: on the 2-core bench
/// machine (`courier bench --scenario drain --baseline --rounds 3`, BENCHMARKS.md
/// session 28) the `courier` binary at 256 / 128 drained no-op messages at
/// 17,008-18,867 msg/s (medians of rounds; 0.10-0.11 of the hand-written
/// drain) against 14,924-16,341 (0.09-0.10) at 128 / 64, 50 tenants at
/// 8,100-9,240 against 5,866-6,847, the other cases within the runs' spread.
/// Those drains peaked at 35-40 MB RSS, because the binary caps glibc's malloc
/// arenas (`MALLOC_ARENA_MAX=2`); without the cap 256 / 128 peaked at 49-54 MB
/// (a service embedding Courier on glibc can set that variable the same way).
/// Two full `--scenario all` runs, whose enqueue cases come first in the same
/// process, peaked at 35.2 and 33.9 MB. Transactional handlers hold the
/// write lock while they run, and claims, outcomes and heartbeats wait behind
/// them, so it is kept from growing further (512 / 256 was more erratic in
/// session 16: no-op 24,182-30,614 msg/s).
pub const SQLITE_CONCURRENCY: usize = 256;
/// Deliveries claimed per round trip by default on SQLite.
pub const SQLITE_BATCH_SIZE: usize = 128;

/// Starts the wake-up source of a store (a LISTEN connection, or an
/// in-process signal) and returns a receiver workers wait on.
type WakeStarter<S> = fn(&S, CancellationToken) -> watch::Receiver<u64>;

/// Courier over one store: enqueue, workers, dead letters, maintenance.
///
/// Cheap to clone. Dropping the last clone stops its wake-up listener.
pub struct Courier<S: OutboxStore> {
    store: S,
    wake: Arc<Wake<S>>,
}

struct Wake<S> {
    starter: WakeStarter<S>,
    /// The backend's default (concurrency, batch size) for new workers.
    worker_defaults: (usize, usize),
    receiver: OnceLock<watch::Receiver<u64>>,
    stop: CancellationToken,
}

impl<S> Drop for Wake<S> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<S: OutboxStore> Clone for Courier<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            wake: Arc::clone(&self.wake),
        }
    }
}

#[cfg(feature = "postgres")]
impl Courier<courier_postgres::PgStore> {
    /// Courier on PostgreSQL, in the schema `courier`.
    pub fn postgres(pool: sqlx::PgPool) -> Self {
        Self::from_postgres_store(courier_postgres::PgStore::new(pool))
    }

    /// Courier on PostgreSQL in `schema` (`[a-z_][a-z0-9_]{0,62}`).
    pub fn postgres_with_schema(pool: sqlx::PgPool, schema: &str) -> Result<Self, ValidationError> {
        Ok(Self::from_postgres_store(
            courier_postgres::PgStore::with_schema(pool, schema)?,
        ))
    }

    /// Opens a pool to `url` (JIT off, [`POSTGRES_CONNECTIONS`] connections) and wraps it.
    pub async fn connect_postgres(url: &str) -> Result<Self, StoreError> {
        Ok(Self::postgres(
            courier_postgres::connect(url, POSTGRES_CONNECTIONS).await?,
        ))
    }

    /// As [`Courier::connect_postgres`], in `schema` (`[a-z_][a-z0-9_]{0,62}`;
    /// a bad name is [`StoreError::Invalid`], refused before connecting).
    pub async fn connect_postgres_with_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        courier_postgres::validate_schema(schema)?;
        let pool = courier_postgres::connect(url, POSTGRES_CONNECTIONS).await?;
        Ok(Self::postgres_with_schema(pool, schema)?)
    }

    /// Courier over an existing PostgreSQL store.
    pub fn from_postgres_store(store: courier_postgres::PgStore) -> Self {
        Self::with_wake(
            store,
            |store, stop| {
                let (sender, receiver) = watch::channel(0);
                courier_postgres::PgNotifier::spawn(store, sender, stop);
                receiver
            },
            (POSTGRES_CONCURRENCY, POSTGRES_BATCH_SIZE),
        )
    }
}

#[cfg(feature = "sqlite")]
impl Courier<courier_sqlite::SqliteStore> {
    /// Courier on SQLite over `pool`.
    pub fn sqlite(pool: sqlx::SqlitePool) -> Self {
        Self::from_sqlite_store(courier_sqlite::SqliteStore::new(pool))
    }

    /// Opens (creating it if needed) the SQLite database at `path`, in WAL
    /// mode, with [`SQLITE_CONNECTIONS`] connections.
    pub async fn connect_sqlite(path: &str) -> Result<Self, StoreError> {
        Ok(Self::sqlite(
            courier_sqlite::connect(path, SQLITE_CONNECTIONS).await?,
        ))
    }

    /// Courier over an existing SQLite store.
    pub fn from_sqlite_store(store: courier_sqlite::SqliteStore) -> Self {
        Self::with_wake(
            store,
            |store, _stop| store.wakeups(),
            (SQLITE_CONCURRENCY, SQLITE_BATCH_SIZE),
        )
    }
}

impl<S: OutboxStore + DeadLetterStore> Courier<S> {
    // Only the backends' constructors call it: a build with neither
    // `postgres` nor `sqlite` has no way to make a `Courier`.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    fn with_wake(store: S, starter: WakeStarter<S>, worker_defaults: (usize, usize)) -> Self {
        Self {
            store,
            wake: Arc::new(Wake {
                starter,
                worker_defaults,
                receiver: OnceLock::new(),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// The store, for backend-specific work (its pool, schema, ...).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Creates or upgrades Courier's tables; safe to run from many processes at once.
    ///
    /// Refuses, applying nothing, a database where an applied migration's
    /// recorded checksum (the SHA-256 of its SQL as shipped) differs from
    /// this build's ([`StoreError::MigrationChanged`], naming it) or that a
    /// newer build migrated ([`StoreError::SchemaTooNew`]). Migrations an
    /// older build applied without a checksum get this build's recorded
    /// (trust on first use). The backends' `migration_status` lists where
    /// each migration stands without changing anything.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.store.migrate().await
    }

    /// Enqueues one message on the caller's connection, inside their
    /// transaction: it exists if and only if that transaction commits.
    ///
    /// With the `otel` feature, a message without a `traceparent` header of
    /// its own gets the current span's trace context (`traceparent`,
    /// `tracestate`; see [`trace_context`]), so its deliveries continue the
    /// producer's trace. Without a `tracing-opentelemetry` layer there is no
    /// context and nothing is added.
    pub async fn enqueue(
        &self,
        conn: &mut S::Connection,
        message: &NewMessage,
    ) -> Result<EnqueueOutcome, StoreError> {
        let messages = trace_context::with_current_context(std::slice::from_ref(message));
        let mut outcomes = self.store.enqueue_batch(conn, &messages).await?;
        outcomes
            .pop()
            .ok_or_else(|| StoreError::Corrupt("enqueue returned no outcome".into()))
    }

    /// Enqueues many messages in one round trip on the caller's connection,
    /// each with the current trace context as [`Courier::enqueue`] adds it.
    pub async fn enqueue_batch(
        &self,
        conn: &mut S::Connection,
        messages: &[NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let messages = trace_context::with_current_context(messages);
        self.store.enqueue_batch(conn, &messages).await
    }

    /// Enqueues messages in a transaction of Courier's own (no application
    /// data with them), each with the current trace context as
    /// [`Courier::enqueue`] adds it.
    pub async fn publish(
        &self,
        messages: &[NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let messages = trace_context::with_current_context(messages);
        self.store.publish_batch(&messages).await
    }

    /// Starts configuring a worker for `subscription`, woken when messages
    /// arrive, with the backend's default concurrency and batch size
    /// ([`POSTGRES_CONCURRENCY`] / [`POSTGRES_BATCH_SIZE`] on PostgreSQL,
    /// [`SQLITE_CONCURRENCY`] / [`SQLITE_BATCH_SIZE`] on SQLite).
    /// Must be called inside a tokio runtime.
    pub fn worker(&self, subscription: impl Into<String>) -> WorkerBuilder<S> {
        let receiver = self
            .wake
            .receiver
            .get_or_init(|| (self.wake.starter)(&self.store, self.wake.stop.clone()))
            .clone();
        let (concurrency, batch_size) = self.wake.worker_defaults;
        WorkerBuilder::new(self.store.clone(), subscription)
            .wake_on(receiver)
            .concurrency(concurrency)
            .batch_size(batch_size)
    }

    /// The rescuer and pruner, for a process that runs maintenance without workers.
    pub fn maintenance(
        &self,
        config: MaintenanceConfig,
    ) -> Result<Maintenance<S>, ValidationError> {
        Maintenance::new(self.store.clone(), config)
    }

    /// Lists dead letters matching `filter`, `limit` at a time, after the cursor `after`.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> Result<DeadLetterPage, StoreError> {
        self.store.list_dead_letters(filter, after, limit).await
    }

    /// One dead letter with its error history.
    pub async fn dead_letter(&self, delivery_id: i64) -> Result<Option<DeadLetter>, StoreError> {
        self.store.get_dead_letter(delivery_id).await
    }

    /// Makes dead letters deliverable again with attempts reset; returns how many.
    pub async fn retry_dead_letters(&self, delivery_ids: &[i64]) -> Result<u64, StoreError> {
        self.store.retry_dead_letters(delivery_ids).await
    }

    /// Dead letters matching `filter` grouped by the fingerprint of their
    /// last failure, largest first (see
    /// [`DeadLetterStore::dead_letter_groups`]).
    pub async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetterGroup>, StoreError> {
        self.store.dead_letter_groups(filter, limit).await
    }

    /// How many dead letters match `filter`: what a retry or discard by it
    /// would act on now.
    pub async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.store.count_dead_letters(filter).await
    }

    /// Retries every dead letter matching `filter`; returns how many.
    pub async fn retry_dead_letters_matching(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        self.store.retry_dead_letters_matching(filter).await
    }

    /// Discards dead letters for good; returns how many.
    pub async fn discard_dead_letters(&self, delivery_ids: &[i64]) -> Result<u64, StoreError> {
        self.store.discard_dead_letters(delivery_ids).await
    }

    /// Discards every dead letter matching `filter`; returns how many.
    pub async fn discard_dead_letters_matching(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        self.store.discard_dead_letters_matching(filter).await
    }
}
