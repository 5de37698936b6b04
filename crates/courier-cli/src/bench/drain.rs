//! Drain: N messages loaded while no worker runs, then one worker per
//! subscription (the backend's defaults, or `--concurrency`/`--batch-size`) handles them all; the time runs from the
//! workers' start until every handler has returned and every outcome is
//! settled (the workers have shut down). Afterwards the deliveries table
//! must be empty, and for the exactly-once case every effect row present.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{
    handler_fn, Courier, DeadLetterStore, HandlerError, Message, NewMessage, OutboxStore, Worker,
};

use super::fixture::{BenchPayload, Fixture};
use super::measure::{peak_rss_kib, reset_peak_rss, Counter, Progress};
use super::processes;
use super::{Measurement, Plan, Throughput};

/// The topic every drain case publishes to.
pub(crate) const TOPIC: &str = "bench.drain";
/// Messages per transaction while loading.
pub(crate) const LOAD_BATCH: u64 = 1000;
const ORDERING_KEYS: u64 = 1000;
const TENANTS: u64 = 50;
/// One message in this many fails in the failing exactly-once case.
const FAIL_EVERY: u64 = 100;
/// One message in this many has a priority above 0 in the priorities case.
const URGENT_EVERY: u64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Noop,
    ExactlyOnce,
    ExactlyOnceFailing,
    TwoSubscriptions,
    OrderingKeys,
    Tenants,
    Priorities,
}

impl Case {
    fn id(self) -> &'static str {
        match self {
            Self::Noop => "drain.noop",
            Self::ExactlyOnce => "drain.exactly_once",
            Self::ExactlyOnceFailing => "drain.exactly_once_failing",
            Self::TwoSubscriptions => "drain.two_subscriptions",
            Self::OrderingKeys => "drain.ordering_keys",
            Self::Tenants => "drain.tenants",
            Self::Priorities => "drain.priorities",
        }
    }

    fn label(self) -> String {
        match self {
            Self::Noop => "no-op handler".to_owned(),
            Self::ExactlyOnce => "exactly-once: tx handler writes row + receipt".to_owned(),
            Self::ExactlyOnceFailing => {
                format!("exactly-once, 1 in {FAIL_EVERY} failing (dead-lettered)")
            }
            Self::TwoSubscriptions => "2 subscriptions on 1 topic (deliveries/s)".to_owned(),
            Self::OrderingKeys => format!("no-op, {ORDERING_KEYS} ordering keys"),
            Self::Tenants => format!("no-op, {TENANTS} tenants"),
            Self::Priorities => format!("no-op, 1 in {URGENT_EVERY} at priority 1-9"),
        }
    }

    fn subscriptions(self) -> &'static [&'static str] {
        match self {
            Self::TwoSubscriptions => &["bench_a", "bench_b"],
            _ => &["bench"],
        }
    }

    fn message(self, seq: u64) -> anyhow::Result<NewMessage> {
        let tenant = match self {
            Self::Tenants => format!("tenant-{:02}", seq % TENANTS),
            _ => "bench".to_owned(),
        };
        let message = NewMessage::new(tenant, TOPIC, &BenchPayload { seq })?;
        Ok(match self {
            Self::OrderingKeys => message.with_ordering_key(format!("key-{}", seq % ORDERING_KEYS)),
            Self::Priorities if seq.is_multiple_of(URGENT_EVERY) => {
                // 1 to 9 in turn, so every priority has messages.
                let level = (seq / URGENT_EVERY) % 9 + 1;
                message.with_priority(i16::try_from(level).unwrap_or(1))
            }
            _ => message,
        })
    }
}

/// The in-process cases, then [`processes`]'s (with `worker_program`, the
/// `courier` executable to start `courier bench-worker` from).
pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    worker_program: Option<&Path>,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let baseline = if plan.baseline {
        Some(
            drain_baseline(fixture, plan)
                .await
                .context("baseline drain")?,
        )
    } else {
        None
    };
    for case in [
        Case::Noop,
        Case::ExactlyOnce,
        Case::ExactlyOnceFailing,
        Case::TwoSubscriptions,
        Case::OrderingKeys,
        Case::Tenants,
        Case::Priorities,
    ] {
        let measurement = drain(fixture, plan, case, baseline)
            .await
            .with_context(|| case.id())?;
        out.push(measurement);
    }
    processes::run(fixture, plan, worker_program, baseline, out).await
}

/// Generous: a drain slower than 100 messages a second is broken, not slow.
pub(crate) fn time_limit(deliveries: u64) -> Duration {
    Duration::from_secs(60 + deliveries / 100)
}

async fn drain_baseline<F: Fixture>(fixture: &mut F, plan: &Plan) -> anyhow::Result<Throughput> {
    drop(fixture.fresh().await?);
    let baseline = fixture.baseline()?;
    let loaded = Counter::new(plan.messages);
    let shown = Arc::clone(&loaded);
    let progress = Progress::start(
        plan.progress,
        "loading baseline",
        Some(plan.messages),
        move || shown.count(),
    );
    let mut seq = 0;
    while seq < plan.messages {
        let size = LOAD_BATCH.min(plan.messages - seq);
        let rows = (seq..seq + size)
            .map(|s| {
                Ok((
                    "bench".to_owned(),
                    TOPIC.to_owned(),
                    serde_json::to_string(&BenchPayload { seq: s })?,
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        baseline.insert_batch(&rows).await?;
        loaded.add(size);
        seq += size;
    }
    progress.finish();
    fixture.analyze().await?;
    let drained = Counter::new(plan.messages);
    let shown = Arc::clone(&drained);
    let progress = Progress::start(
        plan.progress,
        "baseline drain",
        Some(plan.messages),
        move || shown.count(),
    );
    let result = baseline.drain(&drained, time_limit(plan.messages)).await;
    progress.finish();
    let result = result?;
    if result.count != plan.messages {
        anyhow::bail!("drained {} rows of {}", result.count, plan.messages);
    }
    Ok(result)
}

async fn load<S: OutboxStore + DeadLetterStore>(
    courier: &Courier<S>,
    plan: &Plan,
    case: Case,
) -> anyhow::Result<()> {
    publish_all(
        courier,
        plan,
        &format!("loading {}", case.id()),
        plan.messages,
        |seq| case.message(seq),
    )
    .await
}

/// Loads the no-op case's backlog: `plan.messages` messages, as
/// `drain.noop` gets them.
pub(crate) async fn load_noop<S: OutboxStore + DeadLetterStore>(
    courier: &Courier<S>,
    plan: &Plan,
    label: &str,
) -> anyhow::Result<()> {
    publish_all(courier, plan, label, plan.messages, |seq| {
        Case::Noop.message(seq)
    })
    .await
}

/// The note of a drain whose handlers ran `handled` times for `deliveries`
/// deliveries, if those differ. Either cause is by design, and neither
/// applies an effect twice: a transactional group that a failing handler
/// rolled back runs its other handlers again (the failing case does this
/// on purpose), and a delivery whose outcome could not be written is handled
/// again once its lease lapses.
pub(crate) fn redelivered_note(handled: u64, deliveries: u64) -> Option<String> {
    (handled != deliveries).then(|| {
        format!(
            "{handled} handler calls for {deliveries} deliveries: either a transactional group rolled back by a failing handler ran its others again, or an outcome not written was handled again after its lease"
        )
    })
}

/// Publishes `count` messages made by `message(seq)` for seq in `0..count`,
/// [`LOAD_BATCH`] per transaction through `Courier::publish`, with a progress bar.
pub(crate) async fn publish_all<S: OutboxStore + DeadLetterStore>(
    courier: &Courier<S>,
    plan: &Plan,
    label: &str,
    count: u64,
    message: impl Fn(u64) -> anyhow::Result<NewMessage>,
) -> anyhow::Result<()> {
    let loaded = Counter::new(count);
    let shown = Arc::clone(&loaded);
    let progress = Progress::start(plan.progress, label, Some(count), move || shown.count());
    let mut seq = 0;
    let mut published = Ok(());
    while seq < count {
        let size = LOAD_BATCH.min(count - seq);
        let batch = (seq..seq + size)
            .map(&message)
            .collect::<anyhow::Result<Vec<_>>>();
        published = match batch {
            Ok(batch) => courier.publish(&batch).await.map(drop).map_err(Into::into),
            Err(error) => Err(error),
        };
        if published.is_err() {
            break;
        }
        loaded.add(size);
        seq += size;
    }
    progress.finish();
    published
}

async fn drain<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    case: Case,
    baseline: Option<Throughput>,
) -> anyhow::Result<Measurement> {
    let courier = fixture.fresh().await?;
    let deliveries = plan.messages * case.subscriptions().len() as u64;
    let counter = Counter::new(deliveries);
    // Building a worker registers its subscription, which must exist before
    // the messages are enqueued for them to fan out to it.
    let mut workers: Vec<Worker<F::Store>> = Vec::new();
    for subscription in case.subscriptions() {
        let builder = plan.configure(courier.worker(*subscription));
        let builder = if case == Case::ExactlyOnce {
            builder.handle_transactional(TOPIC, 1, fixture.effects(Arc::clone(&counter), None))
        } else if case == Case::ExactlyOnceFailing {
            builder.handle_transactional(
                TOPIC,
                1,
                fixture.effects(Arc::clone(&counter), Some(FAIL_EVERY)),
            )
        } else {
            let counter = Arc::clone(&counter);
            builder.handle(
                TOPIC,
                1,
                handler_fn(move |_message: Message<BenchPayload>| {
                    counter.hit();
                    async { Ok::<(), HandlerError>(()) }
                }),
            )
        };
        workers.push(builder.build().await?);
    }
    load(&courier, plan, case).await?;
    fixture.analyze().await?;

    let shown = Arc::clone(&counter);
    let progress = Progress::start(plan.progress, case.id(), Some(deliveries), move || {
        shown.count()
    });
    let rss_reset = reset_peak_rss();
    let started = Instant::now();
    let handles: Vec<_> = workers.into_iter().map(Worker::start).collect();
    let limit = time_limit(deliveries);
    // Every delivery has reached a handler; the drain is over when every
    // outcome is settled too. A settle that failed leaves its delivery to
    // be rescued after its lease and handled again, which this wait includes.
    let finished = tokio::time::timeout(limit, async {
        counter.reached().await;
        loop {
            // Dead letters stay (the failing case makes some on purpose).
            let left = fixture.deliveries_open().await?;
            if left == 0 {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    for handle in handles {
        handle.shutdown().await;
    }
    let elapsed = started.elapsed();
    progress.finish();
    let peak_rss = peak_rss_kib();
    match finished {
        Ok(waited) => waited?,
        Err(_) => {
            let left = fixture.deliveries_left().await?;
            anyhow::bail!(
                "{left} of {deliveries} deliveries left after {limit:?} ({} handler calls)",
                counter.count()
            );
        }
    }
    let left = fixture.deliveries_open().await?;
    if left != 0 {
        anyhow::bail!("{left} deliveries were left after the drain");
    }
    let refused = if case == Case::ExactlyOnceFailing {
        plan.messages.div_ceil(FAIL_EVERY)
    } else {
        0
    };
    let dead = fixture.deliveries_left().await?;
    if u64::try_from(dead).ok() != Some(refused) {
        anyhow::bail!("{dead} deliveries dead-lettered, {refused} expected");
    }
    if matches!(case, Case::ExactlyOnce | Case::ExactlyOnceFailing) {
        let effects = fixture.effects_written().await?;
        if u64::try_from(effects).ok() != Some(plan.messages - refused) {
            anyhow::bail!(
                "{effects} effect rows written for {} messages",
                plan.messages - refused
            );
        }
    }
    let mut measurement = Measurement::throughput(
        case.id(),
        &case.label(),
        Throughput::new(deliveries, elapsed),
        baseline,
    );
    measurement.peak_rss_kib = peak_rss;
    let handled = counter.count();
    if let Some(note) = redelivered_note(handled, deliveries) {
        measurement.note = Some(note);
    } else if !rss_reset {
        measurement.note = Some("peak RSS covers the whole process lifetime".to_owned());
    }
    Ok(measurement)
}
