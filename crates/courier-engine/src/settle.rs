//! Settling outcomes: completions, failures and hand-backs, written in batches.
//!
//! Executors send a [`Settlement`] per delivery; the settler drains whatever
//! is queued into one `complete_many`, one `fail_many` and one `release_many`
//! call, so under load a write covers many deliveries and at idle a single
//! outcome is written at once. Every write is fenced by the lease token: a
//! delivery whose lease was lost is reported back missing and counted.
//!
//! Failure: transient store errors are retried with backoff for a bounded
//! time; if the store stays down the outcomes are dropped and the leases
//! expire, so the deliveries are redelivered (at least once, never lost).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{Failure, LeaseRef, OutboxStore, Snooze, StoreError};
use tokio::sync::{mpsc, Notify};

use crate::in_flight::InFlight;

use crate::metrics_names::{COMPLETED, DEAD_LETTERED, FAILED, LEASES_LOST, SNOOZED, STORE_ERRORS};

/// The most outcomes written in one batch.
pub(crate) const MAX_SETTLE_BATCH: usize = 1000;
/// How many times a transient store error is retried before giving up.
const WRITE_ATTEMPTS: u32 = 12;
const WRITE_BACKOFF_START: Duration = Duration::from_millis(25);
const WRITE_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The outcome of one delivery, waiting to be written.
#[derive(Debug)]
pub(crate) enum Settlement {
    /// The plain handler succeeded: complete (no receipt: only
    /// transactional work writes one, with its effect).
    Complete { lease: LeaseRef, topic: String },
    /// The handler failed: retry later or dead-letter.
    Fail { failure: Failure, topic: String },
    /// The handler asked to be offered the message later: put it back
    /// without spending the attempt.
    Snooze { snooze: Snooze, topic: String },
    /// The handler never started: hand back without spending the attempt.
    Release { lease: LeaseRef },
    /// Already settled inside the handler's transaction.
    Committed { lease: LeaseRef, topic: String },
    /// The lease was lost before the outcome could be written.
    Lost { lease: LeaseRef },
}

impl Settlement {
    /// The claim this outcome is about (a delivery claimed again later has
    /// another lease, and the ledger keeps the two apart).
    pub(crate) fn lease(&self) -> LeaseRef {
        match self {
            Settlement::Complete { lease, .. }
            | Settlement::Release { lease }
            | Settlement::Committed { lease, .. }
            | Settlement::Lost { lease } => *lease,
            Settlement::Fail { failure, .. } => failure.lease,
            Settlement::Snooze { snooze, .. } => snooze.lease,
        }
    }
}

/// Writes queued settlements until every sender is dropped. A delivery's
/// lease stays in `in_flight` (and so keeps its heartbeat) until its outcome
/// is written; `settled` is signalled after each write, since a settled
/// delivery can release the next message of its ordering key.
pub(crate) async fn run<S: OutboxStore>(
    store: S,
    subscription: String,
    mut queue: mpsc::UnboundedReceiver<Settlement>,
    in_flight: InFlight,
    settled: Arc<Notify>,
) {
    let mut batch = Vec::with_capacity(64);
    while let Some(first) = queue.recv().await {
        batch.push(first);
        while batch.len() < MAX_SETTLE_BATCH {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let leases: Vec<LeaseRef> = batch.iter().map(Settlement::lease).collect();
        in_flight.mark_settling(&leases);
        settle_batch(&store, &subscription, std::mem::take(&mut batch)).await;
        in_flight.untrack(&leases);
        settled.notify_one();
    }
}

/// Writes one batch of settlements.
pub(crate) async fn settle_batch<S: OutboxStore>(
    store: &S,
    subscription: &str,
    batch: Vec<Settlement>,
) {
    let mut completions = Vec::new();
    let mut failures = Vec::new();
    let mut releases = Vec::new();
    let mut snoozes = Vec::new();
    let mut topics: HashMap<i64, String> = HashMap::new();
    for settlement in batch {
        match settlement {
            Settlement::Complete { lease, topic } => {
                topics.insert(lease.delivery_id, topic);
                completions.push(lease);
            }
            Settlement::Fail { failure, topic } => {
                topics.insert(failure.lease.delivery_id, topic);
                failures.push(failure);
            }
            Settlement::Snooze { snooze, topic } => {
                topics.insert(snooze.lease.delivery_id, topic);
                snoozes.push(snooze);
            }
            Settlement::Release { lease } => releases.push(lease),
            Settlement::Committed { topic, .. } => {
                metrics::counter!(COMPLETED, "subscription" => subscription.to_owned(), "topic" => topic)
                    .increment(1);
            }
            Settlement::Lost { .. } => {
                metrics::counter!(LEASES_LOST, "subscription" => subscription.to_owned())
                    .increment(1);
            }
        }
    }
    // By delivery id, like every multi-row write (see InFlight::to_extend).
    completions.sort_unstable_by_key(|l| l.delivery_id);
    failures.sort_unstable_by_key(|f| f.lease.delivery_id);
    releases.sort_unstable_by_key(|l| l.delivery_id);
    snoozes.sort_unstable_by_key(|z| z.lease.delivery_id);
    let topic_of = |id: i64| topics.get(&id).cloned().unwrap_or_default();

    if !completions.is_empty() {
        if let Some(applied) = with_retries("complete", subscription, || {
            store.complete_many(&completions)
        })
        .await
        {
            for id in &applied {
                metrics::counter!(COMPLETED, "subscription" => subscription.to_owned(), "topic" => topic_of(*id))
                    .increment(1);
            }
            note_lost(subscription, "complete", completions.len(), applied.len());
        }
    }
    if !failures.is_empty() {
        let applied = with_retries("fail", subscription, || store.fail_many(&failures)).await;
        count_returned(
            subscription,
            "fail",
            FAILED,
            failures.len(),
            applied,
            &topic_of,
        );
    }
    if !snoozes.is_empty() {
        let applied = with_retries("snooze", subscription, || store.snooze_many(&snoozes)).await;
        count_returned(
            subscription,
            "snooze",
            SNOOZED,
            snoozes.len(),
            applied,
            &topic_of,
        );
    }
    if !releases.is_empty() {
        if let Some(applied) =
            with_retries("release", subscription, || store.release_many(&releases)).await
        {
            tracing::debug!(
                subscription,
                released = applied.len(),
                "handed back unstarted deliveries"
            );
        }
    }
}

/// Counts what a fail or snooze write applied (`counter` per delivery, and
/// the dead letters among them) and what it lost.
fn count_returned(
    subscription: &str,
    operation: &'static str,
    counter: &'static str,
    asked: usize,
    applied: Option<Vec<courier_core::FailureApplied>>,
    topic_of: &dyn Fn(i64) -> String,
) {
    let Some(applied) = applied else {
        return;
    };
    for result in &applied {
        let topic = topic_of(result.delivery_id);
        metrics::counter!(counter, "subscription" => subscription.to_owned(), "topic" => topic.clone())
            .increment(1);
        if result.dead {
            tracing::warn!(
                subscription,
                operation,
                delivery_id = result.delivery_id,
                topic,
                "dead-lettered"
            );
            metrics::counter!(DEAD_LETTERED, "subscription" => subscription.to_owned(), "topic" => topic)
                .increment(1);
        }
    }
    note_lost(subscription, operation, asked, applied.len());
}

fn note_lost(subscription: &str, operation: &str, asked: usize, applied: usize) {
    let lost = asked.saturating_sub(applied);
    if lost > 0 {
        tracing::warn!(
            subscription,
            operation,
            lost,
            "leases lost before settling; the deliveries will be retried"
        );
        metrics::counter!(LEASES_LOST, "subscription" => subscription.to_owned())
            .increment(u64::try_from(lost).unwrap_or(u64::MAX));
    }
}

/// Runs `write`, retrying transient errors with capped backoff.
pub(crate) async fn with_retries<T, F, Fut>(
    operation: &'static str,
    subscription: &str,
    mut write: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = WRITE_BACKOFF_START;
    for attempt in 1..=WRITE_ATTEMPTS {
        match write().await {
            Ok(value) => return Some(value),
            Err(error) => {
                metrics::counter!(STORE_ERRORS, "operation" => operation).increment(1);
                if !error.is_transient() || attempt == WRITE_ATTEMPTS {
                    tracing::error!(subscription, operation, %error, "could not write outcomes; leases will expire and the deliveries will be retried");
                    return None;
                }
                tracing::warn!(subscription, operation, %error, attempt, "store write failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(WRITE_BACKOFF_MAX);
            }
        }
    }
    None
}
