//! Handler workflows: seed 003 (the workflows' stream consumer) done right.
//!
//! Tenant `acme` appends events to its `events` stream. Two handler
//! workflows subscribe to it, each through a consumer group of its own, so
//! each gets every event: `notify` and `enrich`. Each event starts one run of
//! each workflow: a `workflow_runs` row keyed by the entry's correlation id
//! (`{workflow}:events:{entry id}`), written in the same transaction as the
//! subscription's receipt, so a run starts exactly once however often the
//! entry is delivered. `enrich` has a run quota (runs per second): over it,
//! the handler defers and its subscription pauses instead of spinning.
//!
//! `handler-workflows` appends the events, runs both workflows until every
//! event has its runs, and checks the counts; it exits non-zero on any
//! difference. Streams are native (in the database) or on Redis.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use courier::postgres::PgStore;
use courier::redis::RedisStreamStore;
use courier::sqlite::SqliteStore;
use courier::{
    GroupStart, HandlerError, NewStreamEntry, OutboxStore, StreamKey, StreamMessage,
    StreamReceipts, StreamStore, StreamSubscription, StreamSubscriptionConfig,
    TransactionalStreamHandler,
};
use sqlx::{PgConnection, SqliteConnection};

/// The tenant whose stream the example uses.
pub const TENANT: &str = "acme";
/// The stream the workflows subscribe to.
pub const STREAM: &str = "events";
/// The workflow without a quota.
pub const NOTIFY: &str = "notify";
/// The workflow with a run quota.
pub const ENRICH: &str = "enrich";

/// Where the streams live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Streams {
    /// In the database (`--database-url`).
    Native,
    /// On Redis (`--redis-url`); receipts and runs stay in the database.
    Redis,
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Handler workflows on Courier streams: one run per event per workflow, exactly once"
)]
struct Cli {
    /// `postgres://…` or a SQLite file path: receipts, runs (and native streams).
    #[arg(long, env = "DATABASE_URL", default_value = "handler-workflows.db")]
    database_url: String,
    /// PostgreSQL schema for Courier's tables and the example's.
    #[arg(long, default_value = "courier")]
    schema: String,
    /// Where the streams live.
    #[arg(long, value_enum, default_value = "native")]
    streams: Streams,
    /// The Redis server for `--streams redis`.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Prefix of the example's Redis keys (default: one of its own per run).
    #[arg(long)]
    key_prefix: Option<String>,
    /// Events to append.
    #[arg(long, default_value_t = 300)]
    events: usize,
    /// `enrich` runs allowed per second.
    #[arg(long, default_value_t = 200)]
    quota_per_second: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_seconds: u64,
}

/// A run quota: `per_second` runs, refilled continuously, burst of one second.
struct Quota {
    per_second: f64,
    state: Mutex<(f64, Instant)>,
}

impl Quota {
    fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            state: Mutex::new((per_second, Instant::now())),
        }
    }

    /// Takes a run, or says how long until one is free.
    fn take(&self) -> Result<(), Duration> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, at) = *state;
        let now = Instant::now();
        let tokens =
            (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.per_second);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / self.per_second))
        }
    }
}

/// Connections the example writes runs through.
trait RunConnection: Send + 'static {
    fn create_runs_table(
        &mut self,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send;
    fn start_run<'a>(
        &'a mut self,
        correlation_id: &'a str,
        workflow: &'a str,
        entry_id: String,
        input: String,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a;
    fn count_runs<'a>(
        &'a mut self,
        workflow: &'a str,
    ) -> impl std::future::Future<Output = Result<(i64, i64), sqlx::Error>> + Send + 'a;
}

impl RunConnection for PgConnection {
    async fn create_runs_table(&mut self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS workflow_runs (
               correlation_id text PRIMARY KEY,
               workflow text NOT NULL,
               entry_id text NOT NULL,
               input jsonb NOT NULL,
               started_at timestamptz NOT NULL DEFAULT now())",
        )
        .execute(self)
        .await?;
        Ok(())
    }

    async fn start_run<'a>(
        &'a mut self,
        correlation_id: &'a str,
        workflow: &'a str,
        entry_id: String,
        input: String,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO workflow_runs (correlation_id, workflow, entry_id, input) VALUES ($1, $2, $3, $4::jsonb)",
        )
        .bind(correlation_id)
        .bind(workflow)
        .bind(entry_id)
        .bind(input)
        .execute(self)
        .await?;
        Ok(())
    }

    async fn count_runs<'a>(&'a mut self, workflow: &'a str) -> Result<(i64, i64), sqlx::Error> {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT entry_id) FROM workflow_runs WHERE workflow = $1",
        )
        .bind(workflow)
        .fetch_one(self)
        .await
    }
}

impl RunConnection for SqliteConnection {
    async fn create_runs_table(&mut self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS workflow_runs (
               correlation_id TEXT PRIMARY KEY,
               workflow TEXT NOT NULL,
               entry_id TEXT NOT NULL,
               input TEXT NOT NULL,
               started_at INTEGER NOT NULL DEFAULT (unixepoch()))",
        )
        .execute(self)
        .await?;
        Ok(())
    }

    async fn start_run<'a>(
        &'a mut self,
        correlation_id: &'a str,
        workflow: &'a str,
        entry_id: String,
        input: String,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO workflow_runs (correlation_id, workflow, entry_id, input) VALUES (?1, ?2, ?3, ?4)")
            .bind(correlation_id)
            .bind(workflow)
            .bind(entry_id)
            .bind(input)
            .execute(self)
            .await?;
        Ok(())
    }

    async fn count_runs<'a>(&'a mut self, workflow: &'a str) -> Result<(i64, i64), sqlx::Error> {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT entry_id) FROM workflow_runs WHERE workflow = ?1",
        )
        .bind(workflow)
        .fetch_one(self)
        .await
    }
}

/// A handler workflow: each event starts one run, in the receipt's
/// transaction; with a quota, a run over it defers the event.
struct Workflow {
    name: &'static str,
    quota: Option<Arc<Quota>>,
}

impl<C: RunConnection> TransactionalStreamHandler<C> for Workflow {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &StreamMessage<serde_json::Value>,
        conn: &mut C,
    ) -> Result<(), HandlerError> {
        if let Some(quota) = &self.quota {
            if let Err(wait) = quota.take() {
                return Err(HandlerError::snooze(
                    wait,
                    format!("{} run quota exhausted", self.name),
                ));
            }
        }
        conn.start_run(
            &message.correlation_id,
            self.name,
            message.id.to_string(),
            message.payload.to_string(),
        )
        .await?;
        Ok(())
    }
}

/// What one run of the example counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Events appended.
    pub events: usize,
    /// Runs per workflow: (runs, distinct entries).
    pub runs: Vec<(&'static str, i64, i64)>,
}

async fn run_with<S, R>(
    streams: S,
    receipts: R,
    cli: &Cli,
    conn: &mut R::Connection,
) -> anyhow::Result<Report>
where
    S: StreamStore,
    R: StreamReceipts,
    R::Connection: RunConnection,
{
    conn.create_runs_table()
        .await
        .context("creating workflow_runs")?;
    let key = StreamKey::new(TENANT, STREAM)?;
    let quota = Arc::new(Quota::new(cli.quota_per_second));
    let mut running = Vec::new();
    for (name, quota) in [(NOTIFY, None), (ENRICH, Some(quota))] {
        let mut config = StreamSubscriptionConfig::new(name, key.clone())?;
        config.consumer = format!("{name}-1");
        config.start = GroupStart::End;
        config.block = Duration::from_millis(500);
        config.defer_min = Duration::from_millis(50);
        config.defer_max = Duration::from_millis(500);
        let subscription = StreamSubscription::transactional(
            streams.clone(),
            receipts.clone(),
            config,
            Workflow { name, quota },
        )?;
        // The groups exist before the first event: each workflow gets all.
        subscription.ensure_group().await?;
        running.push(subscription.start());
    }

    let started = Instant::now();
    for chunk in (0..cli.events).collect::<Vec<_>>().chunks(100) {
        let entries: Vec<_> = chunk
            .iter()
            .map(|n| NewStreamEntry::new(serde_json::json!({ "event": n, "kind": "order.placed" })))
            .collect();
        streams.append(&key, &entries).await?;
    }
    let deadline = started + Duration::from_secs(cli.timeout_seconds);
    let expected = i64::try_from(cli.events)?;
    let runs = loop {
        let mut runs = Vec::new();
        for name in [NOTIFY, ENRICH] {
            let (total, distinct) = conn.count_runs(name).await?;
            runs.push((name, total, distinct));
        }
        if runs.iter().all(|(_, total, _)| *total >= expected) || Instant::now() > deadline {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for subscription in running {
        subscription.shutdown().await;
    }
    Ok(Report {
        events: cli.events,
        runs,
    })
}

async fn run(cli: &Cli) -> anyhow::Result<Report> {
    let prefix = cli.key_prefix.clone().unwrap_or_else(|| {
        format!(
            "handler-workflows:{}:",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        )
    });
    if cli.database_url.starts_with("postgres://") || cli.database_url.starts_with("postgresql://")
    {
        // Courier's tables and the example's in one schema: the handlers'
        // connections come from this pool, so its search_path is the schema.
        courier::postgres::validate_schema(&cli.schema)?;
        // Courier's options (JIT off), and the example's own schema.
        let options = courier::postgres::connect_options(&cli.database_url)?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options.options([("search_path", cli.schema.as_str())]))
            .await?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", cli.schema))
            .execute(&pool)
            .await?;
        let store = PgStore::with_schema(pool.clone(), &cli.schema)?;
        store.migrate().await?;
        let mut conn = pool.acquire().await?;
        match cli.streams {
            Streams::Native => run_with(store.clone(), store, cli, &mut conn).await,
            Streams::Redis => {
                let redis = RedisStreamStore::connect(&cli.redis_url, &prefix).await?;
                run_with(redis, store, cli, &mut conn).await
            }
        }
    } else {
        let pool = courier::sqlite::connect(&cli.database_url, 8).await?;
        let store = SqliteStore::new(pool.clone());
        store.migrate().await?;
        let mut conn = pool.acquire().await?;
        match cli.streams {
            Streams::Native => run_with(store.clone(), store, cli, &mut conn).await,
            Streams::Redis => {
                let redis = RedisStreamStore::connect(&cli.redis_url, &prefix).await?;
                run_with(redis, store, cli, &mut conn).await
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let report = run(&cli).await?;
    let expected = i64::try_from(report.events)?;
    for (name, total, distinct) in &report.runs {
        println!("{name}: {total} runs for {distinct} events (expected {expected})");
    }
    if report
        .runs
        .iter()
        .any(|(_, total, distinct)| *total != expected || *distinct != expected)
    {
        bail!("run counts differ from the events appended");
    }
    println!("ok: every event started exactly one run of each workflow");
    Ok(())
}
