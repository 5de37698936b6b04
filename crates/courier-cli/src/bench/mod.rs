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
//!   1,000 ordering keys; 50 tenants; and (PostgreSQL) the no-op drain by 1,
//!   2 and 4 worker processes;
//! - **latency**: a steady trickle into an idle worker, commit → handler
//!   start, woken by NOTIFY (or SQLite's in-process signal) and by polling only;
//! - **fairness**: one tenant's backlog drained alone, then again while 50
//!   small tenants trickle 1 message/s each: the small tenants' commit →
//!   handler start and the big tenant's rate against its solo rate;
//! - **held-xmin** (PostgreSQL): a worker kept busy by a topped-up backlog,
//!   before and while another connection holds a `REPEATABLE READ` snapshot:
//!   throughput, dead tuples and a probe claim's round trip;
//! - **explain** (PostgreSQL, not in `all`): `EXPLAIN (ANALYZE, BUFFERS)` of
//!   the store's hot queries, exactly as it renders them, on a large table.
//!
//! With `rounds` above 1 the enqueue and drain scenarios run that many times
//! in turn (every case of both once per round, so a drifting machine touches
//! every case alike); each case is reported as the median of its rounds, its ratio
//! as the median of the rounds' ratios to their own baselines, and every
//! round's rate is listed beside it. The other scenarios run once.
//!
//! Drain, fairness and held-xmin workers take `concurrency` and `batch_size`
//! if given, else the backend's defaults (what `Courier::worker` applies).
//!
//! With `baseline`, [`baseline`]'s SQL runs the same enqueue and drain work
//! first and each result carries its ratio to it. Memory is the bench
//! process's peak resident set (`VmHWM`), reset before each drain: the workers
//! run in this process, so it is the workers' peak plus the bench's own.
//!
//! The worker-process drains (`drain.processes_*`, [`processes`]) start N
//! children of the `courier` executable (`courier bench-worker`, hidden),
//! each one worker with the same settings on the same database, and time
//! them from `go` until no delivery is open; they measure what the claim
//! and settle queries sustain from several processes at once, without the
//! bench process's own scheduling in the way. Their memory is not measured.
//! They need [`BenchOptions::worker_program`], so `cargo bench` skips them.
//!
//! Nothing here asserts on timing; a failed run is one whose work was not
//! all done (a delivery left over, an effect missing), reported as an error.

mod baseline;
mod drain;
mod enqueue;
mod explain;
mod fairness;
mod fixture;
mod held_xmin;
mod latency;
mod measure;
mod processes;
mod relays;
mod report;
mod streams;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use fixture::DEFAULT_SQLITE_PATH;
pub use measure::Percentiles;
pub use processes::{worker_process, WorkerProcessOptions};
pub use report::{BarCheck, ExplainedQuery, IndexInfo, Machine, Measurement, Report, Settings};

use crate::database::Database;
use fixture::{Fixture, PgBench, SqliteBench};

/// Messages the drain scenarios pre-load unless told otherwise.
pub const DEFAULT_MESSAGES: u64 = 100_000;
/// Messages the drain scenarios pre-load in a quick run.
pub const QUICK_MESSAGES: u64 = 2_000;
/// The big tenant's backlog in the fairness scenario unless told otherwise.
pub const FAIRNESS_MESSAGES: u64 = 200_000;
/// The big tenant's backlog in a quick fairness run.
pub const QUICK_FAIRNESS_MESSAGES: u64 = 5_000;
/// Deliveries the explain scenario loads unless told otherwise.
pub const EXPLAIN_MESSAGES: u64 = 1_000_000;
/// Deliveries the explain scenario loads in a quick run.
pub const QUICK_EXPLAIN_MESSAGES: u64 = 10_000;
/// Seconds the held-xmin scenario holds its snapshot open, by default.
pub const DEFAULT_HOLD_SECONDS: u64 = 180;
/// Seconds the held-xmin scenario holds its snapshot open in a quick run.
pub const QUICK_HOLD_SECONDS: u64 = 5;
/// The most handlers or claimed rows `--concurrency` and `--batch-size` accept.
pub const MAX_WORKER_SETTING: usize = 10_000;
/// Messages per second the latency scenario trickles in, by default.
pub const DEFAULT_RATE: u32 = 200;
/// The most rounds `--rounds` accepts.
pub const MAX_ROUNDS: u32 = 20;
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
    /// A big tenant's backlog while small tenants trickle.
    Fairness,
    /// Draining while another transaction holds back the xmin horizon (PostgreSQL).
    HeldXmin,
    /// `EXPLAIN (ANALYZE, BUFFERS)` of the hot queries (PostgreSQL; not part of `All`).
    Explain,
    /// Streams: appends, group reads, a stream subscription, latency and
    /// claims, natively and (with a Redis URL) on Redis beside raw commands
    /// (not part of `All`).
    Streams,
    /// Relays: a subscription forwarding a backlog to a native stream and
    /// (with their URLs) to Redis and NATS JetStream, beside raw writes (not
    /// part of `All`).
    Relays,
    /// Every scenario above except `Explain`, `Streams` and `Relays`.
    All,
}

impl Scenario {
    fn includes(self, other: Scenario) -> bool {
        self == other
            || (self == Scenario::All
                && !matches!(
                    other,
                    Scenario::Explain | Scenario::Streams | Scenario::Relays
                ))
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
    /// Handlers running at once per worker in the drain, fairness and
    /// held-xmin scenarios; the backend's default if `None`.
    pub concurrency: Option<usize>,
    /// Deliveries claimed per round trip by those workers; the backend's
    /// default if `None`.
    pub batch_size: Option<usize>,
    /// Seconds the held-xmin scenario holds its snapshot open;
    /// [`DEFAULT_HOLD_SECONDS`] (or [`QUICK_HOLD_SECONDS`] when quick) if `None`.
    pub hold_seconds: Option<u64>,
    /// How many times the enqueue and drain scenarios run (1 to
    /// [`MAX_ROUNDS`]): every case once per round, round after round, and
    /// each case reported as the median of its rounds with every round's
    /// figure beside it.
    pub rounds: u32,
    /// The Redis server the streams and relays scenarios also measure, if any.
    pub redis_url: Option<String>,
    /// The NATS server (with JetStream) the relays scenario also measures, if any.
    pub nats_url: Option<String>,
    /// The `courier` executable, whose hidden `bench-worker` subcommand runs
    /// the worker processes of `drain.processes_*`; those are skipped with a
    /// note if `None` (code running the bench from another executable, such
    /// as `cargo bench`, has no such subcommand to start).
    pub worker_program: Option<PathBuf>,
}

impl BenchOptions {
    /// Options for `database` with every setting at its default (all
    /// scenarios but explain, no baseline, no progress bars).
    pub fn new(database: Database) -> Self {
        Self {
            database,
            schema: None,
            scenario: Scenario::All,
            messages: None,
            quick: false,
            baseline: false,
            rate: DEFAULT_RATE,
            progress: false,
            concurrency: None,
            batch_size: None,
            hold_seconds: None,
            rounds: 1,
            redis_url: None,
            nats_url: None,
            worker_program: None,
        }
    }
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
    pub(crate) quick: bool,
    /// `--concurrency`, if given.
    pub(crate) concurrency: Option<usize>,
    /// `--batch-size`, if given.
    pub(crate) batch_size: Option<usize>,
    /// The fairness scenario's big backlog.
    pub(crate) fairness_messages: u64,
    /// The explain scenario's table size.
    pub(crate) explain_messages: u64,
    /// How long held-xmin holds its snapshot.
    pub(crate) hold: Duration,
    /// Held-xmin's measuring window, before and at the end of the hold.
    pub(crate) xmin_window: Duration,
    /// Rounds of the enqueue and drain scenarios.
    pub(crate) rounds: u32,
}

impl Plan {
    fn new(options: &BenchOptions) -> anyhow::Result<Self> {
        let quick = options.quick;
        let pick =
            |full: u64, short: u64| options.messages.unwrap_or(if quick { short } else { full });
        let messages = pick(DEFAULT_MESSAGES, QUICK_MESSAGES);
        if messages == 0 || messages > 10_000_000 {
            anyhow::bail!("invalid messages: must be between 1 and 10000000, got {messages}");
        }
        for (option, value) in [
            ("--concurrency", options.concurrency),
            ("--batch-size", options.batch_size),
        ] {
            if let Some(value) = value {
                if value == 0 || value > MAX_WORKER_SETTING {
                    anyhow::bail!(
                        "invalid {option}: must be between 1 and {MAX_WORKER_SETTING}, got {value}"
                    );
                }
            }
        }
        if options.rounds == 0 || options.rounds > MAX_ROUNDS {
            anyhow::bail!(
                "invalid --rounds: must be between 1 and {MAX_ROUNDS}, got {}",
                options.rounds
            );
        }
        let hold_seconds = options.hold_seconds.unwrap_or(if quick {
            QUICK_HOLD_SECONDS
        } else {
            DEFAULT_HOLD_SECONDS
        });
        if hold_seconds == 0 || hold_seconds > 86_400 {
            anyhow::bail!(
                "invalid --hold-seconds: must be between 1 and 86400, got {hold_seconds}"
            );
        }
        let hold = Duration::from_secs(hold_seconds);
        let window = if quick {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(20)
        };
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
            quick,
            concurrency: options.concurrency,
            batch_size: options.batch_size,
            fairness_messages: pick(FAIRNESS_MESSAGES, QUICK_FAIRNESS_MESSAGES),
            explain_messages: pick(EXPLAIN_MESSAGES, QUICK_EXPLAIN_MESSAGES),
            hold,
            xmin_window: window.min(hold),
            rounds: options.rounds,
        })
    }

    /// Applies `--concurrency` and `--batch-size` to a worker, leaving the
    /// backend's defaults (already on `builder`) where they were not given.
    pub(crate) fn configure<S: courier::OutboxStore>(
        &self,
        builder: courier::WorkerBuilder<S>,
    ) -> courier::WorkerBuilder<S> {
        let builder = match self.concurrency {
            Some(concurrency) => builder.concurrency(concurrency),
            None => builder,
        };
        match self.batch_size {
            Some(batch_size) => builder.batch_size(batch_size),
            None => builder,
        }
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
            run_on(
                fixture,
                options.scenario,
                plan,
                downstreams(options),
                options.worker_program.as_deref(),
            )
            .await
        }
        Database::Sqlite { path } => {
            if options.schema.is_some() {
                anyhow::bail!("invalid schema: schemas are for PostgreSQL; SQLite uses a file");
            }
            run_on(
                SqliteBench::new(path)?,
                options.scenario,
                plan,
                downstreams(options),
                options.worker_program.as_deref(),
            )
            .await
        }
    }
}

fn downstreams(options: &BenchOptions) -> relays::Downstreams<'_> {
    relays::Downstreams {
        redis_url: options.redis_url.as_deref(),
        nats_url: options.nats_url.as_deref(),
    }
}

async fn run_on<F: Fixture>(
    mut fixture: F,
    scenario: Scenario,
    plan: Plan,
    downstreams: relays::Downstreams<'_>,
    worker_program: Option<&Path>,
) -> anyhow::Result<Report>
where
    F::Store:
        courier::StreamStore + courier::StreamReceipts + courier_server::relay::NativeStreamStore,
{
    let outcome = tokio::select! {
        outcome = scenarios(&mut fixture, scenario, plan, downstreams, worker_program) => outcome,
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
    downstreams: relays::Downstreams<'_>,
    worker_program: Option<&Path>,
) -> anyhow::Result<Report>
where
    F::Store:
        courier::StreamStore + courier::StreamReceipts + courier_server::relay::NativeStreamStore,
{
    drop(fixture.fresh().await?);
    let database = fixture.describe().await?;
    let workers = fixture.worker_defaults();
    let mut measurements = Vec::new();
    let mut explained = None;
    let mut rounds = Vec::new();
    for _ in 0..plan.rounds {
        let mut round = Vec::new();
        if scenario.includes(Scenario::Enqueue) {
            enqueue::run(fixture, &plan, &mut round).await?;
        }
        if scenario.includes(Scenario::Drain) {
            drain::run(fixture, &plan, worker_program, &mut round).await?;
        }
        rounds.push(round);
    }
    measurements.extend(report::merge_rounds(rounds));
    if scenario.includes(Scenario::Latency) {
        latency::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Fairness) {
        fairness::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::HeldXmin) {
        held_xmin::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Explain) {
        explained = explain::run(fixture, &plan, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Streams) {
        streams::run(fixture, &plan, downstreams.redis_url, &mut measurements).await?;
    }
    if scenario.includes(Scenario::Relays) {
        relays::run(fixture, &plan, downstreams, &mut measurements).await?;
    }
    let mut report = Report::new(database, &plan, workers, measurements);
    if let Some(explained) = explained {
        report.explain = explained.queries;
        report.indexes = explained.indexes;
    }
    Ok(report)
}
