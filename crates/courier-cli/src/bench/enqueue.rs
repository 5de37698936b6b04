//! Enqueue: producers writing messages for a fixed time, on Courier and on
//! the hand-written baseline. One subscription is registered, so each message
//! costs what it costs in production: the insert plus one fanned-out delivery.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{Courier, DeadLetterStore, NewMessage, OutboxStore, SubscriptionSpec};

use super::baseline::Baseline;
use super::fixture::{BenchPayload, Fixture};
use super::measure::{Counter, Progress};
use super::{Measurement, Plan, Throughput};

const TOPIC: &str = "bench.enqueue";
const TENANT: &str = "bench";

#[derive(Debug, Clone, Copy)]
enum Case {
    /// `producers` tasks, each committing one message per transaction.
    Single { producers: usize },
    /// One producer committing `size` messages per transaction.
    Batch { size: usize },
}

impl Case {
    fn id(self) -> String {
        match self {
            Self::Single { producers } => format!("enqueue.single_{producers}"),
            Self::Batch { size } => format!("enqueue.batch_{size}"),
        }
    }

    fn label(self) -> String {
        match self {
            Self::Single { producers: 1 } => "1 producer, 1 msg per tx".to_owned(),
            Self::Single { producers } => format!("{producers} producers, 1 msg per tx"),
            Self::Batch { size } => format!("1 producer, enqueue_batch of {size} per tx"),
        }
    }

    fn producers(self) -> usize {
        match self {
            Self::Single { producers } => producers,
            Self::Batch { .. } => 1,
        }
    }

    fn per_transaction(self) -> usize {
        match self {
            Self::Single { .. } => 1,
            Self::Batch { size } => size,
        }
    }
}

pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    for case in [
        Case::Single { producers: 1 },
        Case::Single { producers: 16 },
        Case::Batch { size: 1000 },
    ] {
        let baseline = if plan.baseline {
            drop(fixture.fresh().await?);
            let baseline = fixture.baseline()?;
            Some(
                timed(plan, &format!("baseline {}", case.id()), case, move |seq| {
                    let baseline = baseline.clone();
                    async move { baseline_transaction(&baseline, case, seq).await }
                })
                .await
                .with_context(|| format!("baseline {}", case.id()))?,
            )
        } else {
            None
        };
        let courier = fixture.fresh().await?;
        courier
            .store()
            .register_subscription(&SubscriptionSpec {
                name: "bench_enqueue".to_owned(),
                topics: vec![TOPIC.to_owned()],
                replay: None,
            })
            .await?;
        let result = timed(plan, &case.id(), case, move |seq| {
            let courier = courier.clone();
            async move { courier_transaction(&courier, case, seq).await }
        })
        .await
        .with_context(|| case.id())?;
        out.push(Measurement::throughput(
            &case.id(),
            &case.label(),
            result,
            baseline,
        ));
    }
    Ok(())
}

fn payload(seq: u64) -> anyhow::Result<String> {
    Ok(serde_json::to_string(&BenchPayload { seq })?)
}

async fn courier_transaction<S: OutboxStore + DeadLetterStore>(
    courier: &Courier<S>,
    case: Case,
    first_seq: u64,
) -> anyhow::Result<()> {
    let messages = (0..case.per_transaction() as u64)
        .map(|i| NewMessage::new(TENANT, TOPIC, &BenchPayload { seq: first_seq + i }))
        .collect::<Result<Vec<_>, _>>()?;
    courier.publish(&messages).await?;
    Ok(())
}

async fn baseline_transaction(
    baseline: &Baseline,
    case: Case,
    first_seq: u64,
) -> anyhow::Result<()> {
    match case {
        Case::Single { .. } => {
            baseline
                .insert_one(TENANT, TOPIC, &payload(first_seq)?)
                .await
        }
        Case::Batch { size } => {
            let rows = (0..size as u64)
                .map(|i| Ok((TENANT.to_owned(), TOPIC.to_owned(), payload(first_seq + i)?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            baseline.insert_batch(&rows).await
        }
    }
}

/// Runs `transaction` from the case's producers until the plan's time is up;
/// counts the messages committed. A transaction gets its first message's
/// sequence number.
async fn timed<T, Fut>(
    plan: &Plan,
    label: &str,
    case: Case,
    transaction: T,
) -> anyhow::Result<Throughput>
where
    T: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let counter = Counter::new(u64::MAX);
    let shown = Arc::clone(&counter);
    let progress = Progress::start(plan.progress, label, None, move || shown.count());
    let per_transaction = case.per_transaction() as u64;
    let producers = case.producers();
    let started = Instant::now();
    let deadline = started + plan.enqueue_for;
    let mut tasks = tokio::task::JoinSet::new();
    for producer in 0..producers as u64 {
        let transaction = transaction.clone();
        let counter = Arc::clone(&counter);
        tasks.spawn(async move {
            let mut seq = producer << 40;
            while Instant::now() < deadline {
                transaction(seq).await?;
                seq += per_transaction;
                counter.add(per_transaction);
            }
            anyhow::Ok(())
        });
    }
    let joined = tokio::time::timeout(plan.enqueue_for + Duration::from_secs(60), async {
        while let Some(result) = tasks.join_next().await {
            result.context("a producer panicked")??;
        }
        anyhow::Ok(())
    })
    .await;
    let elapsed = started.elapsed();
    progress.finish();
    joined.context("producers did not stop within a minute of their deadline")??;
    Ok(Throughput::new(counter.count(), elapsed))
}
