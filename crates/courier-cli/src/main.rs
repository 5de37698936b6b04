//! `courier`: Courier's command line. A thin layer of argument parsing over
//! the `courier_cli` library; every error ends the process with status 1 and
//! one line saying why.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use courier_cli::bench::{self, BenchOptions, Scenario};
use courier_cli::database::{self, Database};

const EXAMPLES: &str = "\
Examples:
  courier migrate --database-url postgres://postgres@127.0.0.1:5432/app --schema courier
  courier bench --quick
  courier bench --scenario all --baseline --database-url postgres://postgres@127.0.0.1:5432/test
  courier bench --scenario drain --messages 20000 --json > drain.json

The database URL may also come from COURIER_DATABASE_URL. `courier bench`
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
    /// Create or upgrade Courier's tables (safe to run from many processes at once).
    Migrate {
        /// `postgres://…`, or a SQLite file path (`sqlite:` prefix optional).
        #[arg(long, env = "COURIER_DATABASE_URL")]
        database_url: String,
        /// PostgreSQL schema for Courier's tables.
        #[arg(long, default_value = courier::postgres::DEFAULT_SCHEMA)]
        schema: String,
    },
    /// Measure enqueue and drain throughput, pickup latency and worker memory.
    Bench(BenchArgs),
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
    /// Messages each drain scenario pre-loads [default: 100000, or 2000 with --quick].
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
    All,
}

impl From<ScenarioArg> for Scenario {
    fn from(arg: ScenarioArg) -> Self {
        match arg {
            ScenarioArg::Enqueue => Scenario::Enqueue,
            ScenarioArg::Drain => Scenario::Drain,
            ScenarioArg::Latency => Scenario::Latency,
            ScenarioArg::All => Scenario::All,
        }
    }
}

fn main() -> ExitCode {
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
            // `{:#}` puts the whole context chain on one line.
            eprintln!("courier: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate {
            database_url,
            schema,
        } => {
            let database = Database::parse(&database_url)?;
            println!("{}", database::migrate(&database, &schema).await?);
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
            };
            let report = bench::run(&options).await?;
            if args.json {
                println!("{}", report.to_json()?);
            } else {
                print!("{}", report.to_table());
            }
        }
    }
    Ok(())
}
