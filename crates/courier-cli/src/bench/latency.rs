//! Latency: a steady trickle of single-message transactions into an idle
//! worker. Each sample is the time from the producer seeing its commit
//! return to the handler starting. A handler may start before the producer
//! sees its commit (the wake-up races the commit's reply); such samples
//! count as zero and are reported in a note.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{handler_fn, HandlerError, Message, NewMessage, WorkerBuilder, WorkerConfig};
use tokio::time::MissedTickBehavior;

use super::fixture::{BenchPayload, Fixture};
use super::measure::{percentiles, Counter, Progress};
use super::{Measurement, Plan};

const TOPIC: &str = "bench.latency";

pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    for woken in [true, false] {
        let measurement = latency(fixture, plan, woken).await.with_context(|| {
            if woken {
                "latency.wake"
            } else {
                "latency.poll"
            }
        })?;
        out.push(measurement);
    }
    Ok(())
}

async fn latency<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    woken: bool,
) -> anyhow::Result<Measurement> {
    let courier = fixture.fresh().await?;
    let backend_wake = if fixture
        .describe()
        .await?
        .iter()
        .any(|(_, v)| v == "postgres")
    {
        "LISTEN/NOTIFY"
    } else {
        "in-process signal"
    };
    let poll = WorkerConfig::default().poll_interval;
    let (id, case) = if woken {
        (
            "latency.wake",
            format!("idle worker woken by {backend_wake}"),
        )
    } else {
        (
            "latency.poll",
            format!("idle worker polling every {poll:?} (default)"),
        )
    };
    let count = usize::try_from(u64::from(plan.rate) * plan.latency_for.as_secs().max(1))?;
    let starts: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; count]));
    let counter = Counter::new(count as u64);
    let builder = if woken {
        courier.worker("bench")
    } else {
        WorkerBuilder::new(courier.store().clone(), "bench")
    };
    let handler_starts = Arc::clone(&starts);
    let handler_counter = Arc::clone(&counter);
    let worker = builder
        .handle(
            TOPIC,
            1,
            handler_fn(move |message: Message<BenchPayload>| {
                let now = Instant::now();
                if let Ok(index) = usize::try_from(message.payload.seq) {
                    let mut starts = handler_starts
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if let Some(slot) = starts.get_mut(index) {
                        if slot.is_none() {
                            *slot = Some(now);
                            handler_counter.hit();
                        }
                    }
                }
                async { Ok::<(), HandlerError>(()) }
            }),
        )
        .build()
        .await?
        .start();
    // Let the worker find nothing and go idle (and the LISTEN connection open).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let shown = Arc::clone(&counter);
    let progress = Progress::start(plan.progress, id, Some(count as u64), move || shown.count());
    let mut commits = Vec::with_capacity(count);
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(plan.rate)));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut produced: anyhow::Result<()> = Ok(());
    for seq in 0..count as u64 {
        ticks.tick().await;
        let message = NewMessage::new("bench", TOPIC, &BenchPayload { seq })?;
        if let Err(error) = courier.publish(&[message]).await {
            produced = Err(error.into());
            break;
        }
        commits.push(Instant::now());
    }
    let limit = poll * 2 + Duration::from_secs(30);
    let finished = if produced.is_ok() {
        tokio::time::timeout(limit, counter.reached()).await.is_ok()
    } else {
        false
    };
    worker.shutdown().await;
    progress.finish();
    produced?;
    if !finished {
        anyhow::bail!(
            "{} of {count} messages reached a handler within {limit:?}",
            counter.count()
        );
    }
    let starts = starts
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut early = 0usize;
    let mut samples: Vec<Duration> = commits
        .iter()
        .zip(starts.iter())
        .filter_map(|(commit, start)| {
            let start = (*start)?;
            if start < *commit {
                early += 1;
            }
            Some(start.saturating_duration_since(*commit))
        })
        .collect();
    let summary = percentiles(&mut samples).context("no latency samples")?;
    let seconds = match (commits.first(), commits.last()) {
        (Some(first), Some(last)) => last.duration_since(*first).as_secs_f64(),
        _ => 0.0,
    };
    let mut measurement = Measurement::latency(id, &case, samples.len() as u64, seconds, summary);
    measurement.note = (early > 0).then(|| {
        format!("{early} handler starts came before the producer saw its commit; counted as 0 ms")
    });
    Ok(measurement)
}
