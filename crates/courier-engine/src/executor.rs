//! Running handlers: turns claimed deliveries into settlements.
//!
//! A unit of work is one plain delivery, or a group of up to
//! `transaction_batch_size` transactional deliveries run in one database
//! transaction. Each delivery is decoded for its handler (a payload that does
//! not decode is a permanent failure), its handler runs, and its outcome
//! becomes a [`Settlement`]: complete, already committed, retry, snooze,
//! dead letter, or lost.
//!
//! **Guarded.** Every handler runs under [`Executor::guarded`]: it is
//! cancelled at its timeout (the attempt fails with `timeout after …`), and a
//! margin before its lease could lapse, or as soon as the heartbeat finds the
//! lease lost (see [`crate::in_flight`]), so it has stopped before anyone else
//! can claim its delivery or the next message of its ordering key.
//!
//! **Groups.** A group commits its deliveries together. If a handler fails,
//! the transaction rolls back, that handler's error is its outcome, and the
//! others run again together, each in a savepoint; for [`BATCHING_PAUSE`]
//! groups isolate failures so from the start. A rollback for another reason
//! (a lease lost, a store error such as a deadlock, a panic) reruns every
//! delivery in its own transaction, and groups stay one delivery each for
//! [`BATCHING_PAUSE`].
//!
//! Failure: a handler error or panic is a failed attempt; a store error
//! around a handler's transaction is a failed attempt to retry; a unit's task
//! that ends without outcomes (a panic outside the handler, an abort at the
//! shutdown deadline) records failed attempts to retry at once.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{
    BatchItem, BatchRollback, ClaimedDelivery, ErrorKind, Failure, HandlerError, LeaseRef,
    OutboxStore, RetryPolicy, Snooze, TransactionalBatchOutcome, TransactionalOutcome, TxWork,
};
use futures_util::FutureExt;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{WorkerConfig, CATCH_ALL_TOPIC, CATCH_ALL_VERSION};
use crate::handler::{ErasedHandler, Prepared};
use crate::in_flight::InFlight;
use crate::metrics_names::{HANDLERS_STOPPED, HANDLER_SECONDS, PICKUP_SECONDS, TIMED_OUT};
use crate::settle::Settlement;
use crate::trace_context::{link_producers, DeliverySpan};

/// How long a worker runs transactional deliveries one per transaction after
/// a group of them rolled back for a lost lease or a store error, and how
/// long its groups isolate failures in savepoints after a handler failed in
/// one. Handlers whose writes meet on the same rows
/// can deadlock when several groups run at once (PostgreSQL then aborts one
/// group after a second); one transaction per delivery cannot wait on another
/// while holding a lock it needs, so the worker falls back to that for a
/// while instead of deadlocking group after group.
const BATCHING_PAUSE: Duration = Duration::from_secs(10);

/// Handlers by (topic, schema version).
pub(crate) type RouteTable<C> = HashMap<(String, i32), Arc<dyn ErasedHandler<C>>>;

/// What a delivery runs with: its handler, and its topic's retry policy and
/// timeout where the topic has its own.
pub(crate) struct Routes<C> {
    pub(crate) handlers: RouteTable<C>,
    pub(crate) policies: HashMap<String, RetryPolicy>,
    pub(crate) timeouts: HashMap<String, Option<Duration>>,
}

/// Runs units of work for one subscription's worker.
pub(crate) struct Executor<S: OutboxStore> {
    store: S,
    subscription: String,
    routes: Routes<S::Connection>,
    /// The retry policy of topics without their own.
    retry: RetryPolicy,
    /// The handler timeout of topics without their own.
    handler_timeout: Option<Duration>,
    transaction_batch_size: usize,
    /// How long before its lease could expire a handler is stopped.
    lease_margin: Duration,
    in_flight: InFlight,
    /// Cancelled when shutdown begins: deliveries not yet started are handed back.
    stopping: CancellationToken,
    /// Until when transactional deliveries run one per transaction, after a
    /// group rolled back (see [`BATCHING_PAUSE`]).
    batching_paused_until: Mutex<Option<Instant>>,
    /// Until when transactional groups run each handler in a savepoint,
    /// after a handler failed in a group (see [`BATCHING_PAUSE`]).
    isolating_until: Mutex<Option<Instant>>,
}

/// Records a failed attempt if a delivery's task ends without an outcome:
/// a panic outside the handler, or an abort at the shutdown deadline.
struct OutcomeGuard {
    settle: mpsc::UnboundedSender<Settlement>,
    lease: LeaseRef,
    topic: String,
    settled: bool,
}

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        if !self.settled {
            let _ = self.settle.send(Settlement::Fail {
                failure: Failure {
                    lease: self.lease,
                    error: "the handler did not finish (worker shutdown deadline, or a panic outside the handler)".to_owned(),
                    kind: ErrorKind::Retry,
                    retry_in: Some(Duration::ZERO),
                },
                topic: std::mem::take(&mut self.topic),
            });
        }
    }
}

enum Outcome {
    Succeeded,
    Committed,
    LeaseLost,
    Failed(HandlerError),
}

/// Why a handler was stopped before it finished.
enum Stopped {
    /// Its lease (or one of its group's) was no longer surely held.
    LeaseLost,
    /// It ran past its timeout.
    TimedOut(Duration),
}

/// How one transactional batch went.
enum BatchRun {
    /// Committed; per delivery, in order, what became of it.
    Committed(Vec<BatchItem>),
    /// Rolled back because this handler failed (not isolating failures).
    HandlerFailed { index: usize, error: HandlerError },
    /// Rolled back for this reason (lease lost, store error, panic).
    RolledBack(String),
}

impl<S: OutboxStore> Executor<S> {
    /// An executor running `routes` under `config`, watching leases in
    /// `in_flight`, handing deliveries back unstarted once `stopping` is cancelled.
    pub(crate) fn new(
        store: S,
        subscription: String,
        routes: Routes<S::Connection>,
        config: &WorkerConfig,
        in_flight: InFlight,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            store,
            subscription,
            routes,
            retry: config.retry,
            handler_timeout: config.handler_timeout,
            transaction_batch_size: config.transaction_batch_size,
            lease_margin: config.lease_margin(),
            in_flight,
            stopping,
            batching_paused_until: Mutex::new(None),
            isolating_until: Mutex::new(None),
        }
    }

    /// Splits a claimed batch into units of work: each plain delivery on its
    /// own, transactional ones in groups of up to `transaction_batch_size`.
    pub(crate) fn groups(&self, deliveries: Vec<ClaimedDelivery>) -> Vec<Vec<ClaimedDelivery>> {
        let size = if self.batching_paused() {
            1
        } else {
            self.transaction_batch_size
        };
        let mut groups = Vec::new();
        let mut transactional = Vec::new();
        for delivery in deliveries {
            if size > 1
                && self
                    .route_of(&delivery)
                    .is_some_and(|r| r.is_transactional())
            {
                transactional.push(delivery);
                if transactional.len() == size {
                    groups.push(std::mem::take(&mut transactional));
                }
            } else {
                groups.push(vec![delivery]);
            }
        }
        if !transactional.is_empty() {
            groups.push(transactional);
        }
        groups
    }

    /// Starts one unit of work (tracked in the ledger already) on the handler
    /// slots of `permit`, in `running`. When its handlers are done the slots
    /// are given back and `freed` is signalled, then its outcomes go to
    /// `settle`; a task that ends without them (a panic, an abort at the
    /// shutdown deadline) records failed attempts instead.
    pub(crate) fn spawn_group(
        self: &Arc<Self>,
        group: Vec<ClaimedDelivery>,
        permit: OwnedSemaphorePermit,
        settle: &mpsc::UnboundedSender<Settlement>,
        freed: &Arc<Notify>,
        running: &mut JoinSet<()>,
    ) {
        let mut guards: Vec<OutcomeGuard> = group
            .iter()
            .map(|delivery| OutcomeGuard {
                settle: settle.clone(),
                lease: delivery.lease(),
                topic: delivery.topic.clone(),
                settled: false,
            })
            .collect();
        let executor = Arc::clone(self);
        let freed = Arc::clone(freed);
        let settle = settle.clone();
        running.spawn(async move {
            let settlements = executor.execute_group(group).await;
            for guard in &mut guards {
                guard.settled = true;
            }
            drop(permit);
            freed.notify_one();
            // A committed transactional group's rows are already gone: its
            // leases must not count as lost before the settler forgets them.
            let leases: Vec<LeaseRef> = settlements.iter().map(Settlement::lease).collect();
            executor.in_flight.mark_settling(&leases);
            for settlement in settlements {
                let _ = settle.send(settlement);
            }
        });
    }

    /// Runs a unit of work from [`Executor::groups`]: one delivery on its own, or
    /// transactional deliveries in one transaction. Normally the group runs
    /// without savepoints (a savepoint costs a round trip per delivery on
    /// PostgreSQL): if a handler fails, the transaction rolls back, the failed
    /// handler's error is its outcome, and the others run again together, each in
    /// a savepoint of their own, so one failure costs its batch-mates one rerun;
    /// groups then keep isolating failures for [`BATCHING_PAUSE`]. When a group
    /// rolls back for another reason (a lease lost, a store error such as a
    /// deadlock, a panic), its deliveries run again each in its own transaction,
    /// and so do groups for [`BATCHING_PAUSE`].
    pub(crate) async fn execute_group(&self, mut group: Vec<ClaimedDelivery>) -> Vec<Settlement> {
        // In enqueue order, which is also the order every multi-row write locks
        // deliveries in (see InFlight::to_extend), so two never deadlock.
        group.sort_unstable_by_key(|d| d.delivery_id);
        if group.len() < 2 || self.stopping.is_cancelled() {
            return self.execute_each(group).await;
        }
        let mut settlements = Vec::with_capacity(group.len());
        let mut isolate = self.isolating_failures();
        let mut first_run = true;
        loop {
            let (deliveries, works, singles) = self.transactional_works(group, first_run);
            first_run = false;
            for delivery in singles {
                // Not decodable (or not transactional): the single path reports it.
                settlements.push(self.execute(delivery).await);
            }
            if deliveries.len() < 2 {
                drop(works);
                settlements.extend(self.execute_each(deliveries).await);
                return settlements;
            }
            match self.run_batch(&deliveries, works, isolate).await {
                BatchRun::Committed(items) => {
                    for (delivery, item) in deliveries.into_iter().zip(items) {
                        settlements.push(match item {
                            BatchItem::Applied | BatchItem::AlreadyApplied => {
                                Settlement::Committed {
                                    lease: delivery.lease(),
                                    topic: delivery.topic,
                                }
                            }
                            BatchItem::Failed(error) => {
                                self.settlement_for(&delivery, Outcome::Failed(error))
                            }
                        });
                    }
                    return settlements;
                }
                BatchRun::HandlerFailed { index, error }
                    if !isolate && index < deliveries.len() =>
                {
                    self.isolate_failures_for_a_while();
                    let mut rest = deliveries;
                    let failed = rest.remove(index);
                    settlements.push(self.settlement_for(&failed, Outcome::Failed(error)));
                    // The others again, together, each in its own savepoint.
                    group = rest;
                    isolate = true;
                }
                BatchRun::HandlerFailed { .. } => {
                    return self
                        .rolled_back(deliveries, "rolled back".to_owned(), settlements)
                        .await;
                }
                BatchRun::RolledBack(reason) => {
                    return self.rolled_back(deliveries, reason, settlements).await;
                }
            }
        }
    }

    /// The handler for a delivery's topic and version, else the catch-all.
    fn route_of(
        &self,
        delivery: &ClaimedDelivery,
    ) -> Option<&Arc<dyn ErasedHandler<S::Connection>>> {
        self.routes
            .handlers
            .get(&(delivery.topic.clone(), delivery.schema_version))
            .or_else(|| {
                self.routes
                    .handlers
                    .get(&(CATCH_ALL_TOPIC.to_owned(), CATCH_ALL_VERSION))
            })
    }

    /// Decodes a delivery for its handler; a missing handler or a panic
    /// while decoding is an error, not a crash.
    fn prepare(&self, delivery: &ClaimedDelivery) -> Result<Prepared<S::Connection>, HandlerError> {
        let Some(route) = self.route_of(delivery) else {
            return Err(HandlerError::permanent(format!(
                "no handler for {} v{}",
                delivery.topic, delivery.schema_version
            )));
        };
        std::panic::catch_unwind(AssertUnwindSafe(|| route.prepare(delivery))).unwrap_or_else(
            |panic| {
                Err(HandlerError::retry(format!(
                    "decoding the payload panicked: {}",
                    panic_message(panic.as_ref())
                )))
            },
        )
    }

    /// Whether a recent rollback paused transactional groups.
    fn batching_paused(&self) -> bool {
        let guard = self
            .batching_paused_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.is_some_and(|until| Instant::now() < until)
    }

    /// Whether a recent handler failure made groups isolate failures.
    fn isolating_failures(&self) -> bool {
        let guard = self
            .isolating_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.is_some_and(|until| Instant::now() < until)
    }

    /// Runs each handler of a group in a savepoint for [`BATCHING_PAUSE`].
    fn isolate_failures_for_a_while(&self) {
        let mut guard = self
            .isolating_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = Some(Instant::now() + BATCHING_PAUSE);
    }

    /// Runs transactional deliveries one per transaction for [`BATCHING_PAUSE`].
    fn pause_batching(&self) {
        let mut guard = self
            .batching_paused_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = Some(Instant::now() + BATCHING_PAUSE);
    }

    /// The handler timeout of a delivery's topic.
    fn timeout_of(&self, delivery: &ClaimedDelivery) -> Option<Duration> {
        self.routes
            .timeouts
            .get(&delivery.topic)
            .copied()
            .unwrap_or(self.handler_timeout)
    }

    /// Runs `work` for the deliveries `ids` while all their leases are surely
    /// held (if `watch_leases`) and, if `timeout` is given, for at most that long. Dropping `work`
    /// cancels it (a transactional handler's transaction rolls back), so a
    /// handler never runs past the point where another worker could take its
    /// delivery or the next message of its ordering key.
    async fn guarded<F: Future>(
        &self,
        ids: &[i64],
        timeout: Option<Duration>,
        watch_leases: bool,
        work: F,
    ) -> Result<F::Output, Stopped> {
        tokio::pin!(work);
        // Most handlers finish at their first poll (a no-op, an in-memory
        // effect): they need no timers, tokens or ledger entries.
        if let Some(output) = futures_util::FutureExt::now_or_never(&mut work) {
            return Ok(output);
        }
        let started = tokio::time::Instant::now();
        let timeout_at = timeout.map(|t| started + t);
        let lost = CancellationToken::new();
        for id in ids {
            self.in_flight.started(*id, timeout_at, &lost);
        }
        let margin = self.lease_margin;
        if !watch_leases {
            return match timeout {
                Some(limit) => tokio::time::timeout(limit, work)
                    .await
                    .map_err(|_| Stopped::TimedOut(limit)),
                None => Ok(work.await),
            };
        }
        loop {
            let held_until = ids
                .iter()
                .map(|id| self.in_flight.held_until(*id))
                .try_fold(None::<tokio::time::Instant>, |earliest, until| {
                    let until = until?;
                    Some(Some(earliest.map_or(until, |e| e.min(until))))
                })
                .flatten();
            let Some(held_until) = held_until else {
                return Err(Stopped::LeaseLost);
            };
            let stop_at = held_until.checked_sub(margin).unwrap_or(held_until);
            let wake_at = timeout_at.map_or(stop_at, |t| t.min(stop_at));
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                () = lost.cancelled() => return Err(Stopped::LeaseLost),
                () = tokio::time::sleep_until(wake_at) => {
                    let now = tokio::time::Instant::now();
                    if let (Some(at), Some(limit)) = (timeout_at, timeout) {
                        if now >= at {
                            return Err(Stopped::TimedOut(limit));
                        }
                    }
                    // Otherwise the lease may have been extended meanwhile: look again.
                    let extended = ids
                        .iter()
                        .filter_map(|id| self.in_flight.held_until(*id))
                        .min()
                        .is_some_and(|until| until.checked_sub(margin).unwrap_or(until) > now);
                    if !extended {
                        return Err(Stopped::LeaseLost);
                    }
                }
            }
        }
    }

    /// The outcome of a handler that was stopped.
    fn stopped_outcome(&self, stopped: Stopped) -> Outcome {
        match stopped {
            Stopped::LeaseLost => {
                metrics::counter!(HANDLERS_STOPPED, "subscription" => self.subscription.clone())
                    .increment(1);
                tracing::warn!("lease no longer held; the handler was stopped");
                Outcome::LeaseLost
            }
            Stopped::TimedOut(limit) => {
                metrics::counter!(TIMED_OUT, "subscription" => self.subscription.clone())
                    .increment(1);
                Outcome::Failed(HandlerError::retry(format!("timeout after {limit:?}")))
            }
        }
    }

    /// Runs one delivery's handler and turns its outcome into a settlement.
    async fn execute(&self, delivery: ClaimedDelivery) -> Settlement {
        if self.stopping.is_cancelled() {
            return Settlement::Release {
                lease: delivery.lease(),
            };
        }
        let span = DeliverySpan::of(&self.subscription, &delivery).open();
        async move {
            self.record_pickup(&delivery);
            let started = Instant::now();
            let ids = [delivery.delivery_id];
            let timeout = self.timeout_of(&delivery);
            let outcome = match self.prepare(&delivery) {
                Err(error) => Outcome::Failed(error),
                Ok(Prepared::Plain(future)) => match self
                    .guarded(&ids, timeout, true, AssertUnwindSafe(future).catch_unwind())
                    .await
                {
                    Err(stopped) => self.stopped_outcome(stopped),
                    Ok(Ok(Ok(()))) => Outcome::Succeeded,
                    Ok(Ok(Err(error))) => Outcome::Failed(error),
                    Ok(Err(panic)) => Outcome::Failed(HandlerError::retry(format!(
                        "handler panicked: {}",
                        panic_message(panic.as_ref())
                    ))),
                },
                Ok(Prepared::Transactional(work)) => {
                    // The timeout is the work's own (see `limited`): a timed-out
                    // handler rolls back and its attempt fails.
                    let work = limited(timeout, work);
                    match self
                        .guarded(
                            &ids,
                            timeout,
                            !S::EXCLUSIVE_TRANSACTIONS,
                            AssertUnwindSafe(self.store.run_transactional(&delivery, work))
                                .catch_unwind(),
                        )
                        .await
                    {
                        Err(Stopped::TimedOut(limit)) => {
                            self.stopped_outcome(Stopped::TimedOut(limit))
                        }
                        Err(Stopped::LeaseLost) => self.stopped_outcome(Stopped::LeaseLost),
                        Ok(Ok(Ok(
                            TransactionalOutcome::Applied | TransactionalOutcome::AlreadyApplied,
                        ))) => Outcome::Committed,
                        Ok(Ok(Ok(TransactionalOutcome::LeaseLost))) => Outcome::LeaseLost,
                        Ok(Ok(Ok(TransactionalOutcome::HandlerFailed(error)))) => {
                            Outcome::Failed(error)
                        }
                        // Contention or a lost connection (a lock held by a
                        // frozen worker's open transaction, a restart) is not
                        // the message's fault: it waits and spends no attempt
                        // (snoozes are bounded, so this cannot loop forever).
                        Ok(Ok(Err(error))) if error.is_transient() => {
                            Outcome::Failed(HandlerError::snooze(
                                self.policy_of(&delivery.topic).backoff(1),
                                format!(
                                    "transient store error around the handler's transaction: {error}"
                                ),
                            ))
                        }
                        Ok(Ok(Err(error))) => Outcome::Failed(HandlerError::retry(format!(
                            "store error around the handler's transaction: {error}"
                        ))),
                        Ok(Err(panic)) => Outcome::Failed(HandlerError::retry(format!(
                            "handler panicked: {}",
                            panic_message(panic.as_ref())
                        ))),
                    }
                }
            };
            metrics::histogram!(HANDLER_SECONDS, "subscription" => self.subscription.clone(), "topic" => delivery.topic.clone())
                .record(started.elapsed().as_secs_f64());
            // Its outcome is known: while it waits for the rest of its unit of
            // work and the settler, its lease is kept (not counted lost if a
            // committed row is gone, not cut short at its handler's timeout).
            self.in_flight.mark_settling(&[delivery.lease()]);
            self.settlement_for(&delivery, outcome)
        }
        .instrument(span)
        .await
    }

    /// A group's transaction rolled back for a reason other than a handler's
    /// failure: every delivery runs again in its own transaction.
    async fn rolled_back(
        &self,
        deliveries: Vec<ClaimedDelivery>,
        reason: String,
        mut settlements: Vec<Settlement>,
    ) -> Vec<Settlement> {
        self.pause_batching();
        tracing::warn!(
            subscription = self.subscription,
            deliveries = deliveries.len(),
            reason,
            "transactional batch rolled back; running each delivery on its own"
        );
        settlements.extend(self.execute_each(deliveries).await);
        settlements
    }

    /// Splits `group` into transactional deliveries with their prepared work and
    /// the deliveries the single path must run (not decodable, not transactional).
    fn transactional_works(
        &self,
        group: Vec<ClaimedDelivery>,
        first_run: bool,
    ) -> (
        Vec<ClaimedDelivery>,
        Vec<TxWork<S::Connection>>,
        Vec<ClaimedDelivery>,
    ) {
        let mut deliveries = Vec::with_capacity(group.len());
        let mut works = Vec::with_capacity(group.len());
        let mut singles = Vec::new();
        for delivery in group {
            match self.prepare(&delivery) {
                Ok(Prepared::Transactional(work)) => {
                    if first_run {
                        self.record_pickup(&delivery);
                    }
                    let work = limited(self.timeout_of(&delivery), work);
                    works.push(self.observed(&delivery, work));
                    deliveries.push(delivery);
                }
                Ok(Prepared::Plain(_)) | Err(_) => singles.push(delivery),
            }
        }
        (deliveries, works, singles)
    }

    /// Runs `works` for `deliveries` in one transaction while their leases are held.
    async fn run_batch(
        &self,
        deliveries: &[ClaimedDelivery],
        works: Vec<TxWork<S::Connection>>,
        isolate: bool,
    ) -> BatchRun {
        let span = tracing::info_span!(
            "courier.deliver_batch",
            subscription = %self.subscription,
            deliveries = deliveries.len(),
            isolate,
        );
        // Each delivery's own `courier.deliver` span continues its producer's
        // trace (see `observed`); the group's span links to every producer.
        link_producers(&span, deliveries);
        let batch = deliveries.iter().zip(works).collect();
        let ids: Vec<i64> = deliveries.iter().map(|d| d.delivery_id).collect();
        // Each handler's timeout is its own work's (see `limited`); the group as
        // a whole is stopped if a lease is no longer surely held, or once it ran
        // for the sum of its handlers' timeouts (a handler that ignores
        // cancellation must not keep the group's leases alive for ever).
        let group_timeout = deliveries
            .iter()
            .map(|d| self.timeout_of(d))
            .try_fold(Duration::ZERO, |total, timeout| Some(total + timeout?));
        let outcome = self
            .guarded(
                &ids,
                group_timeout,
                !S::EXCLUSIVE_TRANSACTIONS,
                AssertUnwindSafe(self.store.run_transactional_batch(batch, isolate)).catch_unwind(),
            )
            .instrument(span)
            .await;
        match outcome {
            Err(Stopped::LeaseLost) => {
                BatchRun::RolledBack("a lease was no longer held".to_owned())
            }
            Err(Stopped::TimedOut(limit)) => BatchRun::RolledBack(format!(
                "the group ran for {limit:?}, its handlers' timeouts together"
            )),
            Ok(Ok(Ok(TransactionalBatchOutcome::Committed(items)))) if items.len() == ids.len() => {
                BatchRun::Committed(items)
            }
            Ok(Ok(Ok(TransactionalBatchOutcome::Committed(_)))) => {
                BatchRun::RolledBack("the store reported a different number of outcomes".to_owned())
            }
            Ok(Ok(Ok(TransactionalBatchOutcome::RolledBack(BatchRollback::HandlerFailed {
                index,
                error,
            })))) => BatchRun::HandlerFailed { index, error },
            Ok(Ok(Ok(TransactionalBatchOutcome::RolledBack(BatchRollback::LeaseLost)))) => {
                BatchRun::RolledBack("a lease was lost".to_owned())
            }
            Ok(Ok(Err(error))) => BatchRun::RolledBack(format!("store error: {error}")),
            Ok(Err(panic)) => BatchRun::RolledBack(format!(
                "a handler panicked: {}",
                panic_message(panic.as_ref())
            )),
        }
    }

    /// Runs each delivery on its own, at once.
    async fn execute_each(&self, deliveries: Vec<ClaimedDelivery>) -> Vec<Settlement> {
        futures_util::future::join_all(
            deliveries
                .into_iter()
                .map(|delivery| self.execute(delivery)),
        )
        .await
    }

    /// Records how long a first attempt waited between enqueue and handler start.
    fn record_pickup(&self, delivery: &ClaimedDelivery) {
        if delivery.attempt != 1 {
            return;
        }
        if let Ok(pickup) = (chrono::Utc::now() - delivery.enqueued_at).to_std() {
            metrics::histogram!(PICKUP_SECONDS, "subscription" => self.subscription.clone())
                .record(pickup.as_secs_f64());
        }
    }

    /// Wraps a group's transactional work so its own run time is recorded as
    /// handler time and it runs in its delivery's `courier.deliver` span,
    /// opened when the work starts (a child of the group's span, continuing
    /// its producer's trace: see [`DeliverySpan::open`]).
    fn observed(
        &self,
        delivery: &ClaimedDelivery,
        work: TxWork<S::Connection>,
    ) -> TxWork<S::Connection> {
        let histogram = metrics::histogram!(HANDLER_SECONDS, "subscription" => self.subscription.clone(), "topic" => delivery.topic.clone());
        let span = DeliverySpan::of(&self.subscription, delivery).into_owned();
        crate::handler::transactional_work(move |conn: &mut S::Connection| {
            let span = span.open();
            Box::pin(
                async move {
                    let started = Instant::now();
                    let result = work(conn).await;
                    histogram.record(started.elapsed().as_secs_f64());
                    result
                }
                .instrument(span),
            ) as futures_util::future::BoxFuture<'_, Result<(), HandlerError>>
        })
    }

    /// The retry policy of `topic`'s deliveries.
    fn policy_of(&self, topic: &str) -> RetryPolicy {
        self.routes
            .policies
            .get(topic)
            .copied()
            .unwrap_or(self.retry)
    }

    /// The settlement that records a finished delivery's outcome.
    fn settlement_for(&self, delivery: &ClaimedDelivery, outcome: Outcome) -> Settlement {
        let topic = delivery.topic.clone();
        match outcome {
            Outcome::Succeeded => Settlement::Complete {
                lease: delivery.lease(),
                topic,
            },
            Outcome::Committed => Settlement::Committed {
                lease: delivery.lease(),
                topic,
            },
            Outcome::LeaseLost => {
                tracing::warn!("lease lost; the handler's writes were rolled back");
                Settlement::Lost {
                    lease: delivery.lease(),
                }
            }
            Outcome::Failed(HandlerError::Snooze { delay, reason }) => {
                tracing::debug!(delay_ms = delay.as_millis(), reason, "handler snoozed");
                Settlement::Snooze {
                    snooze: Snooze {
                        lease: delivery.lease(),
                        delay,
                        reason: reason.replace('\0', "\u{FFFD}"),
                    },
                    topic,
                }
            }
            Outcome::Failed(error) => {
                let policy = self.policy_of(&delivery.topic);
                let retry_in = match &error {
                    HandlerError::Permanent(_) => None,
                    HandlerError::RetryAfter { delay, .. } => Some(*delay),
                    HandlerError::Retry(_) => Some(policy.backoff(delivery.attempt)),
                    // Handled above.
                    HandlerError::Snooze { delay, .. } => Some(*delay),
                };
                tracing::warn!(error = %error, permanent = retry_in.is_none(), "handler failed");
                Settlement::Fail {
                    failure: Failure {
                        lease: delivery.lease(),
                        // PostgreSQL text cannot hold NUL; one such error must
                        // not sink the batch it is written with.
                        error: error.to_string().replace('\0', "\u{FFFD}"),
                        kind: error.kind(),
                        retry_in,
                    },
                    topic,
                }
            }
        }
    }
}

/// Wraps transactional work so that it fails with `timeout after …` once it
/// has run for `timeout` (its writes then roll back with the transaction).
fn limited<C: Send + 'static>(timeout: Option<Duration>, work: TxWork<C>) -> TxWork<C> {
    let Some(limit) = timeout else {
        return work;
    };
    crate::handler::transactional_work(move |conn: &mut C| {
        Box::pin(async move {
            match tokio::time::timeout(limit, work(conn)).await {
                Ok(result) => result,
                Err(_) => {
                    metrics::counter!(TIMED_OUT).increment(1);
                    Err(HandlerError::retry(format!("timeout after {limit:?}")))
                }
            }
        }) as futures_util::future::BoxFuture<'_, Result<(), HandlerError>>
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
