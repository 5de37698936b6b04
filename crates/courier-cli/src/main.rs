//! `courier`: Courier's command line. A thin layer of argument parsing over
//! the `courier_cli` library; every error ends the process with status 1 and
//! one line saying why.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use courier_cli::bench::{self, BenchOptions, Scenario};
use courier_cli::commands::dlq::{self, DlqCommand};
use courier_cli::commands::subscriptions::{self, SubscriptionsCommand};
use courier_cli::commands::{self, DbArgs, PublishArgs, Target};
use courier_cli::database::{self, Database};
use courier_cli::streams::{self, StreamsCommand};

const EXAMPLES: &str = "\
Examples:
  courier serve                                  # SQLite ./courier.db, http://127.0.0.1:7070
  courier serve --demo                           # plus sample events to a `demo` subscription
  courier serve --config courier.toml            # see crates/courier-server/courier.example.toml
  courier publish --tenant acme --topic invoice.paid --payload '{\"invoice\": 7}'
  cat events.ndjson | courier publish            # one POST /v1/messages body per line
  courier publish --url http://127.0.0.1:7070 --token $TOKEN --tenant acme --topic t --payload 1
  courier status
  courier dlq list --subscription billing
  courier dlq show 42
  courier dlq retry 42 43                        # or: courier dlq retry --topic invoice.paid
  courier subscriptions pause billing
  courier subscriptions create audit --topic 'invoice.*' --replay all
  courier streams append --tenant acme --stream orders --payload '{\"order\": 7}'
  courier streams group --tenant acme --stream orders --group billing --start beginning
  courier streams read --tenant acme --stream orders --group billing --consumer c1 --block-ms 5000
  courier streams ack --tenant acme --stream orders --group billing 1-0 2-0
  courier streams pending --url http://127.0.0.1:7070 --token $TOKEN --tenant acme --stream orders --group billing
  courier migrate --database-url postgres://postgres@127.0.0.1:5432/app --schema courier
  courier migrate status --database-url postgres://postgres@127.0.0.1:5432/app --schema courier
  courier bench --quick
  courier bench --scenario all --baseline --database-url postgres://postgres@127.0.0.1:5432/test
  courier bench --scenario drain --messages 20000 --json > drain.json
  courier bench --scenario explain --database-url postgres://postgres@127.0.0.1:5432/test

The database URL may also come from COURIER_DATABASE_URL; `courier streams`
reads Redis with --backend redis --redis-url (or COURIER_STREAMS__BACKEND and
COURIER_REDIS__URL, as the daemon does). `courier bench`
without one measures SQLite in ./courier-bench.db (deleted and recreated);
on PostgreSQL it creates a schema of its own (courier_bench_<random>) and
drops it when done.";

#[derive(Parser)]
#[command(
    name = "courier",
    version,
    about = "Courier: durable event delivery on PostgreSQL and SQLite",
    after_help = EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: workers for the configured subscriptions, the HTTP API
    /// under /v1, /metrics, /healthz and /readyz.
    Serve {
        /// The config file (every key can also come from COURIER_<KEY>).
        #[arg(long, env = "COURIER_CONFIG")]
        config: Option<std::path::PathBuf>,
        /// Publish a sample event every 2 s to a built-in `demo` subscription
        /// that logs each delivery: messages flow in the first minute.
        #[arg(long)]
        demo: bool,
        /// The database (`postgres://…`, or a SQLite file path), over the
        /// config file's and COURIER_DATABASE_URL's `database_url`.
        #[arg(long)]
        database_url: Option<String>,
        /// The API's address (`host:port`), over the config file's and
        /// COURIER_LISTEN's `listen`.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Publish one message, or NDJSON from standard input (one `POST
    /// /v1/messages` body per line), to the database or a running daemon.
    Publish(PublishArgs),
    /// Cancel a message no subscription has started on (scheduled, or still
    /// waiting): it and its deliveries are removed; refused once a delivery
    /// ran, failed, died, was discarded or completed.
    Cancel {
        #[command(flatten)]
        db: DbArgs,
        /// The message id.
        id: uuid::Uuid,
    },
    /// Open deliveries per subscription and topic, and the oldest waiting one.
    Status {
        #[command(flatten)]
        db: DbArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Dead letters: list, show, retry, discard.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Subscriptions: list, pause, resume, create (with replay), remove topics.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
    /// Streams: append, read (a range, or new entries for a group's
    /// consumer), group, ack, claim, pending, trim, consumers.
    #[command(subcommand)]
    Streams(StreamsCommand),
    /// Create or upgrade Courier's tables (safe to run from many processes at
    /// once); `courier migrate status` lists what is applied and pending.
    ///
    /// Refuses, applying nothing, a database where a migration was changed
    /// after it was applied (its recorded checksum, the SHA-256 of its SQL,
    /// differs from this binary's) or that a newer courier migrated.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Migrate {
        #[command(subcommand)]
        command: Option<MigrateCommand>,
        /// `postgres://…`, or a SQLite file path (`sqlite:` prefix optional).
        #[arg(long, env = "COURIER_DATABASE_URL", required = true)]
        database_url: Option<String>,
        /// PostgreSQL schema for Courier's tables.
        #[arg(long, default_value = courier::postgres::DEFAULT_SCHEMA)]
        schema: String,
    },
    /// Measure enqueue and drain throughput, pickup latency and worker memory.
    Bench(BenchArgs),
    /// One worker process of `courier bench`'s `drain.processes_*` (started
    /// by the bench): prints `ready`, runs on a line `go`, stops on a line
    /// `stop` or the end of stdin and prints `handled <n>`.
    #[command(hide = true)]
    BenchWorker(BenchWorkerArgs),
}

#[derive(Subcommand)]
enum MigrateCommand {
    /// List every migration with its state (applied, pending, changed,
    /// unknown), when it was applied and its checksum; applies nothing and
    /// creates nothing.
    ///
    /// Exit status: 0 when the status was read and `courier migrate` would
    /// succeed, pending migrations included (as `sqlx migrate info` and
    /// `diesel migration list` exit 0 with pending ones); 1 when it could not
    /// be read, or when `courier migrate` would refuse the database (a
    /// changed migration, or one a newer courier applied): the table is
    /// still printed, and the refusal on stderr.
    Status {
        /// `postgres://…`, or a SQLite file path (`sqlite:` prefix optional).
        #[arg(long, env = "COURIER_DATABASE_URL")]
        database_url: String,
        /// PostgreSQL schema for Courier's tables.
        #[arg(long, default_value = courier::postgres::DEFAULT_SCHEMA)]
        schema: String,
        /// Print JSON (full checksums) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct BenchWorkerArgs {
    /// `postgres://…` (the bench passes it in COURIER_DATABASE_URL).
    #[arg(long, env = "COURIER_DATABASE_URL")]
    database_url: String,
    /// The schema Courier's tables are in.
    #[arg(long)]
    schema: String,
    /// The subscription to work for.
    #[arg(long)]
    subscription: String,
    /// The topic the no-op handler takes.
    #[arg(long)]
    topic: String,
    /// Handlers running at once [default: the backend's].
    #[arg(long)]
    concurrency: Option<usize>,
    /// Deliveries claimed per round trip [default: the backend's].
    #[arg(long)]
    batch_size: Option<usize>,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// `postgres://…` to measure PostgreSQL; SQLite in ./courier-bench.db if absent.
    #[arg(long, env = "COURIER_DATABASE_URL")]
    database_url: Option<String>,
    /// PostgreSQL schema to create, use and drop; must not exist
    /// [default: courier_bench_<random>].
    #[arg(long)]
    schema: Option<String>,
    /// Which scenarios to run.
    #[arg(long, value_enum, default_value_t = ScenarioArg::All)]
    scenario: ScenarioArg,
    /// Messages each drain scenario pre-loads [default: 100000, or 2000 with
    /// --quick]; also the fairness backlog [default: 200000, 5000 with --quick]
    /// and the explain table [default: 1000000, 10000 with --quick].
    #[arg(long)]
    messages: Option<u64>,
    /// Seconds, not minutes: small N and short runs (a CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Also run the same work as minimal hand-written SQL and print ratios to it.
    #[arg(long)]
    baseline: bool,
    /// Messages per second trickled in by the latency scenario.
    #[arg(long, default_value_t = bench::DEFAULT_RATE)]
    rate: u32,
    /// Handlers running at once per worker in drain, fairness and held-xmin
    /// (1-10000) [default: the backend's, as `Courier::worker` sets it].
    #[arg(long)]
    concurrency: Option<usize>,
    /// Deliveries those workers claim per round trip (1-10000) [default: the
    /// backend's, as `Courier::worker` sets it].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Seconds held-xmin holds its REPEATABLE READ snapshot open [default: 180, or 5 with --quick].
    #[arg(long)]
    hold_seconds: Option<u64>,
    /// Run the enqueue and drain scenarios this many times in turn (1-20) and
    /// report each case's median, with every round's figure beside it.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// The Redis server the streams scenario also measures (beside raw
    /// XADD and XREADGROUP + XACK loops); without it, native streams only.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// The NATS server (with JetStream) the relays scenario also measures,
    /// beside raw asynchronous publishes; without it, no NATS relay case.
    #[arg(long, env = "NATS_URL")]
    nats_url: Option<String>,
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Do not draw progress bars on stderr.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum ScenarioArg {
    Enqueue,
    Drain,
    Latency,
    Fairness,
    HeldXmin,
    /// EXPLAIN (ANALYZE, BUFFERS) of the hot queries (PostgreSQL; not in `all`).
    Explain,
    /// Streams natively and, with --redis-url, on Redis beside raw commands (not in `all`).
    Streams,
    /// Relays to a native stream and, with --redis-url / --nats-url, to Redis
    /// and NATS beside raw writes (not in `all`).
    Relays,
    /// Every scenario but explain, streams and relays.
    All,
}

impl From<ScenarioArg> for Scenario {
    fn from(arg: ScenarioArg) -> Self {
        match arg {
            ScenarioArg::Enqueue => Scenario::Enqueue,
            ScenarioArg::Drain => Scenario::Drain,
            ScenarioArg::Latency => Scenario::Latency,
            ScenarioArg::Fairness => Scenario::Fairness,
            ScenarioArg::HeldXmin => Scenario::HeldXmin,
            ScenarioArg::Explain => Scenario::Explain,
            ScenarioArg::Streams => Scenario::Streams,
            ScenarioArg::Relays => Scenario::Relays,
            ScenarioArg::All => Scenario::All,
        }
    }
}

fn main() -> ExitCode {
    cap_malloc_arenas();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("courier: error: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The whole chain on one line; a database, Redis or webhook URL
            // in it loses its password and query values.
            let text = courier_server::redact::redact_urls(&one_line(&error));
            eprintln!("courier: error: {text}");
            ExitCode::FAILURE
        }
    }
}

/// The most malloc arenas glibc may make in this process (its default is 8
/// per core). glibc gives a thread that finds the arenas busy an arena of its
/// own and keeps much of what each arena freed, so a process with many
/// threads that allocate (the runtime's, and one per SQLite connection)
/// holds resident memory it no longer uses: on the 2-core bench machine two
/// arenas took the SQLite drains' peak RSS from 49-54 MB to 41 MB at 256 in
/// flight and claims of 128 (BENCHMARKS.md, session 28).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: &str = "2";

/// Set in the environment of the restarted process, so it never restarts
/// again: glibc drops `MALLOC_*` variables from the environment of setuid
/// programs and of programs with file capabilities (say, one given
/// `cap_net_bind_service` to listen on port 443), where checking
/// `MALLOC_ARENA_MAX` alone would restart forever. Not `COURIER_…`: the
/// daemon reads every such variable as configuration and refuses unknown ones.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const RESTARTED: &str = "ARENAS_CAPPED_BY_COURIER";

/// Starts this binary again with `MALLOC_ARENA_MAX` set to [`MALLOC_ARENAS`]
/// (and [`RESTARTED`] set), unless the environment already sets
/// `MALLOC_ARENA_MAX` (a value an operator chose is kept) or this process is
/// the restarted one. glibc reads the variable only as the process starts,
/// and setting it from inside would take `unsafe` (`mallopt`), which this
/// workspace forbids. `exec` keeps the process id, arguments, open files and
/// the rest of the environment; the binary is run by its own path, so the
/// process keeps its name (`courier` in `ps`, `pgrep`, `top`). If the restart
/// fails (no `/proc`, a seccomp filter) the process runs on with glibc's
/// defaults.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn cap_malloc_arenas() {
    use std::os::unix::process::CommandExt;

    if std::env::var_os("MALLOC_ARENA_MAX").is_some() || std::env::var_os(RESTARTED).is_some() {
        return;
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let Some((program, rest)) = args.split_first() else {
        return;
    };
    let restart = |path: &std::path::Path| {
        // Returns only if the restart failed.
        std::process::Command::new(path)
            .arg0(program)
            .args(rest)
            .env("MALLOC_ARENA_MAX", MALLOC_ARENAS)
            .env(RESTARTED, "1")
            .exec()
    };
    // Our own path first (a binary replaced on disk since it started has none
    // left: then the kernel's link to it, though the process is named `exe`).
    if let Ok(path) = std::env::current_exe() {
        if path.is_file() {
            let _failed = restart(&path);
        }
    }
    let _failed = restart(std::path::Path::new("/proc/self/exe"));
}

/// Elsewhere the allocator is not glibc's: nothing to cap.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn cap_malloc_arenas() {}

/// `error` and its causes on one line, `: ` between them, leaving out a cause
/// whose text the one before already holds (most errors print their source
/// in their own text too, so the chain would repeat it).
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if previous.is_empty() || !previous.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        previous = text;
    }
    line
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Serve { .. }) {
        // Warnings (a failed settle, a lost lease) reach the terminal; RUST_LOG overrides.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init();
    }
    match cli.command {
        Command::Serve {
            config,
            demo,
            database_url,
            listen,
        } => {
            let mut config = courier_server::Config::load(config.as_deref())?;
            config.demo |= demo;
            if let Some(url) = database_url {
                config.database_url = url;
            }
            if let Some(listen) = listen {
                config.listen = listen;
            }
            // The flags are checked as the file's keys are.
            config.validate()?;
            let telemetry = courier_server::init_telemetry(&config)?;
            let served = courier_server::run(config, shutdown_signal()).await;
            telemetry.shutdown().await;
            served?;
        }
        Command::Publish(args) => commands::publish(&Target::open(&args.db)?, &args).await?,
        Command::Cancel { db, id } => commands::cancel(&Target::open(&db)?, id).await?,
        Command::Status { db, json } => commands::status(&Target::open(&db)?, json).await?,
        Command::Dlq(command) => dlq::run(command).await?,
        Command::Subscriptions(command) => subscriptions::run(command).await?,
        Command::Streams(command) => streams::run(command).await?,
        Command::Migrate {
            command: None,
            database_url,
            schema,
        } => {
            let database_url = database_url
                .ok_or_else(|| anyhow::anyhow!("invalid arguments: --database-url is required"))?;
            let database = Database::parse(&database_url)?;
            println!("{}", database::migrate(&database, &schema).await?);
        }
        Command::Migrate {
            command:
                Some(MigrateCommand::Status {
                    database_url,
                    schema,
                    json,
                }),
            ..
        } => {
            let database = Database::parse(&database_url)?;
            let statuses = database::migration_status(&database, &schema).await?;
            if json {
                let document = database::migration_status_json(&database, &schema, &statuses)?;
                println!("{}", serde_json::to_string_pretty(&document)?);
            } else {
                print!("{}", database::migration_status_table(&statuses));
            }
            if let Some(refusal) = courier::migration_refusal(&statuses) {
                return Err(anyhow::Error::new(refusal).context("`courier migrate` would refuse"));
            }
        }
        Command::Bench(args) => {
            let database = match args.database_url.as_deref() {
                Some(url) => Database::parse(url)?,
                None => Database::Sqlite {
                    path: bench::DEFAULT_SQLITE_PATH.to_owned(),
                },
            };
            let options = BenchOptions {
                database,
                schema: args.schema,
                scenario: args.scenario.into(),
                messages: args.messages,
                quick: args.quick,
                baseline: args.baseline,
                rate: args.rate,
                progress: !args.no_progress,
                concurrency: args.concurrency,
                batch_size: args.batch_size,
                hold_seconds: args.hold_seconds,
                rounds: args.rounds,
                redis_url: args.redis_url.clone(),
                nats_url: args.nats_url.clone(),
                // This binary has the `bench-worker` subcommand the worker
                // processes run.
                worker_program: std::env::current_exe().ok(),
            };
            let report = bench::run(&options).await?;
            if args.json {
                println!("{}", report.to_json()?);
            } else {
                print!("{}", report.to_table());
            }
        }
        Command::BenchWorker(args) => {
            bench::worker_process(&bench::WorkerProcessOptions {
                database_url: args.database_url,
                schema: args.schema,
                subscription: args.subscription,
                topic: args.topic,
                concurrency: args.concurrency,
                batch_size: args.batch_size,
            })
            .await?;
        }
    }
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
