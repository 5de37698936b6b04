//! Courier's SQLite store: the embedded default.
//!
//! [`SqliteStore`] keeps the outbox in one SQLite file: the `messages` table
//! producers insert into (a row trigger fans each message out to the
//! `deliveries` of every matching subscription, so a plain SQL `INSERT` works
//! too), `deliveries` that workers claim under leases, `receipts`, and the
//! subscriptions. It implements the same [`OutboxStore`] and
//! [`DeadLetterStore`](courier_core::DeadLetterStore) and
//! [`AdminStore`](courier_core::AdminStore) contract as the PostgreSQL store
//! (a paused subscription's claims take nothing until it is resumed); every
//! query lives in `queries/*.sql` and every lease check uses the database clock.
//! It is also a native [`StreamStore`](courier_core::StreamStore): streams and
//! consumer groups in four tables, with Redis Streams' semantics (see the
//! `streams` module).
//!
//! # One writer
//!
//! SQLite allows one writer at a time. In WAL mode a transaction that starts
//! by reading and later writes can fail with `SQLITE_BUSY` when another writer
//! committed in between, and no busy timeout can fix that. So every
//! multi-statement write transaction of this store starts with
//! `BEGIN IMMEDIATE` (taking the write lock up front), and so should a
//! producer's: [`SqliteStore::begin`] opens one. Single-statement writes run
//! in autocommit. Claims therefore serialise instead of skipping each other's
//! locked rows as on PostgreSQL, and a transactional handler holds the write
//! lock while it runs: keep such handlers short.
//!
//! # Wake-ups
//!
//! SQLite has no LISTEN/NOTIFY. The store bumps an in-process counter
//! ([`SqliteStore::wakeups`]) after it enqueues; producers in other processes
//! (or plain SQL inserts) are found by the workers' polling. Stream appends
//! bump a counter of their own, which wakes this process's blocked reads at
//! once; other processes' appends are found within [`STREAM_POLL_INTERVAL`].

mod admin;
mod dead_letters;
mod error;
mod migrate;
mod outbox;
mod queries;
mod rows;
mod stream_receipts;
mod streams;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{EnqueueOutcome, NewMessage, OutboxStore, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::sync::watch;

pub use admin::MAX_MESSAGE_PAGE;
pub use dead_letters::MAX_DEAD_LETTER_PAGE;
pub use migrate::{MIGRATIONS, SCHEMA_VERSION};
pub use outbox::MAX_TENANTS_PER_TURN;
pub use streams::STREAM_POLL_INTERVAL;

use error::map;

/// How long a connection waits for the write lock before reporting a
/// (transient) busy error.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long acquiring a connection from the pool may take.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Courier's outbox and streams in one SQLite file. Cheap to clone; clones
/// share the pool and the wake-up counters.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    wake: watch::Sender<u64>,
    /// Bumped after every committed stream append, for blocked reads.
    stream_wake: watch::Sender<u64>,
    /// Courier's own writes in this process take turns here, first come first
    /// served, before asking SQLite for its single write lock. Left to
    /// SQLite's busy handler (which sleeps and polls), a claim loop that keeps
    /// re-taking the lock starves settles and heartbeats until their leases
    /// expire. Other processes still meet at SQLite's lock (busy timeout).
    writes: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

/// Opens (creating it if missing) the SQLite database at `path_or_url` — a file
/// path, or a `sqlite:` URL — as a pool suited to Courier: WAL journal (readers
/// never block the writer), `synchronous = NORMAL` (durable across process
/// crashes; a power loss may drop the last commits, never corrupt the file),
/// foreign keys on, and a [`BUSY_TIMEOUT`] wait for the write lock.
///
/// An in-memory database (`sqlite::memory:`) is private to each connection, so
/// use it only with `max_connections = 1`; Courier's tests use temporary files.
pub async fn connect(path_or_url: &str, max_connections: u32) -> Result<SqlitePool, StoreError> {
    let options = if path_or_url.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(path_or_url).map_err(map)?
    } else {
        SqliteConnectOptions::new().filename(path_or_url)
    };
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT);
    SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(map)
}

impl SqliteStore {
    /// A store over `pool` (see [`connect`] for the options it should have).
    pub fn new(pool: SqlitePool) -> Self {
        let (wake, _) = watch::channel(0);
        let (stream_wake, _) = watch::channel(0);
        Self {
            inner: Arc::new(Inner {
                pool,
                wake,
                stream_wake,
                writes: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Waits for this process's turn to write (see `Inner::writes`), at most
    /// [`BUSY_TIMEOUT`]: a write attempted from inside another write of this
    /// store (say, a transactional handler publishing through the pool instead
    /// of its own connection) fails as busy instead of waiting forever.
    pub(crate) async fn write_turn(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, StoreError> {
        tokio::time::timeout(BUSY_TIMEOUT, self.inner.writes.lock())
            .await
            .map_err(|_| StoreError::Database {
                source: "timed out waiting for this process's turn to write to SQLite".into(),
                transient: true,
            })
    }

    /// The pool the store runs its own work on.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// A receiver whose value changes each time this store (or a clone of it)
    /// enqueues messages, so idle workers can wake at once instead of waiting
    /// for their next poll. A bump from [`OutboxStore::enqueue_batch`] may
    /// arrive before the producer's transaction commits: a worker that finds
    /// nothing then finds it at its next poll.
    pub fn wakeups(&self) -> watch::Receiver<u64> {
        self.inner.wake.subscribe()
    }

    /// The schema version in the database (0 before the first migration).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        migrate::current(&self.inner.pool).await
    }

    /// Every migration this build ships and every one the file records,
    /// oldest first, with its state ([`courier_core::MigrationStatus`]):
    /// applied, pending, changed (its recorded checksum is not this
    /// build's: [`courier_core::OutboxStore::migrate`] would refuse), or
    /// unknown (applied by a newer build). Reads only and creates nothing in
    /// the file: one never migrated lists every migration pending. A
    /// migration an older build applied without recording a checksum reads
    /// applied with none recorded; the next migration run records this
    /// build's (trust on first use).
    pub async fn migration_status(&self) -> Result<Vec<courier_core::MigrationStatus>, StoreError> {
        migrate::status(&self.inner.pool).await
    }

    /// Applies the migrations up to schema `version` only (a later one is
    /// left for [`courier_core::OutboxStore::migrate`]): for upgrade tests
    /// and for staging an upgrade. This build's queries expect
    /// [`SCHEMA_VERSION`]; run nothing else on a schema held back.
    pub async fn migrate_to(&self, version: i64) -> Result<(), StoreError> {
        migrate::run_to(&self.inner.pool, version).await
    }

    /// Opens a write transaction with `BEGIN IMMEDIATE` on the store's pool:
    /// the way to start a producer's transaction that enqueues, because a
    /// deferred transaction that reads before it writes can fail with a busy
    /// error that waiting cannot cure.
    pub async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map)
    }

    /// Enqueues one message on the caller's connection (inside their transaction).
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        message: &NewMessage,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut outcomes = self
            .enqueue_batch(conn, std::slice::from_ref(message))
            .await?;
        outcomes
            .pop()
            .ok_or_else(|| StoreError::Corrupt("enqueue returned no outcome".into()))
    }

    fn wake(&self) {
        self.inner
            .wake
            .send_modify(|count| *count = count.wrapping_add(1));
    }
}

/// The longest duration the store writes, a thousand years: SQLite integer
/// arithmetic that overflows turns into a float, which the STRICT tables refuse.
const MAX_MILLIS: i64 = 1000 * 366 * 24 * 3600 * 1000;

/// A duration in milliseconds, saturating at [`MAX_MILLIS`].
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).map_or(MAX_MILLIS, |ms| ms.min(MAX_MILLIS))
}
