//! Fairness: one big tenant's backlog, drained by one worker, first alone
//! (the solo rate) and then, on a fresh database, while 50 small tenants
//! each publish 1 message a second from a producer task of their own for as
//! long as the big tenant's drain lasts.
//!
//! Measured: the big tenant's rate in both runs (time from the worker's
//! start to its backlog's last handler start) and their ratio, and the small
//! tenants' commit → handler start, sampled as in the latency scenario (the
//! producer's commit returning → the handler starting; a handler that starts
//! first counts as 0 ms and is noted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{handler_fn, HandlerError, Message, NewMessage, Worker};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use super::drain::{publish_all, time_limit};
use super::fixture::{BenchPayload, Fixture};
use super::measure::{percentiles, Counter, Progress};
use super::{Measurement, Plan, Throughput};

const TOPIC: &str = "bench.fairness";
const BIG_TENANT: &str = "big";
/// Tenants trickling next to the big one.
pub(crate) const SMALL_TENANTS: u64 = 50;
/// Time between two messages of one small tenant.
const SMALL_INTERVAL: Duration = Duration::from_secs(1);
/// Small tenants' messages are numbered from here; the big tenant's below.
const SMALL_BASE: u64 = 1 << 40;

pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let solo = phase(fixture, plan, false).await.context("fairness.solo")?;
    let shared = phase(fixture, plan, true).await.context("fairness.big")?;
    out.push(Measurement::throughput(
        "fairness.solo",
        "big tenant's backlog alone",
        solo.big,
        None,
    ));
    let mut big = Measurement::throughput(
        "fairness.big",
        &format!("big tenant while {SMALL_TENANTS} tenants trickle"),
        shared.big,
        Some(solo.big),
    );
    big.note = Some("baseline here = fairness.solo; ratio = big tenant's rate / solo".to_owned());
    out.push(big);
    let mut samples = shared.samples;
    let summary = percentiles(&mut samples).context("fairness: no small-tenant samples")?;
    let mut small = Measurement::latency(
        "fairness.small",
        &format!("{SMALL_TENANTS} small tenants at 1 msg/s: commit → start"),
        samples.len() as u64,
        shared.big.elapsed.as_secs_f64(),
        summary,
    );
    if shared.early > 0 {
        small.note = Some(format!(
            "{} handler starts came before the producer saw its commit; counted as 0 ms",
            shared.early
        ));
    }
    out.push(small);
    Ok(())
}

/// What one run found.
struct Phase {
    /// The big tenant's backlog over the time to its last handler start.
    big: Throughput,
    /// Small tenants' commit → handler start.
    samples: Vec<Duration>,
    /// Small-tenant handlers that started before their producer saw the commit.
    early: usize,
}

/// Handler starts of the small tenants' messages, by sequence number.
type Starts = Arc<Mutex<HashMap<u64, Instant>>>;

async fn phase<F: Fixture>(fixture: &mut F, plan: &Plan, trickle: bool) -> anyhow::Result<Phase> {
    let courier = fixture.fresh().await?;
    let backlog = plan.fairness_messages;
    let big = Counter::new(backlog);
    let starts: Starts = Arc::new(Mutex::new(HashMap::new()));
    let handler_big = Arc::clone(&big);
    let handler_starts = Arc::clone(&starts);
    let worker: Worker<F::Store> = plan
        .configure(courier.worker("bench"))
        .handle(
            TOPIC,
            1,
            handler_fn(move |message: Message<BenchPayload>| {
                let now = Instant::now();
                let seq = message.payload.seq;
                if seq >= SMALL_BASE {
                    handler_starts
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(seq)
                        .or_insert(now);
                } else {
                    handler_big.hit();
                }
                async { Ok::<(), HandlerError>(()) }
            }),
        )
        .build()
        .await?;
    let label = if trickle {
        "fairness.big"
    } else {
        "fairness.solo"
    };
    publish_all(
        &courier,
        plan,
        &format!("loading {label}"),
        backlog,
        |seq| Ok(NewMessage::new(BIG_TENANT, TOPIC, &BenchPayload { seq })?),
    )
    .await?;
    fixture.analyze().await?;

    let shown = Arc::clone(&big);
    let progress = Progress::start(plan.progress, label, Some(backlog), move || shown.count());
    let commits: Starts = Arc::new(Mutex::new(HashMap::new()));
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let handle = worker.start();
    let mut producers = tokio::task::JoinSet::new();
    if trickle {
        let next = Arc::new(AtomicU64::new(SMALL_BASE));
        for tenant in 0..SMALL_TENANTS {
            let courier = courier.clone();
            let commits = Arc::clone(&commits);
            let next = Arc::clone(&next);
            let mut stopped = stopped.clone();
            producers.spawn(async move {
                // Spread the tenants over the interval: 50 messages a second, evenly.
                let offset = SMALL_INTERVAL.mul_f64(tenant as f64 / SMALL_TENANTS as f64);
                tokio::select! {
                    _ = tokio::time::sleep(offset) => {}
                    _ = stopped.wait_for(|stop| *stop) => return anyhow::Ok(()),
                }
                let mut ticks = tokio::time::interval(SMALL_INTERVAL);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|stop| *stop) => return anyhow::Ok(()),
                        _ = ticks.tick() => {}
                    }
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    let message = NewMessage::new(
                        format!("small-{tenant:02}"),
                        TOPIC,
                        &BenchPayload { seq },
                    )?;
                    courier.publish(&[message]).await?;
                    commits
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(seq, Instant::now());
                }
            });
        }
    }
    let limit = time_limit(backlog);
    let drained = tokio::time::timeout(limit, big.reached()).await;
    let big_elapsed = started.elapsed();
    // Stop the trickle (a send fails only if every producer is gone already).
    let _ = stop.send(true);
    let mut produced = Ok(());
    while let Some(joined) = producers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => produced = Err(error),
            Err(error) => produced = Err(anyhow::Error::new(error).context("a producer panicked")),
        }
    }
    // Every small message published must reach its handler, and every
    // delivery be settled, before the worker stops.
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let published = commits.lock().unwrap_or_else(PoisonError::into_inner).len();
            let handled = starts.lock().unwrap_or_else(PoisonError::into_inner).len();
            if handled >= published && fixture.deliveries_left().await? == 0 {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    handle.shutdown().await;
    progress.finish();
    produced?;
    if drained.is_err() {
        anyhow::bail!(
            "{} of {backlog} big-tenant messages handled after {limit:?}",
            big.count()
        );
    }
    match settled {
        Ok(result) => result?,
        Err(_) => {
            let left = fixture.deliveries_left().await?;
            anyhow::bail!("{left} deliveries left a minute after the big tenant's drain");
        }
    }
    let commits = commits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let starts = starts
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut early = 0;
    let samples = commits
        .iter()
        .filter_map(|(seq, commit)| {
            let start = starts.get(seq)?;
            if start < commit {
                early += 1;
            }
            Some(start.saturating_duration_since(*commit))
        })
        .collect();
    Ok(Phase {
        big: Throughput::new(backlog, big_elapsed),
        samples,
        early,
    })
}
