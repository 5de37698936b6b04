//! Outbox relay: seed 001 (a batch poller whose "forward downstream" was a
//! TODO) done right.
//!
//! An application places orders: each order's row in `orders` and its
//! `order.placed` event commit in one transaction of the application's own
//! (Courier's enqueue on the application's connection), so an event exists
//! if and only if its order does. Courier then relays every event
//! downstream, each downstream through a subscription of its own (its own
//! leases, retries, dead letters and receipts, so a failing downstream never
//! re-sends to the healthy one):
//! - `relay-events`: tenant `acme`'s stream `events`, a native stream in the
//!   same database (default), or a Redis stream with `--redis-url`;
//! - `relay-nats`: with `--nats-url`, the JetStream subject
//!   `{prefix}.acme.order.placed`, stored by the JetStream stream
//!   `--nats-stream` (created if missing).
//!
//! The relays are the daemon's (`courier_server::relay`): a delivery
//! completes only once the downstream write is confirmed, and a delivery
//! that runs again writes nothing twice (Redis: a dedupe key per message;
//! NATS: `Nats-Msg-Id`; native: the append commits with the completion).
//!
//! Where the seed went wrong, and what happens here instead:
//! - *It marked rows completed without forwarding them.* Here completion
//!   waits for the downstream's confirmation.
//! - *One transaction per batch*, so one failing row rolled back or held
//!   back the rest. Here every event of a claim is its own delivery: a
//!   poison event (`--poison`; an order whose event breaks the `order.placed`
//!   contract, refused by [`Contract`] with a permanent failure) is
//!   dead-lettered at once with its reason while its batch-mates are
//!   delivered (native relays run in one transaction per group; the failure
//!   rolls back only itself, the others commit).
//! - *It slept `interval` after every batch*, backlog or not. Here
//!   `--batch-size` and `--interval-ms` are the worker's claim size and idle
//!   poll interval: while claims come back with work the worker claims again
//!   at once; the interval applies only when there is nothing to claim (and
//!   even then a commit wakes it: in-process on SQLite, NOTIFY on
//!   PostgreSQL).
//! - *FAILED rows retried forever, PENDING ones without backoff.* Here a
//!   failure retries with capped, jittered backoff and dead-letters after
//!   10 attempts; a permanent failure dead-letters at once.
//! - `enabled = false` (`--enabled false`) still logs "relay disabled" and
//!   exits 0, touching no database and no server.
//!
//! `outbox-relay` places `--count` orders, relays their events, waits until
//! each is downstream or dead-lettered, prints what each downstream holds of
//! them (counted by message id) and exits non-zero unless each downstream
//! holds every good event exactly once and each poison event is a dead
//! letter of every subscription.

mod downstream;
mod orders;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{ArgAction, Parser};
use courier::postgres::PgStore;
use courier::{Courier, DeadLetterFilter, StreamKey};
use courier_server::config::{
    NativeStreamTargetConfig, NatsTargetConfig, RedisStreamTargetConfig, SubscriptionConfig,
    TargetConfig, DEFAULT_RELAY_TIMEOUT_MS,
};
use courier_server::relay::{NativeRelay, NatsRelay, RedisRelay};
use uuid::Uuid;

use downstream::{
    downstreams, jetstream_copies, stream_copies, Downstream, EventsStream, Nats, Report,
};
use orders::{Contract, OrderStore};

/// The tenant whose orders the example places.
pub const TENANT: &str = "acme";
/// The topic of the orders' events.
pub const TOPIC: &str = "order.placed";
/// The stream (native or Redis) the events are relayed to.
pub const STREAM: &str = "events";
/// The subscription relaying to the `events` stream.
pub const STREAM_SUBSCRIPTION: &str = "relay-events";
/// The subscription relaying to NATS JetStream.
pub const NATS_SUBSCRIPTION: &str = "relay-nats";
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Orders and their events commit together; Courier relays each event to the `events` \
             stream and to NATS JetStream exactly once"
)]
struct Cli {
    /// Whether the relay runs at all; `false` logs "relay disabled" and exits 0.
    #[arg(long, env = "OUTBOX_RELAY_ENABLED", default_value_t = true, action = ArgAction::Set)]
    enabled: bool,
    /// Events claimed per round trip (and relayed at once) by each relay.
    #[arg(long, env = "OUTBOX_RELAY_BATCH_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    batch_size: u64,
    /// How long an idle relay waits between claims when nothing wakes it;
    /// never applies while events are waiting.
    #[arg(long, env = "OUTBOX_RELAY_INTERVAL_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms: u64,
    /// `postgres://…` or a SQLite file path: orders, the outbox (and the
    /// native `events` stream).
    #[arg(long, env = "DATABASE_URL", default_value = "outbox-relay.db")]
    database_url: String,
    /// PostgreSQL schema for Courier's tables and `orders`.
    #[arg(long, default_value = "courier")]
    schema: String,
    /// Relay to a Redis stream on this server instead of the native stream.
    /// (Not `REDIS_URL`: a server configured for something else must not
    /// switch the downstream.)
    #[arg(long, env = "OUTBOX_RELAY_REDIS_URL")]
    redis_url: Option<String>,
    /// Prefix of the Redis keys (default: one of its own per run).
    #[arg(long)]
    key_prefix: Option<String>,
    /// Also relay to NATS JetStream on this server.
    #[arg(long, env = "OUTBOX_RELAY_NATS_URL")]
    nats_url: Option<String>,
    /// The JetStream stream storing `{nats-subject-prefix}.>`; created if missing.
    #[arg(long, default_value = "EVENTS")]
    nats_stream: String,
    /// The first token of the NATS subject `{prefix}.{tenant}.{topic}`.
    #[arg(long, default_value = "events")]
    nats_subject_prefix: String,
    /// Orders to place (one event each).
    #[arg(long, default_value_t = 200)]
    count: usize,
    /// How many of the orders' events break the contract (dead-lettered).
    #[arg(long, default_value_t = 1)]
    poison: usize,
    /// Give up waiting for the relays after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_seconds: u64,
}

/// This run's events `subscription` dead-lettered.
async fn dead_letters<S: OrderStore>(
    courier: &Courier<S>,
    subscription: &str,
    events: &BTreeSet<Uuid>,
) -> anyhow::Result<BTreeSet<Uuid>> {
    let filter = DeadLetterFilter {
        subscription: Some(subscription.to_owned()),
        ..DeadLetterFilter::default()
    };
    let mut dead = BTreeSet::new();
    let mut after = None;
    loop {
        let page = courier.dead_letters(&filter, after, 500).await?;
        for letter in &page.items {
            if events.contains(&letter.message_id) {
                tracing::info!(
                    subscription,
                    message_id = %letter.message_id,
                    error = letter.errors.last().map(|e| e.message.as_str()).unwrap_or(""),
                    "dead-lettered"
                );
                dead.insert(letter.message_id);
            }
        }
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => return Ok(dead),
        }
    }
}

/// Whether `subscription` has no delivery waiting or running.
async fn drained<S: OrderStore>(store: &S, subscription: &str) -> anyhow::Result<bool> {
    let totals = store.delivery_totals(None, Some(subscription)).await?;
    Ok(totals.available + totals.running == 0)
}

async fn run_with<S: OrderStore>(
    courier: Courier<S>,
    cli: &Cli,
    events_stream: EventsStream,
    nats: Option<Nats>,
) -> anyhow::Result<Report> {
    courier
        .store()
        .create_orders_table()
        .await
        .context("creating orders")?;
    let batch_size = usize::try_from(cli.batch_size)?;
    let topics = vec![TOPIC.to_owned()];
    let configure = |subscription: &SubscriptionConfig| {
        courier
            .worker(subscription.name.clone())
            .batch_size(batch_size)
            // Every claimed event relays at once: none waits for a slow batch-mate.
            .concurrency(batch_size)
            .poll_interval(Duration::from_millis(cli.interval_ms))
            // The retry cap the relay's redelivery horizon was computed with.
            .retry_policy(subscription.retry.policy())
    };

    // The subscriptions exist before the first order: each relays them all.
    let mut workers = Vec::new();
    let (stream_target, stream_name) = match &events_stream {
        EventsStream::Native => (
            TargetConfig::Stream(NativeStreamTargetConfig {
                stream: STREAM.into(),
            }),
            format!("native stream {TENANT}/{STREAM}"),
        ),
        EventsStream::Redis(store) => (
            TargetConfig::RedisStream(RedisStreamTargetConfig {
                stream: STREAM.into(),
                maxlen: None,
                dedupe_ttl_ms: None,
            }),
            format!(
                "Redis stream {}",
                store.redis_key(&StreamKey::new(TENANT, STREAM)?)
            ),
        ),
    };
    let subscription = SubscriptionConfig::new(STREAM_SUBSCRIPTION, topics.clone(), stream_target);
    let builder = match &events_stream {
        EventsStream::Native => configure(&subscription).handle_transactional(
            TOPIC,
            1,
            Contract(NativeRelay::new(&subscription, courier.store().clone())?),
        ),
        EventsStream::Redis(store) => configure(&subscription).handle(
            TOPIC,
            1,
            Contract(RedisRelay::new(&subscription, store.clone())?),
        ),
    };
    workers.push(builder.build().await?);
    if let Some(nats) = &nats {
        let subscription = SubscriptionConfig::new(
            NATS_SUBSCRIPTION,
            topics.clone(),
            TargetConfig::Nats(NatsTargetConfig {
                subject: format!("{}.{{tenant}}.{{topic}}", cli.nats_subject_prefix),
                stream: nats.stream.clone(),
                timeout_ms: DEFAULT_RELAY_TIMEOUT_MS,
            }),
        );
        let relay = NatsRelay::start(&subscription, nats.client.clone()).await?;
        workers.push(
            configure(&subscription)
                .handle(TOPIC, 1, Contract(relay))
                .build()
                .await?,
        );
    }

    // The application: each order and its event in one transaction. The
    // relays start after, so they meet a backlog of whole batches, poison
    // events among good ones.
    let poison_at: BTreeSet<usize> = (1..=cli.poison)
        .map(|n| n * cli.count / (cli.poison + 1))
        .collect();
    let mut events = BTreeSet::new();
    let mut poison = BTreeSet::new();
    for n in 0..cli.count {
        let customer = format!("customer-{}", n % 17);
        let amount_cents = 1_000 + u64::try_from(n)? * 7;
        let is_poison = poison_at.contains(&n);
        let id = courier
            .store()
            .place_order(&courier, &customer, amount_cents, is_poison)
            .await
            .with_context(|| format!("placing order {n}"))?;
        events.insert(id);
        if is_poison {
            poison.insert(id);
        }
    }
    tracing::info!(
        orders = cli.count,
        poison = poison.len(),
        "orders placed; relaying"
    );

    let started = Instant::now();
    let running: Vec<_> = workers.into_iter().map(courier::Worker::start).collect();
    let mut subscriptions = vec![STREAM_SUBSCRIPTION];
    if nats.is_some() {
        subscriptions.push(NATS_SUBSCRIPTION);
    }
    let deadline = started + Duration::from_secs(cli.timeout_seconds);
    let all_settled = loop {
        let mut done = true;
        for subscription in &subscriptions {
            done &= drained(courier.store(), subscription).await?;
        }
        if done {
            tracing::info!(seconds = started.elapsed().as_secs_f64(), "relayed");
            break true;
        }
        if Instant::now() > deadline {
            tracing::warn!(
                seconds = cli.timeout_seconds,
                "deliveries still open at the deadline"
            );
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for worker in running {
        worker.shutdown().await;
    }

    let expected = events.len() - poison.len();
    let key = StreamKey::new(TENANT, STREAM)?;
    let copies = match &events_stream {
        EventsStream::Native => {
            // Only completed deliveries' entries are worth waiting for.
            let wait = Instant::now() + S::NATIVE_VISIBILITY_WAIT;
            loop {
                let copies = stream_copies(courier.store(), &key, &events).await?;
                if copies.len() >= expected || !all_settled || Instant::now() >= wait {
                    break copies;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        EventsStream::Redis(store) => stream_copies(store, &key, &events).await?,
    };
    let mut downstreams = vec![Downstream {
        name: stream_name,
        subscription: STREAM_SUBSCRIPTION,
        copies,
        dead: dead_letters(&courier, STREAM_SUBSCRIPTION, &events).await?,
    }];
    if let Some(nats) = &nats {
        downstreams.push(Downstream {
            name: format!("JetStream stream {} ({})", nats.stream, nats.subject),
            subscription: NATS_SUBSCRIPTION,
            copies: jetstream_copies(nats, &events).await?,
            dead: dead_letters(&courier, NATS_SUBSCRIPTION, &events).await?,
        });
    }
    Ok(Report {
        events,
        poison,
        downstreams,
    })
}

async fn run(cli: &Cli) -> anyhow::Result<Report> {
    if cli.poison >= cli.count.max(1) {
        bail!(
            "--poison {} must be below --count {}: a poison event needs batch-mates",
            cli.poison,
            cli.count
        );
    }
    let run_tag = Uuid::new_v4().simple().to_string()[..12].to_owned();
    // The servers first: one that is unreachable stops the run before
    // anything is written.
    let (events_stream, nats) = downstreams(cli, &run_tag).await?;
    if cli.database_url.starts_with("postgres://") || cli.database_url.starts_with("postgresql://")
    {
        // Courier's tables and `orders` in one schema: the relays'
        // transactions come from this pool, so its search_path is the schema.
        courier::postgres::validate_schema(&cli.schema)?;
        // Courier's options (JIT off), and the example's own schema.
        let options = courier::postgres::connect_options(&cli.database_url)?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(courier::POSTGRES_CONNECTIONS)
            .connect_with(options.options([("search_path", cli.schema.as_str())]))
            .await?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", cli.schema))
            .execute(&pool)
            .await?;
        let courier = Courier::from_postgres_store(PgStore::with_schema(pool, &cli.schema)?);
        courier.migrate().await?;
        run_with(courier, cli, events_stream, nats).await
    } else {
        let courier = Courier::connect_sqlite(&cli.database_url).await?;
        courier.migrate().await?;
        run_with(courier, cli, events_stream, nats).await
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,outbox_relay=info")),
        )
        .init();
    let cli = Cli::parse();
    if !cli.enabled {
        tracing::info!("relay disabled");
        return Ok(());
    }
    let report = run(&cli).await?;
    let expected = report.events.len() - report.poison.len();
    println!(
        "placed {} orders, one event each, {} of them poison",
        report.events.len(),
        report.poison.len()
    );
    for downstream in &report.downstreams {
        println!(
            "{}: {} entries for {} events (expected {expected}); {} dead-lettered by {} (expected {})",
            downstream.name,
            downstream.entries(),
            downstream.copies.len(),
            downstream.dead.len(),
            downstream.subscription,
            report.poison.len()
        );
    }
    let problems = report.problems();
    if !problems.is_empty() {
        for problem in &problems {
            println!("mismatch: {problem}");
        }
        bail!("downstream counts differ from the events placed");
    }
    println!(
        "ok: every event reached each downstream exactly once; every poison event was dead-lettered"
    );
    Ok(())
}
