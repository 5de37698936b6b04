//! Held xmin (PostgreSQL only): one worker kept busy, first as is and then
//! while another connection holds a `REPEATABLE READ` transaction open
//! (`BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`), whose snapshot keeps
//! every row version deleted or updated after it from being cleaned up.
//!
//! The worker must never wait for work, or the measurement would be the
//! producers' rate: producer tasks keep a backlog of at least
//! [`low_water`] messages (topping it up 1,000 per transaction whenever
//! published minus handled falls below it), so what is measured is the rate
//! the worker sustains. Measured: messages handled per second over a window
//! before the hold and over the same length at the end of the hold, their
//! ratio (the loss), the deliveries table's dead tuples (statistics, which
//! backends flush about once a second) and the age of the held xmin, and a
//! probe's claim round trip (a claim of 1 row every 200 ms on the same
//! subscription, completed at once) in both windows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::postgres::PgStore;
use courier::{
    handler_fn, ClaimParams, ClaimedDelivery, Courier, HandlerError, LeaseRef, Message, NewMessage,
    OutboxStore, RetryPolicy, Route,
};
use sqlx::PgPool;
use tokio::sync::watch;

use super::drain::LOAD_BATCH;
use super::fixture::{BenchPayload, Fixture};
use super::measure::{percentiles, Counter, Progress};
use super::{Measurement, Plan, Throughput};

const TOPIC: &str = "bench.xmin";
const SUBSCRIPTION: &str = "bench";
/// Producer tasks topping up the backlog.
const PRODUCERS: usize = 2;
/// Time between two probe claims.
const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The backlog the producers keep at least: enough for many full claims.
fn low_water(plan: &Plan) -> u64 {
    if plan.quick {
        5_000
    } else {
        20_000
    }
}

/// How long the worker runs before the first window.
fn warm_up(plan: &Plan) -> Duration {
    if plan.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(3)
    }
}

pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    drop(fixture.fresh().await?);
    let Some((pool, schema)) = fixture.postgres() else {
        out.push(Measurement::skipped(
            "held_xmin.held",
            "drain while a REPEATABLE READ tx is open",
            "skipped: PostgreSQL only (SQLite has no snapshot horizon to hold back)",
        ));
        return Ok(());
    };
    let (pool, schema) = (pool.clone(), schema.to_owned());
    let courier = Courier::postgres_with_schema(pool.clone(), &schema)?;
    let measured = held(&courier, &pool, &schema, plan)
        .await
        .context("held_xmin")?;
    out.extend(measured);
    Ok(())
}

/// One probe claim: when it was taken and how long the round trip took.
type Probes = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// The lowest backlog the probe saw, per window.
type LowestBacklog = Arc<Mutex<Vec<(Instant, u64)>>>;

async fn held(
    courier: &Courier<PgStore>,
    pool: &PgPool,
    schema: &str,
    plan: &Plan,
) -> anyhow::Result<Vec<Measurement>> {
    let handled = Counter::new(u64::MAX);
    let handler_count = Arc::clone(&handled);
    let worker = plan
        .configure(courier.worker(SUBSCRIPTION))
        .handle(
            TOPIC,
            1,
            handler_fn(move |_message: Message<BenchPayload>| {
                handler_count.hit();
                async { Ok::<(), HandlerError>(()) }
            }),
        )
        .build()
        .await?;
    let low = low_water(plan);
    let produced = Arc::new(AtomicU64::new(0));
    // Load the first backlog before the worker starts.
    top_up(courier, &produced, &handled, low + LOAD_BATCH, 0).await?;
    sqlx::query(&format!("ANALYZE {schema}.messages, {schema}.deliveries"))
        .execute(pool)
        .await
        .context("analyzing")?;

    let (stop, stopped) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for producer in 0..PRODUCERS {
        let courier = courier.clone();
        let produced = Arc::clone(&produced);
        let handled = Arc::clone(&handled);
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|stop| *stop) => return anyhow::Ok(()),
                    topped = top_up(&courier, &produced, &handled, low, producer as u64) => topped?,
                }
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return anyhow::Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        });
    }
    let probes: Probes = Arc::new(Mutex::new(Vec::new()));
    let backlogs: LowestBacklog = Arc::new(Mutex::new(Vec::new()));
    {
        let store = courier.store().clone();
        let probes = Arc::clone(&probes);
        let backlogs = Arc::clone(&backlogs);
        let produced = Arc::clone(&produced);
        let handled = Arc::clone(&handled);
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            let params = ClaimParams {
                subscription: SUBSCRIPTION.to_owned(),
                routes: vec![Route {
                    topic: TOPIC.to_owned(),
                    schema_version: 1,
                    max_attempts: RetryPolicy::default().max_attempts,
                }],
                limit: 1,
                lease: Duration::from_secs(30),
                worker_id: "bench-probe".to_owned(),
                tenant_cursor: String::new(),
                tenant_in_flight_limit: None,
            };
            let mut ticks = tokio::time::interval(PROBE_EVERY);
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|stop| *stop) => return anyhow::Ok(()),
                    _ = ticks.tick() => {}
                }
                let backlog = produced
                    .load(Ordering::Relaxed)
                    .saturating_sub(handled.count());
                let at = Instant::now();
                let claimed = store.claim(&params).await?;
                let rtt = at.elapsed();
                let done: Vec<LeaseRef> = claimed
                    .deliveries
                    .iter()
                    .map(ClaimedDelivery::lease)
                    .collect();
                let completed = store.complete_many(&done).await?;
                handled.add(completed.len() as u64);
                probes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((at, rtt));
                backlogs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((at, backlog));
            }
        });
    }

    let shown = Arc::clone(&handled);
    let progress = Progress::start(plan.progress, "held_xmin", None, move || shown.count());
    let handle = worker.start();
    let outcome = windows(pool, schema, plan, &handled, &mut tasks).await;
    let _ = stop.send(true);
    let mut stopped_ok = Ok(());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => stopped_ok = Err(error),
            Err(error) => stopped_ok = Err(anyhow::Error::new(error).context("a task panicked")),
        }
    }
    handle.shutdown().await;
    progress.finish();
    let found = outcome?;
    stopped_ok?;

    let probes = probes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let backlogs = backlogs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut measurements = Vec::new();
    for (window, id, case) in [
        (
            &found.before,
            "held_xmin.before",
            "busy worker, no snapshot held",
        ),
        (
            &found.held,
            "held_xmin.held",
            "same, last window of a held REPEATABLE READ",
        ),
    ] {
        let is_held = id == "held_xmin.held";
        let mut measurement = Measurement::throughput(
            id,
            case,
            Throughput::new(window.handled, window.end - window.start),
            is_held.then(|| {
                Throughput::new(found.before.handled, found.before.end - found.before.start)
            }),
        );
        let details = &mut measurement.details;
        details.insert("dead_tuples_at_start".into(), window.dead_at_start as f64);
        details.insert("dead_tuples_at_end".into(), window.dead_at_end as f64);
        details.insert(
            "deliveries_indexes_mb_at_end".into(),
            round2(window.index_bytes_at_end as f64 / 1_048_576.0),
        );
        let mut rtts: Vec<Duration> = probes
            .iter()
            .filter(|(at, _)| *at >= window.start && *at < window.end)
            .map(|(_, rtt)| *rtt)
            .collect();
        if let Some(rtt) = percentiles(&mut rtts) {
            details.insert("probe_claim_p50_ms".into(), round2(rtt.p50_ms));
            details.insert("probe_claim_p99_ms".into(), round2(rtt.p99_ms));
        }
        let lowest = backlogs
            .iter()
            .filter(|(at, _)| *at >= window.start && *at < window.end)
            .map(|(_, backlog)| *backlog)
            .min();
        if let Some(lowest) = lowest {
            details.insert("lowest_backlog".into(), lowest as f64);
        }
        let mut notes = Vec::new();
        if is_held {
            details.insert("held_seconds".into(), found.held_for.as_secs_f64().round());
            if let Some(age) = found.xmin_age {
                details.insert("held_xmin_age_xids".into(), age as f64);
            }
            notes.push(
                "baseline here = held_xmin.before; loss = 1 - ratio; dead tuples from pg_stat_user_tables (flushed about once a second)"
                    .to_owned(),
            );
        }
        if lowest == Some(0) {
            notes.push(
                "the backlog ran empty in this window: the producers, not the worker, set the pace for a while"
                    .to_owned(),
            );
        }
        if !notes.is_empty() {
            measurement.note = Some(notes.join("; "));
        }
        measurements.push(measurement);
    }
    Ok(measurements)
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// Publishes 1,000-message batches until `target` messages wait (published
/// minus handled). `producer` keeps the tasks' sequence numbers apart.
async fn top_up(
    courier: &Courier<PgStore>,
    produced: &AtomicU64,
    handled: &Counter,
    target: u64,
    producer: u64,
) -> anyhow::Result<()> {
    loop {
        let published = produced.load(Ordering::Relaxed);
        if published.saturating_sub(handled.count()) >= target {
            return Ok(());
        }
        let first = (producer << 40) + published;
        let batch = (first..first + LOAD_BATCH)
            .map(|seq| NewMessage::new("bench", TOPIC, &BenchPayload { seq }))
            .collect::<Result<Vec<_>, _>>()?;
        courier.publish(&batch).await?;
        produced.fetch_add(LOAD_BATCH, Ordering::Relaxed);
    }
}

/// One measuring window.
struct Window {
    start: Instant,
    end: Instant,
    handled: u64,
    dead_at_start: i64,
    dead_at_end: i64,
    index_bytes_at_end: i64,
}

/// Both windows, and what the hold looked like.
struct Windows {
    before: Window,
    held: Window,
    held_for: Duration,
    xmin_age: Option<i64>,
}

/// Fails as soon as a producer or the probe fails; otherwise runs until `until`.
async fn sleep_until(
    until: Instant,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::from_std(until);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok(()),
            joined = tasks.join_next(), if !tasks.is_empty() => match joined {
                Some(Ok(Ok(()))) | None => {}
                Some(Ok(Err(error))) => return Err(error),
                Some(Err(error)) => return Err(anyhow::Error::new(error).context("a task panicked")),
            },
        }
    }
}

/// Dead tuples of the deliveries table and the size of its indexes.
async fn table_state(pool: &PgPool, schema: &str) -> anyhow::Result<(i64, i64)> {
    let dead: Option<i64> = sqlx::query_scalar(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'deliveries'",
    )
    .bind(schema)
    .fetch_optional(pool)
    .await
    .context("reading dead tuples")?;
    let index_bytes: i64 = sqlx::query_scalar("SELECT pg_indexes_size(to_regclass($1))")
        .bind(format!("{schema}.deliveries"))
        .fetch_one(pool)
        .await
        .context("reading index sizes")?;
    Ok((dead.unwrap_or(0), index_bytes))
}

async fn windows(
    pool: &PgPool,
    schema: &str,
    plan: &Plan,
    handled: &Counter,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<Windows> {
    let window = plan.xmin_window;
    let start = Instant::now() + warm_up(plan);
    sleep_until(start, tasks).await?;
    let (dead_at_start, _) = table_state(pool, schema).await?;
    let count_at_start = handled.count();
    let end = start + window;
    sleep_until(end, tasks).await?;
    let count_at_end = handled.count();
    let (dead_at_end, index_bytes_at_end) = table_state(pool, schema).await?;
    let before = Window {
        start,
        end,
        handled: count_at_end - count_at_start,
        dead_at_start,
        dead_at_end,
        index_bytes_at_end,
    };

    let mut hold = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .context("opening the held transaction")?;
    // The pool is Courier's, whose sessions end a transaction idle for two
    // minutes; the long transaction stands for an application's (a report,
    // a migration), which no such bound ends.
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *hold)
        .await
        .context("lifting the idle-transaction bound of the held transaction")?;
    sqlx::query("SELECT 1")
        .execute(&mut *hold)
        .await
        .context("taking the held snapshot")?;
    let held_from = Instant::now();
    let held_until = held_from + plan.hold;
    let start = held_until - window;
    let measured = async {
        sleep_until(start, tasks).await?;
        let (dead_at_start, _) = table_state(pool, schema).await?;
        let count_at_start = handled.count();
        sleep_until(held_until, tasks).await?;
        let count_at_end = handled.count();
        let (dead_at_end, index_bytes_at_end) = table_state(pool, schema).await?;
        let xmin_age: Option<i64> = sqlx::query_scalar(
            "SELECT age(backend_xmin)::bigint FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .fetch_optional(&mut *hold)
        .await
        .context("reading the held xmin's age")?
        .flatten();
        anyhow::Ok((
            Window {
                start,
                end: held_until,
                handled: count_at_end - count_at_start,
                dead_at_start,
                dead_at_end,
                index_bytes_at_end,
            },
            xmin_age,
        ))
    }
    .await;
    let held_for = held_from.elapsed();
    hold.rollback()
        .await
        .context("ending the held transaction")?;
    let (held, xmin_age) = measured?;
    Ok(Windows {
        before,
        held,
        held_for,
        xmin_age,
    })
}
