//! `courier`: Courier's command line. A thin layer of argument parsing over
//! the `courier_cli` library; every error ends the process with status 1 and
//! one line saying why.

use std::io::BufRead;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use courier_api::{DeadLetterFilterBody, DeadLetterSelection, PublishRequest};
use courier_cli::bench::{self, BenchOptions, Scenario};
use courier_cli::database::{self, Database};
use courier_cli::ops;
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
    /// ran, failed, died or completed.
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

/// Which database the operator verbs work on.
#[derive(clap::Args)]
struct DbArgs {
    /// `postgres://…`, or a SQLite file path.
    #[arg(long, env = "COURIER_DATABASE_URL", default_value = "courier.db")]
    database_url: String,
    /// PostgreSQL schema holding Courier's tables.
    #[arg(long, env = "COURIER_SCHEMA", default_value = courier::postgres::DEFAULT_SCHEMA)]
    schema: String,
    /// `--url`, `--token`, `--timeout-ms`: a running daemon instead.
    #[command(flatten)]
    remote: ops::RemoteArgs,
}

impl DbArgs {
    async fn open(&self) -> anyhow::Result<ops::Store> {
        ops::Store::open(&Database::parse(&self.database_url)?, &self.schema).await
    }

    fn remote(&self) -> anyhow::Result<Option<ops::Remote>> {
        self.remote.remote()
    }
}

#[derive(clap::Args)]
struct PublishArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The tenant (without --tenant and --topic, NDJSON is read from stdin).
    #[arg(long)]
    tenant: Option<String>,
    /// The topic.
    #[arg(long)]
    topic: Option<String>,
    /// The payload as JSON.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// The payload's schema version.
    #[arg(long)]
    schema_version: Option<i32>,
    /// Ordering key.
    #[arg(long)]
    ordering_key: Option<String>,
    /// Idempotency key.
    #[arg(long)]
    idempotency_key: Option<String>,
}

#[derive(clap::Args)]
struct DlqFilterArgs {
    /// Only this tenant's.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this topic's.
    #[arg(long)]
    topic: Option<String>,
    /// Only this subscription's.
    #[arg(long)]
    subscription: Option<String>,
    /// Only this message's.
    #[arg(long)]
    message_id: Option<uuid::Uuid>,
    /// Only those dead-lettered at or after this RFC 3339 time (2026-12-01T10:00:00Z).
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only those dead-lettered before this RFC 3339 time.
    #[arg(long)]
    until: Option<chrono::DateTime<chrono::Utc>>,
}

impl DlqFilterArgs {
    fn filter(&self) -> courier::DeadLetterFilter {
        courier::DeadLetterFilter {
            tenant: self.tenant.clone(),
            topic: self.topic.clone(),
            subscription: self.subscription.clone(),
            message_id: self.message_id,
            dead_after: self.since,
            dead_before: self.until,
        }
    }

    /// The filter as the API's query parameters or body fields (given ones only).
    fn fields(&self) -> Vec<(&'static str, String)> {
        let time = |at: &chrono::DateTime<chrono::Utc>| {
            at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        };
        [
            ("tenant", self.tenant.clone()),
            ("topic", self.topic.clone()),
            ("subscription", self.subscription.clone()),
            ("message_id", self.message_id.map(|id| id.to_string())),
            ("dead_after", self.since.as_ref().map(time)),
            ("dead_before", self.until.as_ref().map(time)),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| (key, value)))
        .collect()
    }
}

#[derive(Subcommand)]
enum DlqCommand {
    /// List dead letters, oldest first.
    List {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Page size.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Where the page starts: the cursor the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one dead letter with its payload and error history.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The delivery id (from `dlq list`).
        id: i64,
    },
    /// Make dead letters deliverable again (attempts reset), by id or by filter.
    Retry {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Every dead letter (the token may see): needed without ids and filter.
        #[arg(long, conflicts_with_all = ["ids", "tenant", "topic", "subscription", "message_id", "since", "until"])]
        all: bool,
        /// Delivery ids; without ids, every dead letter matching the filter.
        ids: Vec<i64>,
    },
    /// Discard dead letters for good, by id or by filter.
    Discard {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Every dead letter (the token may see): needed without ids and filter.
        #[arg(long, conflicts_with_all = ["ids", "tenant", "topic", "subscription", "message_id", "since", "until"])]
        all: bool,
        /// Delivery ids; without ids, every dead letter matching the filter.
        ids: Vec<i64>,
    },
}

#[derive(Subcommand)]
enum SubscriptionsCommand {
    /// List subscriptions with their topics and whether they are paused.
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show one subscription: topics, state, backlog and recent outcomes
    /// (through the daemon's API: needs --url).
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Send a signed test request to a webhook subscription's endpoint and
    /// show its answer; nothing is stored (through the daemon's API: needs --url).
    Ping {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Stop claiming for a subscription; its messages wait.
    Pause {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Resume a paused subscription.
    Resume {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Create a subscription (or add topics to one). Messages committed after
    /// this are owed to it; `--replay` also owes it retained older ones.
    Create {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
        /// Topic patterns: exact names, `prefix.*`, or `*` (repeatable).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// When this creates the subscription, also deliver retained messages:
        /// `all`, an RFC 3339 time (messages enqueued then or later), or a
        /// message id (that message and every later one).
        #[arg(long, value_parser = parse_replay)]
        replay: Option<courier::Replay>,
    },
    /// Stop a subscription receiving topic patterns (exactly as listed);
    /// deliveries it is already owed stay.
    RemoveTopics {
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
        /// The patterns to remove.
        #[arg(required = true)]
        topics: Vec<String>,
    },
}

/// `all`, an RFC 3339 instant, or a message id.
fn parse_replay(text: &str) -> Result<courier::Replay, String> {
    text.parse().map_err(|e: courier::ValidationError| e.reason)
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
            courier_server::init_logging(config.log_format);
            courier_server::run(config, shutdown_signal()).await?;
        }
        Command::Publish(args) => publish(args).await?,
        Command::Cancel { db, id } if db.remote.url.is_some() => {
            let path = format!("/v1/messages/{id}/cancel");
            ops::print_json(&remote(&db)?.post(&path, serde_json::json!({})).await?)?;
        }
        Command::Cancel { db, id } => match db.open().await?.cancel(id).await? {
            courier::CancelOutcome::Cancelled { deliveries } => ops::print_json(
                &serde_json::json!({"id": id, "cancelled": true, "deliveries": deliveries}),
            )?,
            courier::CancelOutcome::NotFound => anyhow::bail!("no message {id}"),
            courier::CancelOutcome::Started {
                subscription,
                state,
            } => anyhow::bail!(
                "message {id} cannot be cancelled: subscription {subscription} has started on it ({state})"
            ),
        },
        Command::Status { db, json: _ } if db.remote.url.is_some() => {
            ops::print_json(&remote(&db)?.get_all("/v1/stats?limit=500").await?)?;
        }
        Command::Status { db, json } => {
            let (totals, stats) = db.open().await?.status().await?;
            if json {
                // The shape of `GET /v1/stats`, every row on one page.
                let mut document = serde_json::to_value(&totals)?;
                document["items"] = serde_json::to_value(&stats)?;
                document["next_cursor"] = serde_json::Value::Null;
                println!("{}", serde_json::to_string_pretty(&document)?);
            } else {
                let rows: Vec<Vec<String>> = stats
                    .iter()
                    .map(|s| {
                        vec![
                            s.subscription.clone(),
                            s.topic.clone(),
                            s.available.to_string(),
                            s.running.to_string(),
                            s.dead.to_string(),
                            s.oldest_pending_age_seconds
                                .map_or_else(|| "-".to_owned(), |age| format!("{age:.1}s")),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    ops::table(
                        &[
                            "SUBSCRIPTION",
                            "TOPIC",
                            "WAITING",
                            "RUNNING",
                            "DEAD",
                            "OLDEST"
                        ],
                        &rows
                    )
                );
                if rows.is_empty() {
                    println!("(nothing waiting: every delivery is done)");
                }
            }
        }
        Command::Dlq(command) => dlq(command).await?,
        Command::Streams(command) => streams::run(command).await?,
        Command::Subscriptions(command) => match command {
            SubscriptionsCommand::List { db } if db.remote.url.is_some() => {
                ops::print_json(&remote(&db)?.get_all("/v1/subscriptions?limit=500").await?)?;
            }
            SubscriptionsCommand::Show { db, name } => {
                let path = format!("/v1/subscriptions/{}", ops::encode(&name));
                ops::print_json(&remote(&db)?.get(&path).await?)?;
            }
            SubscriptionsCommand::Ping { db, name } => {
                let path = format!("/v1/subscriptions/{}/ping", ops::encode(&name));
                ops::print_json(&remote(&db)?.post(&path, serde_json::json!({})).await?)?;
            }
            SubscriptionsCommand::Pause { db, name } if db.remote.url.is_some() => {
                let path = format!("/v1/subscriptions/{}/pause", ops::encode(&name));
                ops::print_json(&remote(&db)?.post(&path, serde_json::json!({})).await?)?;
            }
            SubscriptionsCommand::Resume { db, name } if db.remote.url.is_some() => {
                let path = format!("/v1/subscriptions/{}/resume", ops::encode(&name));
                ops::print_json(&remote(&db)?.post(&path, serde_json::json!({})).await?)?;
            }
            SubscriptionsCommand::Create { db, .. }
            | SubscriptionsCommand::RemoveTopics { db, .. }
                if db.remote.url.is_some() =>
            {
                anyhow::bail!(
                    "changing a subscription's topics is not in the HTTP API; \
                     run it without --url, against the daemon's database (--database-url)"
                );
            }
            SubscriptionsCommand::Create {
                db,
                name,
                topics,
                replay,
            } => {
                let spec = courier::SubscriptionSpec {
                    name: name.clone(),
                    topics,
                    replay,
                };
                let done = db.open().await?.register(&spec).await?;
                match (done.created, replay.is_some()) {
                    (true, true) => println!("created {name}, replaying {} retained messages", done.replayed),
                    (true, false) => println!("created {name}"),
                    (false, true) => println!(
                        "{name} exists: added {} topics, replayed nothing (a replay applies only when the subscription is created)",
                        done.topics_added
                    ),
                    (false, false) => println!("{name} exists: added {} topics", done.topics_added),
                }
            }
            SubscriptionsCommand::RemoveTopics { db, name, topics } => {
                let removed = db.open().await?.remove_topics(&name, &topics).await?;
                println!("removed {removed} of {} topics from {name}", topics.len());
            }
            SubscriptionsCommand::List { db } => {
                let rows: Vec<Vec<String>> = db
                    .open()
                    .await?
                    .subscriptions()
                    .await?
                    .into_iter()
                    .map(|s| {
                        vec![
                            s.name,
                            s.topics.join(","),
                            if s.paused { "paused" } else { "active" }.to_owned(),
                        ]
                    })
                    .collect();
                print!("{}", ops::table(&["NAME", "TOPICS", "STATE"], &rows));
            }
            SubscriptionsCommand::Pause { db, name } => {
                db.open().await?.set_paused(&name, true).await?;
                println!("paused {name}");
            }
            SubscriptionsCommand::Resume { db, name } => {
                db.open().await?.set_paused(&name, false).await?;
                println!("resumed {name}");
            }
        },
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
                concurrency: args.concurrency,
                batch_size: args.batch_size,
                hold_seconds: args.hold_seconds,
                redis_url: args.redis_url.clone(),
                nats_url: args.nats_url.clone(),
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

async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let single = match (&args.tenant, &args.topic) {
        (Some(tenant), Some(topic)) => {
            // Kept as written, byte for byte, as the API keeps it.
            let payload = serde_json::value::RawValue::from_string(args.payload.clone())
                .map_err(|e| anyhow::anyhow!("invalid payload: not JSON: {e}"))?;
            let body = PublishRequest {
                tenant: tenant.clone(),
                topic: topic.clone(),
                schema_version: args.schema_version,
                payload,
                headers: None,
                ordering_key: args.ordering_key.clone(),
                idempotency_key: args.idempotency_key.clone(),
                available_at: None,
            };
            Some(serde_json::to_string(&body)?)
        }
        (None, None) => None,
        _ => anyhow::bail!(
            "invalid arguments: --tenant and --topic go together (or neither, to read NDJSON)"
        ),
    };
    if let Some(remote) = args.db.remote()? {
        return publish_http(&remote, single).await;
    }
    let store = args.db.open().await?;
    match single {
        Some(line) => {
            let message = ops::parse_line(&line, 1, courier::MAX_PAYLOAD_BYTES)
                .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_start_matches("line 1: ")))?;
            let outcome = store.publish(std::slice::from_ref(&message)).await?;
            for o in outcome {
                println!("{}{}", o.id, if o.duplicate { " (duplicate)" } else { "" });
            }
        }
        None => {
            let progress = indicatif::ProgressBar::new_spinner();
            progress.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {pos} published ({per_sec})")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            let stdin = std::io::stdin();
            let summary = ops::publish_ndjson(&store, stdin.lock(), &progress).await;
            progress.finish_and_clear();
            let summary = summary?;
            println!(
                "published {} message(s), {} duplicate(s) skipped",
                summary.published, summary.duplicates
            );
        }
    }
    Ok(())
}

async fn publish_http(remote: &ops::Remote, single: Option<String>) -> anyhow::Result<()> {
    let bodies: Vec<(String, String)> = match single {
        Some(body) => vec![("/v1/messages".to_owned(), body)],
        None => {
            let mut batches = Vec::new();
            let mut lines = Vec::new();
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if !line.trim().is_empty() {
                    lines.push(line);
                }
                if lines.len() == ops::PUBLISH_BATCH {
                    batches.push(std::mem::take(&mut lines));
                }
            }
            if !lines.is_empty() {
                batches.push(lines);
            }
            batches
                .into_iter()
                .map(|lines| {
                    (
                        "/v1/messages/batch".to_owned(),
                        format!("{{\"messages\":[{}]}}", lines.join(",")),
                    )
                })
                .collect()
        }
    };
    for (path, body) in bodies {
        println!("{}", remote.post_text(&path, body).await?);
    }
    Ok(())
}

fn remote(db: &DbArgs) -> anyhow::Result<ops::Remote> {
    db.remote()?
        .ok_or_else(|| anyhow::anyhow!("invalid arguments: --url is required here"))
}

impl DlqFilterArgs {
    fn is_empty(&self) -> bool {
        self.filter().is_empty()
    }
}

/// Refuses a retry or discard of every dead letter that does not say `--all`.
fn check_selection(
    verb: &str,
    ids: &[i64],
    filter: &DlqFilterArgs,
    all: bool,
) -> anyhow::Result<()> {
    if ids.is_empty() && filter.is_empty() && !all {
        anyhow::bail!(
            "invalid arguments: without ids or a filter (--tenant, --topic, --subscription, \
             --message-id, --since, --until) this would {verb} \
             every dead letter; pass --all to mean that"
        );
    }
    Ok(())
}

/// The body of `POST /v1/dead-letters/{retry,discard}`: the ids, or else
/// every dead letter (`--all`), or else the filter.
fn selection(ids: &[i64], filter: &DlqFilterArgs, all: bool) -> anyhow::Result<serde_json::Value> {
    let (ids, filter, all) = if !ids.is_empty() {
        (Some(ids.to_vec()), None, None)
    } else if all {
        (None, Some(DeadLetterFilterBody::default()), Some(true))
    } else {
        let filter = DeadLetterFilterBody {
            tenant: filter.tenant.clone(),
            topic: filter.topic.clone(),
            subscription: filter.subscription.clone(),
            message_id: filter.message_id,
            dead_after: filter.since,
            dead_before: filter.until,
        };
        (None, Some(filter), None)
    };
    Ok(serde_json::to_value(DeadLetterSelection {
        ids,
        filter,
        all,
        dry_run: None,
    })?)
}

async fn dlq(command: DlqCommand) -> anyhow::Result<()> {
    match &command {
        DlqCommand::Retry {
            filter, all, ids, ..
        } => check_selection("retry", ids, filter, *all)?,
        DlqCommand::Discard {
            filter, all, ids, ..
        } => check_selection("discard", ids, filter, *all)?,
        _ => {}
    }
    match command {
        DlqCommand::List {
            db,
            filter,
            limit,
            cursor,
        } if db.remote.url.is_some() => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(filter.fields());
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor));
            }
            let query: Vec<String> = query
                .iter()
                .map(|(k, v)| format!("{k}={}", ops::encode(v)))
                .collect();
            let path = format!("/v1/dead-letters?{}", query.join("&"));
            ops::print_json(&remote(&db)?.get(&path).await?)?;
        }
        DlqCommand::Show { db, id } if db.remote.url.is_some() => {
            ops::print_json(&remote(&db)?.get(&format!("/v1/dead-letters/{id}")).await?)?;
        }
        DlqCommand::Retry {
            db,
            filter,
            all,
            ids,
        } if db.remote.url.is_some() => {
            let body = selection(&ids, &filter, all)?;
            ops::print_json(&remote(&db)?.post("/v1/dead-letters/retry", body).await?)?;
        }
        DlqCommand::Discard {
            db,
            filter,
            all,
            ids,
        } if db.remote.url.is_some() => {
            let body = selection(&ids, &filter, all)?;
            ops::print_json(&remote(&db)?.post("/v1/dead-letters/discard", body).await?)?;
        }
        DlqCommand::List {
            db,
            filter,
            limit,
            cursor,
        } => {
            let after = cursor
                .as_deref()
                .map(courier_server::cursor::decode::<courier::DeadLetterKey>)
                .transpose()
                .map_err(|e| anyhow::anyhow!("invalid arguments: --cursor: {}", e.message))?;
            let page = db
                .open()
                .await?
                .dead_letters(&filter.filter(), after, limit)
                .await?;
            let rows: Vec<Vec<String>> = page
                .items
                .iter()
                .map(|d| {
                    vec![
                        d.delivery_id.to_string(),
                        d.subscription.clone(),
                        d.tenant.clone(),
                        d.topic.clone(),
                        d.attempts.to_string(),
                        d.errors
                            .last()
                            .map(|e| courier::truncate_chars(&e.message, 60).to_owned())
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                ops::table(
                    &[
                        "ID",
                        "SUBSCRIPTION",
                        "TENANT",
                        "TOPIC",
                        "ATTEMPTS",
                        "LAST ERROR"
                    ],
                    &rows
                )
            );
            if let Some(key) = page.next_cursor {
                println!("more: --cursor {}", courier_server::cursor::encode(&key));
            }
        }
        DlqCommand::Show { db, id } => {
            let Some(letter) = db.open().await?.dead_letter(id).await? else {
                anyhow::bail!("no dead letter with id {id}");
            };
            println!("delivery      {}", letter.delivery_id);
            println!("message       {}", letter.message_id);
            println!("subscription  {}", letter.subscription);
            println!("tenant        {}", letter.tenant);
            println!("topic         {} v{}", letter.topic, letter.schema_version);
            println!("attempts      {}", letter.attempts);
            println!("payload       {}", letter.payload);
            println!("errors:");
            for error in &letter.errors {
                println!(
                    "  #{} {}  {}",
                    error.attempt,
                    error.at.to_rfc3339(),
                    error.message
                );
            }
        }
        DlqCommand::Retry {
            db, filter, ids, ..
        } => {
            let affected = db.open().await?.retry(&ids, &filter.filter()).await?;
            println!("retried {affected} dead letter(s)");
        }
        DlqCommand::Discard {
            db, filter, ids, ..
        } => {
            let affected = db.open().await?.discard(&ids, &filter.filter()).await?;
            println!("discarded {affected} dead letter(s)");
        }
    }
    Ok(())
}
