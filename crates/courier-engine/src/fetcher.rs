//! The claim loop: claims deliveries for one subscription and hands them to
//! the executor.
//!
//! **Backpressure.** Each claim reserves the free handler slots it may fill
//! (those it does not fill go back when it returns), so nothing waits in
//! memory under a ticking lease. Up to [`CLAIMS_IN_FLIGHT`] claims are on
//! their way at once, so the next batch arrives while one starts. Claiming
//! pauses while too few slots are free (until a handler finishes) and while
//! too many claimed deliveries wait for their outcome to be written (until
//! the settler writes some).
//!
//! **Tenant cursor.** Each claim continues from the tenant where the last one
//! stopped; a lap is a run of claims from the first tenant to the last. While
//! claims come back with work, or tenants are left in the lap, the loop
//! claims again at once (no sleeping through a backlog).
//!
//! **Idle.** When a whole lap found nothing, the worker announces itself
//! idle (so producers wake it: PostgreSQL NOTIFY), claims once more (a
//! producer that committed before the announcement did not wake it), then
//! waits for a wake-up (NOTIFY, or the SQLite store's in-process signal), a
//! settled delivery (it may release the next message of its ordering key),
//! or the poll interval. It announces again every [`IDLE_REFRESH`], since a
//! database crash can lose the announcement; the first claim that finds work
//! withdraws it.
//!
//! Failure: a store error while claiming backs off (doubling, up to
//! [`CLAIM_BACKOFF_MAX`], jittered) and claims again; a failed announcement leaves the
//! worker polling. At shutdown the claims still in flight finish and what
//! they took is handed back unstarted, with its attempt refunded.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{ClaimBatch, ClaimParams, ClaimedDelivery, OutboxStore, StoreError};
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::executor::Executor;
use crate::in_flight::InFlight;
use crate::metrics_names::{CLAIMED, STORE_ERRORS};
use crate::settle::Settlement;

/// Claims a worker keeps in flight at once, so one is on its way while
/// another's deliveries start.
const CLAIMS_IN_FLIGHT: usize = 2;
/// Claimed deliveries whose outcome is not yet written, at most, as a multiple
/// of the concurrency. Handler slots free when a handler returns; when the
/// database writes outcomes more slowly than handlers produce them, claiming
/// pauses here instead of piling up deliveries whose leases the heartbeat
/// must keep extending (and may lose).
const UNSETTLED_PER_SLOT: usize = 2;
/// How often an idle worker that announced its idleness announces it again.
/// The announcement lives in an unlogged table: a PostgreSQL crash or
/// failover empties it (and drops the LISTEN connection), after which
/// producers would stop waking the worker until it went busy and idle again.
/// Each refresh is one small write to an unlogged table and one claim.
const IDLE_REFRESH: Duration = Duration::from_millis(500);
/// The wait after a failed claim; it doubles with each failure in a row.
const CLAIM_BACKOFF_START: Duration = Duration::from_millis(50);
/// The longest wait after failed claims.
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Claims one batch with `params`, counting the deliveries claimed.
pub(crate) async fn claim<S: OutboxStore>(
    store: &S,
    params: &ClaimParams,
) -> Result<ClaimBatch, StoreError> {
    let batch = store.claim(params).await?;
    if !batch.deliveries.is_empty() {
        metrics::counter!(CLAIMED, "subscription" => params.subscription.clone())
            .increment(u64::try_from(batch.deliveries.len()).unwrap_or(u64::MAX));
    }
    Ok(batch)
}

/// A claim that came back.
struct Claimed {
    result: Result<ClaimBatch, StoreError>,
    /// The handler slots reserved for what it may return; those its
    /// deliveries do not take go back when this is dropped.
    reserved: OwnedSemaphorePermit,
    /// Whether it was sent while this worker's idleness was announced.
    after_announcing: bool,
    /// When it was sent: its leases are surely held from then.
    sent: Instant,
}

/// This worker's idle announcement: while it stands, producers wake the
/// worker when they enqueue.
struct Announcement<S> {
    store: S,
    subscription: String,
    worker_id: String,
    /// Producers were told this worker is idle.
    announced: bool,
    /// The store takes announcements (false once it said it does not).
    supported: bool,
    /// A withdrawal being written in the background.
    withdrawing: Option<JoinHandle<()>>,
}

impl<S: OutboxStore> Announcement<S> {
    /// Tells producers this worker is idle, once a withdrawal still being
    /// written is done; returns whether the announcement stands.
    async fn announce(&mut self) -> bool {
        if let Some(pending) = self.withdrawing.take() {
            let _ = pending.await;
        }
        match self
            .store
            .announce_idle(&self.subscription, &self.worker_id, true)
            .await
        {
            Ok(true) => {
                self.announced = true;
                true
            }
            Ok(false) => {
                self.supported = false;
                false
            }
            Err(error) => {
                metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
                tracing::warn!(subscription = self.subscription, %error, "could not announce idleness; polling until the next try");
                false
            }
        }
    }

    /// Announces again, in case the announcement was lost with the
    /// database's unlogged tables.
    async fn refresh(&self) {
        if let Err(error) = self
            .store
            .announce_idle(&self.subscription, &self.worker_id, true)
            .await
        {
            metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
            tracing::debug!(subscription = self.subscription, %error, "could not refresh the idle announcement");
        }
    }

    /// Withdraws a standing announcement in the background (work was found).
    fn withdraw_in_background(&mut self) {
        if self.announced {
            self.announced = false;
            let store = self.store.clone();
            let subscription = self.subscription.clone();
            let worker_id = self.worker_id.clone();
            self.withdrawing = Some(tokio::spawn(async move {
                withdraw(&store, &subscription, &worker_id).await;
            }));
        }
    }

    /// Waits for a withdrawal being written, and withdraws a standing announcement.
    async fn finish(mut self) {
        if let Some(pending) = self.withdrawing.take() {
            let _ = pending.await;
        }
        if self.announced {
            withdraw(&self.store, &self.subscription, &self.worker_id).await;
        }
    }
}

/// Tells producers this worker is busy again (they need not wake it).
async fn withdraw<S: OutboxStore>(store: &S, subscription: &str, worker_id: &str) {
    if let Err(error) = store.announce_idle(subscription, worker_id, false).await {
        metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
        tracing::warn!(
            subscription,
            %error,
            "could not withdraw the idle announcement; producers keep notifying"
        );
    }
}

/// The claim loop of one worker.
pub(crate) struct Fetcher<S: OutboxStore> {
    store: S,
    executor: Arc<Executor<S>>,
    in_flight: InFlight,
    /// The claim sent each time; only its limit and tenant cursor move.
    params: ClaimParams,
    lease: Duration,
    batch_size: usize,
    poll_interval: Duration,
    /// The fewest free slots worth a claim.
    threshold: usize,
    /// Claimed deliveries not yet settled above which claiming pauses.
    unsettled_cap: usize,
    /// Handler slots: one per running handler, reserved by claims.
    slots: Arc<Semaphore>,
    /// Signalled when a unit of work gives its slots back.
    freed: Arc<Notify>,
    /// Outcomes, to the settler.
    settle: mpsc::UnboundedSender<Settlement>,
    /// Signalled by the settler after each write.
    settled: Arc<Notify>,
    /// Claims in flight, each holding the handler slots it may fill.
    claims: FuturesUnordered<BoxFuture<'static, Claimed>>,
    /// Where the next claim continues among the tenants (empty: the first).
    cursor: String,
    /// Whether a claim of the current lap found work; the loop goes idle
    /// only after a whole lap found nothing.
    lap_claimed: bool,
    /// Waiting for a wake-up, a settled delivery or the poll interval.
    idle: bool,
    announcement: Announcement<S>,
    error_backoff: Duration,
    /// No claims until then, after a failed claim.
    backoff_until: Option<Instant>,
}

impl<S: OutboxStore> Fetcher<S> {
    /// A claim loop sending `params`, tracking what it claims in
    /// `in_flight`, running it on `executor` and sending outcomes to the
    /// settler through `settle` (which signals `settled` after each write).
    pub(crate) fn new(
        store: S,
        executor: Arc<Executor<S>>,
        in_flight: InFlight,
        params: ClaimParams,
        config: &WorkerConfig,
        settle: mpsc::UnboundedSender<Settlement>,
        settled: Arc<Notify>,
    ) -> Self {
        Self {
            announcement: Announcement {
                store: store.clone(),
                subscription: params.subscription.clone(),
                worker_id: config.worker_id.clone(),
                announced: false,
                supported: true,
                withdrawing: None,
            },
            store,
            executor,
            in_flight,
            params,
            lease: config.lease,
            batch_size: config.batch_size,
            poll_interval: config.poll_interval,
            threshold: (config.batch_size.min(config.concurrency) / 4).max(1),
            unsettled_cap: config
                .concurrency
                .saturating_mul(UNSETTLED_PER_SLOT)
                .max(config.batch_size),
            slots: Arc::new(Semaphore::new(config.concurrency)),
            freed: Arc::new(Notify::new()),
            settle,
            settled,
            claims: FuturesUnordered::new(),
            cursor: String::new(),
            lap_claimed: false,
            idle: false,
            error_backoff: CLAIM_BACKOFF_START,
            backoff_until: None,
        }
    }

    /// Claims and starts units of work in `running` until `stopping` is
    /// cancelled, woken when idle by changes of `wake`; then waits for the
    /// claims in flight and hands back what they took, unstarted.
    pub(crate) async fn run(
        &mut self,
        mut wake: Option<watch::Receiver<u64>>,
        stopping: &CancellationToken,
        running: &mut JoinSet<()>,
    ) {
        while !stopping.is_cancelled() {
            while running.try_join_next().is_some() {}
            let backlogged = self.in_flight.len() >= self.unsettled_cap;
            if !backlogged {
                self.send_claims();
            }
            let woken = async {
                match wake.as_mut() {
                    Some(receiver) => {
                        if receiver.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let backoff_until = self.backoff_until;
            let backoff = async move {
                match backoff_until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = stopping.cancelled() => break,
                Some(claimed) = self.claims.next(), if !self.claims.is_empty() => {
                    self.claimed(claimed, running).await;
                }
                () = backoff, if self.backoff_until.is_some() => self.backoff_until = None,
                // Too few free slots for a claim: wait for a handler to finish.
                () = self.freed.notified(), if !self.idle && !backlogged && self.claims.is_empty() => {}
                // Too many outcomes waiting to be written: wait for the settler.
                () = self.settled.notified(), if !self.idle && backlogged && self.claims.is_empty() => {}
                // Idle: wait for a wake-up, a settled delivery (it may release
                // the next of its ordering key) or the poll interval.
                () = woken, if self.idle => self.idle = false,
                () = self.settled.notified(), if self.idle => self.idle = false,
                () = tokio::time::sleep(self.poll_interval), if self.idle => self.idle = false,
                // Announce again (the announcement may have been lost with the
                // database's unlogged tables), then claim once more: a producer
                // that committed while it was missing did not wake us.
                () = tokio::time::sleep(IDLE_REFRESH), if self.idle && self.announcement.announced => {
                    self.announcement.refresh().await;
                    self.idle = false;
                }
            }
        }
        self.hand_back_claims().await;
    }

    /// Withdraws the idle announcement, if any; call once handlers are done.
    /// The settler's queue closes with the fetcher.
    pub(crate) async fn finish(self) {
        self.announcement.finish().await;
    }

    /// Keeps up to [`CLAIMS_IN_FLIGHT`] claims going while enough slots are
    /// free, so the next batch is on its way while this one runs.
    fn send_claims(&mut self) {
        while !self.idle && self.backoff_until.is_none() && self.claims.len() < CLAIMS_IN_FLIGHT {
            let free = self.slots.available_permits();
            if free < self.threshold {
                break;
            }
            let limit = free.min(self.batch_size);
            let Ok(reserved) = Arc::clone(&self.slots)
                .try_acquire_many_owned(u32::try_from(limit).unwrap_or(u32::MAX))
            else {
                break;
            };
            if self.cursor.is_empty() {
                self.lap_claimed = false;
            }
            self.params.limit = limit;
            self.params.tenant_cursor.clone_from(&self.cursor);
            let params = self.params.clone();
            let store = self.store.clone();
            let after_announcing = self.announcement.announced;
            self.claims.push(
                async move {
                    let sent = Instant::now();
                    let result = claim(&store, &params).await;
                    Claimed {
                        result,
                        reserved,
                        after_announcing,
                        sent,
                    }
                }
                .boxed(),
            );
        }
    }

    /// Starts what a claim returned, and decides whether to claim again at
    /// once, announce idleness, go idle, or back off.
    async fn claimed(&mut self, claimed: Claimed, running: &mut JoinSet<()>) {
        let Claimed {
            result,
            mut reserved,
            after_announcing,
            sent,
        } = claimed;
        let ClaimBatch {
            deliveries,
            next_tenant_cursor,
        } = match result {
            Ok(batch) => batch,
            Err(error) => {
                metrics::counter!(STORE_ERRORS, "operation" => "claim").increment(1);
                tracing::warn!(subscription = self.params.subscription, %error, "claim failed; backing off");
                // Jittered over the upper half, so that workers cut off by
                // one outage do not all come back in the same instant.
                let jittered = self.error_backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
                self.backoff_until = Some(Instant::now() + jittered);
                self.error_backoff = (self.error_backoff * 2).min(CLAIM_BACKOFF_MAX);
                return;
            }
        };
        self.error_backoff = CLAIM_BACKOFF_START;
        let claimed = deliveries.len();
        self.lap_claimed |= claimed > 0;
        // Work found or tenants left in the lap: claim again at once. Nothing
        // in a whole lap: announce idleness (so producers notify), claim once
        // more, then idle until woken.
        if claimed > 0 {
            self.idle = false;
            self.announcement.withdraw_in_background();
        } else if next_tenant_cursor.is_empty() && !self.lap_claimed {
            // Idle after the claim sent once announced, or without an
            // announcement to make (the store takes none, or it failed).
            let go_idle = after_announcing
                || !self.announcement.supported
                || (!self.announcement.announced && !self.announcement.announce().await);
            if go_idle {
                self.idle = true;
            }
        }
        self.cursor = next_tenant_cursor;
        for group in self.executor.groups(deliveries) {
            self.spawn_group(group, sent, &mut reserved, running);
        }
        // Unused reserved slots go back with `reserved`.
    }

    /// Tracks one unit of work in the ledger and starts it on the slots it
    /// takes from `reserved`.
    fn spawn_group(
        &self,
        group: Vec<ClaimedDelivery>,
        claim_sent: Instant,
        reserved: &mut OwnedSemaphorePermit,
        running: &mut JoinSet<()>,
    ) {
        let Some(permit) = reserved.split(group.len()) else {
            // Cannot happen: a claim takes no more than the slots it reserved.
            for delivery in group {
                let _ = self.settle.send(Settlement::Release {
                    lease: delivery.lease(),
                });
            }
            return;
        };
        for delivery in &group {
            self.in_flight.track(delivery, claim_sent, self.lease);
        }
        self.executor
            .spawn_group(group, permit, &self.settle, &self.freed, running);
    }

    /// Waits for the claims still in flight and hands back what they took, unstarted.
    async fn hand_back_claims(&mut self) {
        while let Some(claimed) = self.claims.next().await {
            if let Ok(batch) = claimed.result {
                for delivery in batch.deliveries {
                    let _ = self.settle.send(Settlement::Release {
                        lease: delivery.lease(),
                    });
                }
            }
        }
    }
}
