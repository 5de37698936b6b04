//! A fresh database per measurement: the PostgreSQL bench schema, dropped and
//! recreated before each one, or a new SQLite file per measurement
//! (`<path>.<n>`, the previous one closed and deleted); removed at the end.
//!
//! The PostgreSQL bench works only inside its own schema (a name that did not
//! exist when the run began) and drops it at the end, on error too; the SQLite
//! bench refuses to delete a file it did not create, except its default file
//! (and that file's numbered siblings).
//!
//! Why a new SQLite file each time: reusing one name (delete, recreate)
//! made a long run fail on the new file's first statement with `(code: 522)
//! disk I/O error` (a short read). SQLite shares locks and the WAL index
//! (`-shm`) between the connections of one process by file, so anything of
//! the old database still open when its files were deleted (a connection
//! still being torn down after its pool closed is the likely one) could meet
//! the new file. Each measurement's pool is closed (waiting for every
//! connection) before its files are removed, and the next one never reuses
//! a name.

use std::sync::Arc;

use anyhow::Context;
use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{Courier, DeadLetterStore, HandlerError, Message, OutboxStore, TransactionalHandler};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, SqliteConnection};

use super::baseline::Baseline;
use super::measure::Counter;

/// The payload every bench message carries: its position in the run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct BenchPayload {
    pub(crate) seq: u64,
}

/// Connections in the bench's PostgreSQL pool: 16 producers, plus the
/// workers' claims, settles, heartbeats and transactional handlers.
const PG_POOL_SIZE: u32 = 24;

/// What the scenarios need from a backend.
pub(crate) trait Fixture {
    /// The store.
    type Store: OutboxStore + DeadLetterStore;
    /// A transactional handler that inserts one row per message into `bench_effects`.
    type Effects: TransactionalHandler<
        <Self::Store as OutboxStore>::Connection,
        Payload = BenchPayload,
    >;

    /// Drops everything from the previous measurement and returns Courier on
    /// a freshly migrated database, with the `bench_effects` and baseline tables.
    async fn fresh(&mut self) -> anyhow::Result<Courier<Self::Store>>;

    /// The exactly-once handler, counting its calls on `counter`; with
    /// `fail_every` n, messages whose sequence number is a multiple of n fail
    /// permanently (their effect is never written).
    fn effects(&self, counter: Arc<Counter>, fail_every: Option<u64>) -> Self::Effects;

    /// Runs one statement (setup, statistics, checks) and returns the first
    /// column of the first row as an integer, if any.
    async fn scalar(&self, sql: &str) -> anyhow::Result<Option<i64>>;

    /// Refreshes the planner's statistics after a bulk load (as autovacuum
    /// would soon do on a live system).
    async fn analyze(&self) -> anyhow::Result<()>;

    /// The hand-written SQL to compare with, on the current database.
    fn baseline(&self) -> anyhow::Result<Baseline>;

    /// Deliveries not yet completed (any state), in the current database.
    async fn deliveries_left(&self) -> anyhow::Result<i64> {
        Ok(self
            .scalar("SELECT count(*) FROM {schema}deliveries")
            .await?
            .unwrap_or(0))
    }

    /// Deliveries neither completed nor dead-lettered, in the current database.
    async fn deliveries_open(&self) -> anyhow::Result<i64> {
        Ok(self
            .scalar("SELECT count(*) FROM {schema}deliveries WHERE state <> 'dead'")
            .await?
            .unwrap_or(0))
    }

    /// Rows the exactly-once handler wrote.
    async fn effects_written(&self) -> anyhow::Result<i64> {
        Ok(self
            .scalar("SELECT count(*) FROM {schema}bench_effects")
            .await?
            .unwrap_or(0))
    }

    /// The database's name, version and settings that matter here.
    async fn describe(&self) -> anyhow::Result<Vec<(String, String)>>;

    /// The concurrency and batch size `Courier::worker` gives a worker on this backend.
    fn worker_defaults(&self) -> (usize, usize);

    /// The PostgreSQL pool and bench schema, for the PostgreSQL-only
    /// scenarios; `None` on SQLite.
    fn postgres(&self) -> Option<(&PgPool, &str)>;

    /// The PostgreSQL URL the bench connected to, for processes of its own
    /// to connect with; `None` on SQLite.
    fn postgres_url(&self) -> Option<&str>;

    /// Removes the bench schema or file.
    async fn cleanup(self) -> anyhow::Result<()>;
}

/// The bench on PostgreSQL, in a schema of its own.
pub(crate) struct PgBench {
    url: String,
    pool: PgPool,
    schema: String,
    created: bool,
}

impl PgBench {
    /// Connects, and checks that `schema` does not exist yet (so dropping it
    /// at the end cannot remove anyone else's tables).
    pub(crate) async fn connect(url: &str, schema: &str) -> anyhow::Result<Self> {
        courier::postgres::validate_schema(schema)?;
        let pool = courier::postgres::connect(url, PG_POOL_SIZE)
            .await
            .context("connecting to PostgreSQL")?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&pool)
                .await
                .context("looking for the bench schema")?;
        if exists {
            anyhow::bail!(
                "invalid schema: {schema:?} already exists; the bench only works in a schema it creates and drops"
            );
        }
        Ok(Self {
            url: url.to_owned(),
            pool,
            schema: schema.to_owned(),
            created: false,
        })
    }

    fn render(&self, sql: &str) -> String {
        sql.replace("{schema}", &format!("{}.", self.schema))
    }

    async fn drop_schema(&self) -> anyhow::Result<()> {
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .execute(&self.pool)
            .await
            .with_context(|| format!("dropping schema {}", self.schema))?;
        Ok(())
    }
}

impl Fixture for PgBench {
    type Store = PgStore;
    type Effects = PgEffects;

    async fn fresh(&mut self) -> anyhow::Result<Courier<PgStore>> {
        if self.created {
            self.drop_schema().await?;
        }
        self.created = true;
        let courier = Courier::postgres_with_schema(self.pool.clone(), &self.schema)?;
        courier
            .migrate()
            .await
            .context("migrating the bench schema")?;
        self.scalar(
            "CREATE TABLE {schema}bench_effects (message_id uuid PRIMARY KEY, tenant text NOT NULL)",
        )
        .await?;
        self.baseline()?.create().await?;
        Ok(courier)
    }

    fn effects(&self, counter: Arc<Counter>, fail_every: Option<u64>) -> PgEffects {
        PgEffects {
            insert: self
                .render("INSERT INTO {schema}bench_effects (message_id, tenant) VALUES ($1, $2)")
                .into(),
            counter,
            fail_every,
        }
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<Option<i64>> {
        let sql = self.render(sql);
        let row: Option<(i64,)> = match sqlx::query_as(&sql).fetch_optional(&self.pool).await {
            Ok(row) => row,
            // DDL and statements without an integer first column.
            Err(sqlx::Error::ColumnNotFound(_) | sqlx::Error::ColumnIndexOutOfBounds { .. }) => {
                None
            }
            Err(error) => return Err(error).with_context(|| format!("running {sql}")),
        };
        Ok(row.map(|(value,)| value))
    }

    async fn analyze(&self) -> anyhow::Result<()> {
        for table in ["messages", "deliveries", "receipts", "baseline_queue"] {
            sqlx::query(&format!("ANALYZE {}.{table}", self.schema))
                .execute(&self.pool)
                .await
                .with_context(|| format!("analyzing {table}"))?;
        }
        Ok(())
    }

    fn baseline(&self) -> anyhow::Result<Baseline> {
        Ok(Baseline::postgres(self.pool.clone(), &self.schema))
    }

    async fn describe(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut settings = vec![("backend".to_owned(), "postgres".to_owned())];
        for name in [
            "server_version",
            "shared_buffers",
            "synchronous_commit",
            "fsync",
            "wal_level",
            "max_connections",
            "work_mem",
            "autovacuum",
        ] {
            let value: String = sqlx::query_scalar(&format!("SHOW {name}"))
                .fetch_one(&self.pool)
                .await
                .with_context(|| format!("reading setting {name}"))?;
            settings.push((name.to_owned(), value));
        }
        settings.push(("schema".to_owned(), self.schema.clone()));
        Ok(settings)
    }

    fn worker_defaults(&self) -> (usize, usize) {
        (courier::POSTGRES_CONCURRENCY, courier::POSTGRES_BATCH_SIZE)
    }

    fn postgres(&self) -> Option<(&PgPool, &str)> {
        Some((&self.pool, &self.schema))
    }

    fn postgres_url(&self) -> Option<&str> {
        Some(&self.url)
    }

    async fn cleanup(self) -> anyhow::Result<()> {
        let dropped = self.drop_schema().await;
        self.pool.close().await;
        dropped
    }
}

/// The exactly-once handler on PostgreSQL.
pub(crate) struct PgEffects {
    insert: Arc<str>,
    counter: Arc<Counter>,
    fail_every: Option<u64>,
}

/// The failure of a message the failing exactly-once case refuses.
fn refused(counter: &Counter, fail_every: Option<u64>, seq: u64) -> Result<(), HandlerError> {
    match fail_every {
        Some(n) if seq.is_multiple_of(n.max(1)) => {
            counter.hit();
            Err(HandlerError::permanent("bench: refused"))
        }
        _ => Ok(()),
    }
}

impl TransactionalHandler<PgConnection> for PgEffects {
    type Payload = BenchPayload;

    async fn handle(
        &self,
        message: &Message<BenchPayload>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        refused(&self.counter, self.fail_every, message.payload.seq)?;
        sqlx::query(&self.insert)
            .bind(message.id)
            .bind(&message.tenant)
            .execute(conn)
            .await
            .map_err(HandlerError::retry)?;
        self.counter.hit();
        Ok(())
    }
}

/// The file the SQLite bench uses unless told otherwise: each measurement
/// gets a new `./courier-bench.db.<n>`, deleted when the next one starts and
/// at the end.
pub const DEFAULT_SQLITE_PATH: &str = "./courier-bench.db";

/// The SQLite file suffixes that belong to one database.
const SQLITE_SUFFIXES: [&str; 4] = ["", "-wal", "-shm", "-journal"];

/// The bench on SQLite files of its own.
pub(crate) struct SqliteBench {
    /// The path the user named; measurement `n` runs in `<path>.<n>`.
    path: String,
    /// Whether `path` is [`DEFAULT_SQLITE_PATH`], whose leftovers may be deleted.
    is_default: bool,
    /// Measurements started so far.
    generation: u32,
    /// The file of the current measurement, open or not.
    current_file: Option<String>,
    courier: Option<Courier<SqliteStore>>,
}

impl SqliteBench {
    /// Claims `path`: the default bench file is replaced; any other file
    /// must not exist yet, so the bench never deletes someone's database.
    pub(crate) fn new(path: &str) -> anyhow::Result<Self> {
        let is_default = std::path::Path::new(path) == std::path::Path::new(DEFAULT_SQLITE_PATH);
        if !is_default && std::path::Path::new(path).exists() {
            anyhow::bail!(
                "invalid database-url: SQLite file {path} already exists; the bench deletes its file, so give it a new path"
            );
        }
        Ok(Self {
            path: path.to_owned(),
            is_default,
            generation: 0,
            current_file: None,
            courier: None,
        })
    }

    /// Closes the current pool, waiting for every connection to close.
    async fn close(&mut self) {
        if let Some(courier) = self.courier.take() {
            courier.store().pool().close().await;
        }
    }

    /// Removes one database file and its WAL, shared-memory and journal files.
    fn remove_database(file: &str) -> anyhow::Result<()> {
        for suffix in SQLITE_SUFFIXES {
            let name = format!("{file}{suffix}");
            match std::fs::remove_file(&name) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error).with_context(|| format!("removing {name}")),
            }
        }
        Ok(())
    }

    /// Removes the current measurement's file (after [`Self::close`]), and
    /// with the default path also the file an older bench left at that name.
    fn remove_files(&mut self) -> anyhow::Result<()> {
        if let Some(file) = self.current_file.take() {
            Self::remove_database(&file)?;
        }
        if self.is_default {
            Self::remove_database(&self.path)?;
        }
        Ok(())
    }

    /// The next measurement's file name, which must not exist yet unless it
    /// is a leftover of the default bench file.
    fn next_file(&mut self) -> anyhow::Result<String> {
        self.generation += 1;
        let file = format!("{}.{}", self.path, self.generation);
        if std::path::Path::new(&file).exists() {
            if !self.is_default {
                anyhow::bail!(
                    "invalid database-url: SQLite file {file} already exists; the bench uses {}.<n> for its measurements, so give it a new path",
                    self.path
                );
            }
            Self::remove_database(&file)?;
        }
        Ok(file)
    }

    fn current(&self) -> anyhow::Result<&Courier<SqliteStore>> {
        self.courier
            .as_ref()
            .context("the SQLite bench database is not open")
    }
}

impl Fixture for SqliteBench {
    type Store = SqliteStore;
    type Effects = SqliteEffects;

    async fn fresh(&mut self) -> anyhow::Result<Courier<SqliteStore>> {
        self.close().await;
        self.remove_files()?;
        let file = self.next_file()?;
        self.current_file = Some(file.clone());
        let courier = Courier::connect_sqlite(&file)
            .await
            .with_context(|| format!("opening SQLite file {file}"))?;
        courier
            .migrate()
            .await
            .context("migrating the bench file")?;
        self.courier = Some(courier.clone());
        self.scalar(
            "CREATE TABLE bench_effects (message_id TEXT PRIMARY KEY, tenant TEXT NOT NULL) STRICT",
        )
        .await?;
        self.baseline()?.create().await?;
        Ok(courier)
    }

    fn effects(&self, counter: Arc<Counter>, fail_every: Option<u64>) -> SqliteEffects {
        SqliteEffects {
            counter,
            fail_every,
        }
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<Option<i64>> {
        let sql = sql.replace("{schema}", "");
        let pool = self.current()?.store().pool();
        let row: Option<(i64,)> = match sqlx::query_as(&sql).fetch_optional(pool).await {
            Ok(row) => row,
            Err(sqlx::Error::ColumnNotFound(_) | sqlx::Error::ColumnIndexOutOfBounds { .. }) => {
                None
            }
            Err(error) => return Err(error).with_context(|| format!("running {sql}")),
        };
        Ok(row.map(|(value,)| value))
    }

    /// Nothing: Courier never runs `ANALYZE` on SQLite and nothing else
    /// does by itself, so the bench measures the file as users have it. (With
    /// statistics, the bundled SQLite's STAT4 re-prepares every statement whose
    /// bound values meet an indexed column, which cost about 40 % of the no-op
    /// drain in `courier bench --scenario drain --messages 20000`.)
    async fn analyze(&self) -> anyhow::Result<()> {
        Ok(())
    }

    fn baseline(&self) -> anyhow::Result<Baseline> {
        Ok(Baseline::sqlite(self.current()?.store().pool().clone()))
    }

    async fn describe(&self) -> anyhow::Result<Vec<(String, String)>> {
        let pool = self.current()?.store().pool();
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(pool)
            .await
            .context("reading the SQLite version")?;
        Ok(vec![
            ("backend".to_owned(), "sqlite".to_owned()),
            ("sqlite_version".to_owned(), version),
            ("journal_mode".to_owned(), "wal".to_owned()),
            ("synchronous".to_owned(), "normal".to_owned()),
            ("file".to_owned(), format!("{}.<n>", self.path)),
        ])
    }

    fn worker_defaults(&self) -> (usize, usize) {
        (courier::SQLITE_CONCURRENCY, courier::SQLITE_BATCH_SIZE)
    }

    fn postgres(&self) -> Option<(&PgPool, &str)> {
        None
    }

    fn postgres_url(&self) -> Option<&str> {
        None
    }

    async fn cleanup(mut self) -> anyhow::Result<()> {
        self.close().await;
        self.remove_files()
    }
}

/// The exactly-once handler on SQLite.
pub(crate) struct SqliteEffects {
    counter: Arc<Counter>,
    fail_every: Option<u64>,
}

impl TransactionalHandler<SqliteConnection> for SqliteEffects {
    type Payload = BenchPayload;

    async fn handle(
        &self,
        message: &Message<BenchPayload>,
        conn: &mut SqliteConnection,
    ) -> Result<(), HandlerError> {
        refused(&self.counter, self.fail_every, message.payload.seq)?;
        sqlx::query("INSERT INTO bench_effects (message_id, tenant) VALUES (?1, ?2)")
            .bind(message.id.to_string())
            .bind(&message.tenant)
            .execute(conn)
            .await
            .map_err(HandlerError::retry)?;
        self.counter.hit();
        Ok(())
    }
}
