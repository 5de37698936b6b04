//! The worker: claims deliveries for one subscription and runs their handlers.
//!
//! States of a delivery as the worker sees it: claimed (leased, attempt
//! spent) → started (handler running, lease kept alive by the heartbeat) →
//! settled (completed, retried with backoff, or dead-lettered). A delivery
//! claimed but not started when shutdown begins is handed back with its
//! attempt refunded.
//!
//! The fetch loop claims at most as many deliveries as it has free handler
//! slots, so nothing waits in memory under a ticking lease. While claims come
//! back non-empty it claims again at once (no sleeping through a backlog);
//! when a claim is empty it waits for a wake-up (PostgreSQL NOTIFY, or the
//! SQLite store's in-process signal), a freed slot, or the poll interval.
//!
//! Failure: a handler error or panic is a failed attempt; a store error while
//! claiming backs off and retries; a crash of the whole process leaves its
//! leases to expire, after which any worker's rescuer returns them.
//! Shutdown stops claiming, lets running handlers finish until the deadline,
//! then aborts the rest and records them as failed attempts to retry at once.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    ClaimBatch, ClaimParams, ClaimedDelivery, LeaseRef, OutboxStore, Route, StoreError,
};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::executor::{Executor, Routes};
use crate::heartbeat;
use crate::in_flight::InFlight;
use crate::maintenance::Maintenance;
use crate::metrics_names::{CLAIMED, STORE_ERRORS};
use crate::settle::{self, Settlement};

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

struct Shared<S: OutboxStore> {
    store: S,
    subscription: String,
    claim_routes: Vec<Route>,
    config: WorkerConfig,
    in_flight: InFlight,
    stopping: CancellationToken,
    executor: Arc<Executor<S>>,
}

/// A configured worker, registered with the store, not yet running.
pub struct Worker<S: OutboxStore> {
    shared: Arc<Shared<S>>,
    wake: Option<watch::Receiver<u64>>,
}

/// A running worker; [`WorkerHandle::shutdown`] stops it gracefully.
pub struct WorkerHandle {
    stop: CancellationToken,
    fetcher: tokio::task::JoinHandle<()>,
    worker_id: String,
}

impl<S: OutboxStore> Worker<S> {
    /// Wires a worker's services, from a configuration the builder checked:
    /// claims for `claim_routes`, runs `routes`.
    pub(crate) fn assemble(
        store: S,
        subscription: String,
        config: WorkerConfig,
        claim_routes: Vec<Route>,
        routes: Routes<S::Connection>,
        wake: Option<watch::Receiver<u64>>,
    ) -> Self {
        let in_flight = InFlight::default();
        let stopping = CancellationToken::new();
        let executor = Arc::new(Executor::new(
            store.clone(),
            subscription.clone(),
            routes,
            &config,
            in_flight.clone(),
            stopping.clone(),
        ));
        Worker {
            shared: Arc::new(Shared {
                store,
                subscription,
                claim_routes,
                config,
                in_flight,
                stopping,
                executor,
            }),
            wake,
        }
    }

    /// The subscription this worker serves.
    pub fn subscription(&self) -> &str {
        &self.shared.subscription
    }

    /// Claims one batch, runs every handler to completion and settles the
    /// outcomes before returning how many deliveries were claimed. For tests
    /// and tools that want deterministic steps instead of a running loop.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let claim_sent = tokio::time::Instant::now();
        let batch = claim(&self.shared, &self.shared.claim_params())
            .await?
            .deliveries;
        let count = batch.len();
        let mut runs = JoinSet::new();
        let leases: Vec<LeaseRef> = batch.iter().map(ClaimedDelivery::lease).collect();
        for delivery in &batch {
            self.shared
                .in_flight
                .track(delivery, claim_sent, self.shared.config.lease);
        }
        for group in self.shared.executor.groups(batch) {
            let executor = Arc::clone(&self.shared.executor);
            runs.spawn(async move { executor.execute_group(group).await });
        }
        let mut settlements = Vec::with_capacity(count);
        while let Some(result) = runs.join_next().await {
            if let Ok(group) = result {
                settlements.extend(group);
            }
        }
        settle::settle_batch(&self.shared.store, &self.shared.subscription, settlements).await;
        self.shared.in_flight.untrack(&leases);
        Ok(count)
    }

    /// Runs one heartbeat now; returns how many leases were found lost.
    pub async fn heartbeat_once(&self) -> usize {
        heartbeat::beat_once(
            &self.shared.store,
            &self.shared.subscription,
            &self.shared.in_flight,
            self.shared.config.lease,
            self.shared.config.timeout_grace(),
        )
        .await
    }

    /// Starts the fetch loop, heartbeat, settler and (if configured)
    /// maintenance on the current tokio runtime.
    pub fn start(self) -> WorkerHandle {
        let stop = self.shared.stopping.clone();
        let worker_id = self.shared.config.worker_id.clone();
        let fetcher = tokio::spawn(run(self.shared, self.wake));
        WorkerHandle {
            stop,
            fetcher,
            worker_id,
        }
    }
}

impl WorkerHandle {
    /// The worker's id, as written into its leases.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Stops claiming, waits for running handlers up to the shutdown timeout,
    /// settles every outcome and returns when the worker has stopped.
    pub async fn shutdown(self) {
        self.stop.cancel();
        if let Err(error) = self.fetcher.await {
            tracing::error!(%error, "worker task ended abnormally");
        }
    }

    /// Whether the worker has stopped (after shutdown, or a fatal error).
    pub fn is_finished(&self) -> bool {
        self.fetcher.is_finished()
    }
}

impl<S: OutboxStore> Shared<S> {
    /// A full-batch claim from the first tenant; the fetch loop builds it once
    /// and then only moves its limit and tenant cursor.
    fn claim_params(&self) -> ClaimParams {
        ClaimParams {
            subscription: self.subscription.clone(),
            routes: self.claim_routes.clone(),
            limit: self.config.batch_size,
            lease: self.config.lease,
            worker_id: self.config.worker_id.clone(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: self.config.tenant_in_flight_limit,
        }
    }
}

async fn claim<S: OutboxStore>(
    shared: &Shared<S>,
    params: &ClaimParams,
) -> Result<ClaimBatch, StoreError> {
    let batch = shared.store.claim(params).await?;
    if !batch.deliveries.is_empty() {
        metrics::counter!(CLAIMED, "subscription" => shared.subscription.clone())
            .increment(u64::try_from(batch.deliveries.len()).unwrap_or(u64::MAX));
    }
    Ok(batch)
}

/// The fetch loop, with the services it owns, until shutdown completes.
async fn run<S: OutboxStore>(shared: Arc<Shared<S>>, mut wake: Option<watch::Receiver<u64>>) {
    let config = &shared.config;
    let (settle_tx, settle_rx) = mpsc::unbounded_channel();
    let settled = Arc::new(Notify::new());
    let settler = tokio::spawn(settle::run(
        shared.store.clone(),
        shared.subscription.clone(),
        settle_rx,
        shared.in_flight.clone(),
        Arc::clone(&settled),
    ));
    let services_stop = CancellationToken::new();
    let heartbeat = tokio::spawn(heartbeat::run(
        shared.store.clone(),
        shared.subscription.clone(),
        shared.in_flight.clone(),
        config.lease,
        config.heartbeat(),
        config.timeout_grace(),
        services_stop.clone(),
    ));
    let maintenance = config.maintenance.clone().and_then(|maintenance_config| {
        Maintenance::new(shared.store.clone(), maintenance_config)
            .map(|m| tokio::spawn(m.run(services_stop.clone())))
            .ok()
    });

    let slots = Arc::new(Semaphore::new(config.concurrency));
    let freed = Arc::new(Notify::new());
    let threshold = (config.batch_size.min(config.concurrency) / 4).max(1);
    let mut running: JoinSet<()> = JoinSet::new();
    // Claims in flight, each holding the handler slots it may fill.
    let mut claims = FuturesUnordered::new();
    let mut params = shared.claim_params();
    let mut cursor = String::new();
    // A lap is a run of claims from the first tenant to the last; the loop
    // goes idle only after a whole lap found nothing.
    let mut lap_claimed = false;
    let mut idle = false;
    // Whether this worker has told producers it is idle (so they notify), and
    // whether the store uses such announcements at all.
    let mut announced = false;
    let mut announcing = true;
    let mut withdrawing: Option<tokio::task::JoinHandle<()>> = None;
    let mut error_backoff = Duration::from_millis(50);
    let mut backoff_until: Option<tokio::time::Instant> = None;
    tracing::info!(
        subscription = shared.subscription,
        worker_id = config.worker_id,
        "worker started"
    );

    while !shared.stopping.is_cancelled() {
        while running.try_join_next().is_some() {}
        // Keep up to CLAIMS_IN_FLIGHT claims going while slots are free, so
        // the next batch is on its way while this one runs.
        let unsettled_cap = config
            .concurrency
            .saturating_mul(UNSETTLED_PER_SLOT)
            .max(config.batch_size);
        let backlogged = shared.in_flight.len() >= unsettled_cap;
        while !idle && !backlogged && backoff_until.is_none() && claims.len() < CLAIMS_IN_FLIGHT {
            let free = slots.available_permits();
            if free < threshold {
                break;
            }
            let limit = free.min(config.batch_size);
            let Ok(reserved) =
                Arc::clone(&slots).try_acquire_many_owned(u32::try_from(limit).unwrap_or(u32::MAX))
            else {
                break;
            };
            if cursor.is_empty() {
                lap_claimed = false;
            }
            params.limit = limit;
            params.tenant_cursor.clone_from(&cursor);
            let claim_params = params.clone();
            let claim_shared = Arc::clone(&shared);
            let after_announcing = announced;
            claims.push(async move {
                let sent = tokio::time::Instant::now();
                let result = claim(&claim_shared, &claim_params).await;
                (result, reserved, after_announcing, sent)
            });
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
        let backoff = async {
            match backoff_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = shared.stopping.cancelled() => break,
            Some((result, mut reserved, after_announcing, claim_sent)) = claims.next(), if !claims.is_empty() => match result {
                Ok(ClaimBatch { deliveries, next_tenant_cursor }) => {
                    error_backoff = Duration::from_millis(50);
                    let claimed = deliveries.len();
                    lap_claimed |= claimed > 0;
                    // Work found or tenants left in the lap: claim again at
                    // once. Nothing in a whole lap: announce idleness (so
                    // producers notify), claim once more, then idle until woken.
                    if claimed > 0 {
                        idle = false;
                        if announced {
                            announced = false;
                            withdrawing = Some(tokio::spawn(withdraw(Arc::clone(&shared))));
                        }
                    } else if next_tenant_cursor.is_empty() && !lap_claimed {
                        if after_announcing || !announcing {
                            idle = true;
                        } else if !announced {
                            if let Some(pending) = withdrawing.take() {
                                let _ = pending.await;
                            }
                            match shared
                                .store
                                .announce_idle(&shared.subscription, &config.worker_id, true)
                                .await
                            {
                                Ok(true) => announced = true,
                                Ok(false) => {
                                    announcing = false;
                                    idle = true;
                                }
                                Err(error) => {
                                    metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
                                    tracing::warn!(subscription = shared.subscription, %error, "could not announce idleness; polling until the next try");
                                    idle = true;
                                }
                            }
                        }
                    }
                    cursor = next_tenant_cursor;
                    for group in shared.executor.groups(deliveries) {
                        spawn_group(&shared, group, claim_sent, &mut reserved, &settle_tx, &freed, &mut running);
                    }
                    // Unused reserved slots go back with `reserved`.
                }
                Err(error) => {
                    metrics::counter!(STORE_ERRORS, "operation" => "claim").increment(1);
                    tracing::warn!(subscription = shared.subscription, %error, "claim failed; backing off");
                    backoff_until = Some(tokio::time::Instant::now() + error_backoff);
                    error_backoff = (error_backoff * 2).min(Duration::from_secs(5));
                }
            },
            () = backoff, if backoff_until.is_some() => backoff_until = None,
            // Too few free slots for a claim: wait for a handler to finish.
            () = freed.notified(), if !idle && !backlogged && claims.is_empty() => {}
            // Too many outcomes waiting to be written: wait for the settler.
            () = settled.notified(), if !idle && backlogged && claims.is_empty() => {}
            // Idle: wait for a wake-up, a settled delivery (it may release
            // the next of its ordering key) or the poll interval.
            () = woken, if idle => idle = false,
            () = settled.notified(), if idle => idle = false,
            () = tokio::time::sleep(config.poll_interval), if idle => idle = false,
            // Announce again (the announcement may have been lost with the
            // database's unlogged tables), then claim once more: a producer
            // that committed while it was missing did not wake us.
            () = tokio::time::sleep(IDLE_REFRESH), if idle && announced => {
                if let Err(error) = shared
                    .store
                    .announce_idle(&shared.subscription, &config.worker_id, true)
                    .await
                {
                    metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
                    tracing::debug!(subscription = shared.subscription, %error, "could not refresh the idle announcement");
                }
                idle = false;
            }
        }
    }

    // Claims still in flight finish; what they took is handed back unstarted.
    while let Some((result, _reserved, _, _)) = claims.next().await {
        if let Ok(batch) = result {
            for delivery in batch.deliveries {
                let _ = settle_tx.send(Settlement::Release {
                    lease: delivery.lease(),
                });
            }
        }
    }

    // Shutdown: let running handlers finish up to the deadline.
    let deadline = tokio::time::sleep(config.shutdown_timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => break,
            next = running.join_next() => if next.is_none() { break },
        }
    }
    if !running.is_empty() {
        tracing::warn!(
            subscription = shared.subscription,
            unfinished = running.len(),
            "shutdown deadline passed; recording unfinished handlers as failed attempts"
        );
        // Each aborted task's guard records its failed attempt.
        running.abort_all();
        while running.join_next().await.is_some() {}
    }
    if let Some(pending) = withdrawing.take() {
        let _ = pending.await;
    }
    if announced {
        withdraw(Arc::clone(&shared)).await;
    }
    drop(settle_tx);
    if let Err(error) = settler.await {
        tracing::error!(%error, "settler ended abnormally");
    }
    services_stop.cancel();
    let _ = heartbeat.await;
    if let Some(maintenance) = maintenance {
        let _ = maintenance.await;
    }
    tracing::info!(
        subscription = shared.subscription,
        worker_id = config.worker_id,
        "worker stopped"
    );
}

/// Tells producers this worker is busy again (they need not wake it).
async fn withdraw<S: OutboxStore>(shared: Arc<Shared<S>>) {
    if let Err(error) = shared
        .store
        .announce_idle(&shared.subscription, &shared.config.worker_id, false)
        .await
    {
        metrics::counter!(STORE_ERRORS, "operation" => "announce_idle").increment(1);
        tracing::warn!(subscription = shared.subscription, %error, "could not withdraw the idle announcement; producers keep notifying");
    }
}

/// Tracks one unit of work in the ledger and starts it on the slots it
/// takes from `reserved`.
fn spawn_group<S: OutboxStore>(
    shared: &Arc<Shared<S>>,
    group: Vec<ClaimedDelivery>,
    claim_sent: tokio::time::Instant,
    reserved: &mut tokio::sync::OwnedSemaphorePermit,
    settle_tx: &mpsc::UnboundedSender<Settlement>,
    freed: &Arc<Notify>,
    running: &mut JoinSet<()>,
) {
    let Some(permit) = reserved.split(group.len()) else {
        // Cannot happen: a claim takes no more than the slots it reserved.
        for delivery in group {
            let _ = settle_tx.send(Settlement::Release {
                lease: delivery.lease(),
            });
        }
        return;
    };
    for delivery in &group {
        shared
            .in_flight
            .track(delivery, claim_sent, shared.config.lease);
    }
    shared
        .executor
        .spawn_group(group, permit, settle_tx, freed, running);
}
