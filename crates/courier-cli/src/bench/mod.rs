//! `courier bench`: Courier's throughput, latency and memory on this machine,
//! next to hand-written SQL doing the same work.
//!
//! Scenarios (each on a freshly migrated database):
//! - **enqueue**: one message per transaction from 1 and from 16 producers,
//!   and batches of 1,000 per transaction, each for a fixed time, with one
//!   subscription registered so every message fans out to one delivery;
//! - **drain**: N pre-loaded messages handled by one worker with default
//!   settings: a no-op handler; the exactly-once path (a transactional
//!   handler writing a row, with the receipt); two subscriptions on one topic;
//!   1,000 ordering keys; 50 tenants;
//! - **latency**: a steady trickle into an idle worker, commit → handler
//!   start, woken by NOTIFY (or SQLite's in-process signal) and by polling only.
//!
//! With `baseline`, [`baseline`]'s SQL runs the same enqueue and drain work
//! first and each result carries its ratio to it. Memory is the bench
//! process's peak resident set (`VmHWM`), reset before each drain: the workers
//! run in this process, so it is the workers' peak plus the bench's own.
//!
//! Nothing here asserts on timing; a failed run is one whose work was not
//! all done (a delivery left over, an effect missing), reported as an error.

mod baseline;
mod drain;
mod enqueue;
mod fixture;
mod latency;
mod measure;
mod report;

use std::time::Duration;

pub use fixture::DEFAULT_SQLITE_PATH;
pub use measure::Percentiles;
pub use report::{BarCheck, Machine, Measurement, Report};

use crate::database::Database;
use fixture::{Fixture, PgBench, SqliteBench};

/// Messages the drain scenarios pre-load unless told otherwise.
pub const DEFAULT_MESSAGES: u64 = 100_000;
/// Messages the drain scenarios pre-load in a quick run.
pub const QUICK_MESSAGES: u64 = 2_000;
/// Messages per second the latency scenario trickles in, by default.
pub const DEFAULT_RATE: u32 = 200;
/// The prefix of the PostgreSQL schema a bench creates (and drops) unless told otherwise.
pub const SCHEMA_PREFIX: &str = "courier_bench_";

/// Which scenarios to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Producers enqueueing.
    Enqueue,
    /// Workers draining a backlog.
    Drain,
    /// Commit → handler start on idle workers.
    Latency,
    /// All of the above.
    All,
}

impl Scenario {
    fn includes(self, other: Scenario) -> bool {
        self == Scenario::All || self == other
    }
}

/// What `courier bench` was asked to do.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The database to measure.
    pub database: Database,
    /// The PostgreSQL schema to create, use and drop (it must not exist);
    /// `courier_bench_<random>` if `None`.
    pub schema: Option<String>,
    /// Which scenarios.
    pub scenario: Scenario,
    /// Messages the drain scenarios pre-load; [`DEFAULT_MESSAGES`] (or
    /// [`QUICK_MESSAGES`] when quick) if `None`.
    pub messages: Option<u64>,
    /// Seconds instead of minutes: small N, short runs (a CI smoke run).
    pub quick: bool,
    /// Also run the hand-written SQL baseline and report ratios to it.
    pub baseline: bool,
    /// Messages per second in the latency scenario.
    pub rate: u32,
    /// Draw progress bars on stderr (only where stderr is a terminal).
    pub progress: bool,
}

/// Sizes and durations of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) messages: u64,
    pub(crate) enqueue_for: Duration,
    pub(crate) latency_for: Duration,
    pub(crate) rate: u32,
    pub(crate) progress: bool,
    pub(crate) baseline: bool,
}

impl Plan {
    fn new(options: &BenchOptions) -> anyhow::Result<Self> {
        let messages = options.messages.unwrap_or(if options.quick {
            QUICK_MESSAGES
        } else {
            DEFAULT_MESSAGES
        });
        if messages == 0 || messages > 10_000_000 {
            anyhow::bail!("invalid messages: must be between 1 and 10000000, got {messages}");
        }
        if options.rate == 0 || options.rate > 10_000 {
            anyhow::bail!(
                "invalid rate: must be between 1 and 10000, got {}",
                options.rate
            );
        }
        Ok(Self {
            messages,
            enqueue_for: if options.quick {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(3)
            },
            latency_for: if options.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(10)
            },
            rate: options.rate,
            progress: options.progress,
            baseline: options.baseline,
        })
    }
}

/// A count over a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    pub(crate) count: u64,
    pub(crate) elapsed: Duration,
}

impl Throughput {
    pub(crate) fn new(count: u64, elapsed: Duration) -> Self {
        Self { count, elapsed }
    }

    pub(crate) fn per_second(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.count as f64 / seconds
        } else {
            0.0
        }
    }
}

/// A fresh bench schema name: the prefix and 8 random hex digits.
pub fn random_schema() -> String {
    format!("{SCHEMA_PREFIX}{:08x}", fastrand::u32(..))
}

/// Runs the chosen scenarios and returns the report. The bench schema or
/// file is removed at the end, on error and on Ctrl-C too.
pub async fn run(options: &BenchOptions) -> anyhow::Result<Report> {
    let plan = Plan::new(options)?;
    match &options.database {
        Database::Postgres { url } => {
            let schema = options.schema.clone().unwrap_or_else(random_schema);
            crate::database::validate_schema(&schema)?;
            let fixture = PgBench::connect(url, &schema).await?;
            run_on(fixture, options.scenario, plan).await
        }
        Database::Sqlite { path } => {
            if options.schema.is_some() {
                anyhow::bail!("invalid schema: schemas are for PostgreSQL; SQLite uses a file");
            }
            run_on(SqliteBench::new(path)?, options.scenario, plan).await
        }
    }
}

async fn run_on<F: Fixture>(
    mut fixture: F,
    scenario: Scenario,
    plan: Plan,
) -> anyhow::Result<Report> {
    let outcome = tokio::select! {
        outcome = scenarios(&mut fixture, scenario, plan) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let cleaned = fixture.cleanup().await;
    let report = outcome?;
    cleaned?;
    Ok(report)
}

async fn scenarios<F: Fixture>(
    fixture: &mut F,
    scenario: Scenario,
    plan: Plan,
) -> anyhow::Result<Report> {
    drop(fixture.fresh().await?);
    let database = fixture.describe().await?;
    let mut measurements = Vec::new();
    if scenario.includes(Scenario::Enqueue) {
        enqueue::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Drain) {
        drain::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Latency) {
        latency::run(fixture, &plan, &mut measurements).await?;
    }
    Ok(Report::new(database, &plan, measurements))
}
