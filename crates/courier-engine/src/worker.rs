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

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{
    BatchItem, BatchRollback, ClaimBatch, ClaimParams, ClaimedDelivery, Failure, HandlerError,
    LeaseRef, OutboxStore, RetryPolicy, Route, Snooze, StoreError, TransactionalBatchOutcome,
    TransactionalOutcome, TxWork,
};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{WorkerConfig, CATCH_ALL_TOPIC, CATCH_ALL_VERSION};
use crate::handler::{ErasedHandler, Prepared};
use crate::heartbeat;
use crate::in_flight::InFlight;
use crate::maintenance::Maintenance;
use crate::metrics_names::{
    CLAIMED, HANDLERS_STOPPED, HANDLER_SECONDS, PICKUP_SECONDS, STORE_ERRORS, TIMED_OUT,
};
use crate::settle::{self, Settlement};

/// How long a worker runs transactional deliveries one per transaction after
/// a group of them rolled back for a lost lease or a store error, and how
/// long its groups isolate failures in savepoints after a handler failed in
/// one. Handlers whose writes meet on the same rows
/// can deadlock when several groups run at once (PostgreSQL then aborts one
/// group after a second); one transaction per delivery cannot wait on another
/// while holding a lock it needs, so the worker falls back to that for a
/// while instead of deadlocking group after group.
const BATCHING_PAUSE: Duration = Duration::from_secs(10);

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

/// Handlers by (topic, schema version).
pub(crate) type RouteTable<C> = HashMap<(String, i32), Arc<dyn ErasedHandler<C>>>;

/// What a delivery runs with: its handler, and its topic's retry policy and
/// timeout where the topic has its own.
pub(crate) struct Routes<C> {
    pub(crate) handlers: RouteTable<C>,
    pub(crate) policies: HashMap<String, RetryPolicy>,
    pub(crate) timeouts: HashMap<String, Option<Duration>>,
}

struct Shared<S: OutboxStore> {
    store: S,
    subscription: String,
    routes: RouteTable<S::Connection>,
    policies: HashMap<String, RetryPolicy>,
    timeouts: HashMap<String, Option<Duration>>,
    claim_routes: Vec<Route>,
    config: WorkerConfig,
    in_flight: InFlight,
    stopping: CancellationToken,
    /// Until when transactional deliveries run one per transaction, after a
    /// group rolled back (see [`BATCHING_PAUSE`]).
    batching_paused_until: Mutex<Option<Instant>>,
    /// Until when transactional groups run each handler in a savepoint,
    /// after a handler failed in a group (see [`BATCHING_PAUSE`]).
    isolating_until: Mutex<Option<Instant>>,
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
        Worker {
            shared: Arc::new(Shared {
                store,
                subscription,
                routes: routes.handlers,
                policies: routes.policies,
                timeouts: routes.timeouts,
                claim_routes,
                config,
                in_flight: InFlight::default(),
                stopping: CancellationToken::new(),
                batching_paused_until: Mutex::new(None),
                isolating_until: Mutex::new(None),
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
        for group in self.shared.groups(batch) {
            let shared = Arc::clone(&self.shared);
            runs.spawn(async move { execute_group(shared, group).await });
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
                    retry_in: Some(Duration::ZERO),
                },
                topic: std::mem::take(&mut self.topic),
            });
        }
    }
}

impl<S: OutboxStore> Shared<S> {
    /// The handler for a delivery's topic and version, else the catch-all.
    fn route_of(
        &self,
        delivery: &ClaimedDelivery,
    ) -> Option<&Arc<dyn ErasedHandler<S::Connection>>> {
        self.routes
            .get(&(delivery.topic.clone(), delivery.schema_version))
            .or_else(|| {
                self.routes
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

    /// Splits a claimed batch into units of work: each plain delivery on its
    /// own, transactional ones in groups of up to `transaction_batch_size`.
    fn groups(&self, deliveries: Vec<ClaimedDelivery>) -> Vec<Vec<ClaimedDelivery>> {
        let size = if self.batching_paused() {
            1
        } else {
            self.config.transaction_batch_size
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
                    for group in shared.groups(deliveries) {
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

/// Starts one unit of work on the slots it takes from `reserved`; its
/// outcomes go to the settler, and a task that ends without them (a panic,
/// an abort at the shutdown deadline) records failed attempts instead.
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
    let mut guards = Vec::with_capacity(group.len());
    for delivery in &group {
        shared
            .in_flight
            .track(delivery, claim_sent, shared.config.lease);
        guards.push(OutcomeGuard {
            settle: settle_tx.clone(),
            lease: delivery.lease(),
            topic: delivery.topic.clone(),
            settled: false,
        });
    }
    let task_shared = Arc::clone(shared);
    let task_freed = Arc::clone(freed);
    let in_flight = shared.in_flight.clone();
    let settle = settle_tx.clone();
    running.spawn(async move {
        let settlements = execute_group(task_shared, group).await;
        for guard in &mut guards {
            guard.settled = true;
        }
        drop(permit);
        task_freed.notify_one();
        // A committed transactional group's rows are already gone: its
        // leases must not count as lost before the settler forgets them.
        let leases: Vec<LeaseRef> = settlements.iter().map(Settlement::lease).collect();
        in_flight.mark_settling(&leases);
        for settlement in settlements {
            let _ = settle.send(settlement);
        }
    });
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

impl<S: OutboxStore> Shared<S> {
    /// The handler timeout of a delivery's topic.
    fn timeout_of(&self, delivery: &ClaimedDelivery) -> Option<Duration> {
        self.timeouts
            .get(&delivery.topic)
            .copied()
            .unwrap_or(self.config.handler_timeout)
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
        let margin = self.config.lease_margin();
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
}

/// The outcome of a handler that was stopped.
fn stopped_outcome<S: OutboxStore>(shared: &Shared<S>, stopped: Stopped) -> Outcome {
    match stopped {
        Stopped::LeaseLost => {
            metrics::counter!(HANDLERS_STOPPED, "subscription" => shared.subscription.clone())
                .increment(1);
            tracing::warn!("lease no longer held; the handler was stopped");
            Outcome::LeaseLost
        }
        Stopped::TimedOut(limit) => {
            metrics::counter!(TIMED_OUT, "subscription" => shared.subscription.clone())
                .increment(1);
            Outcome::Failed(HandlerError::retry(format!("timeout after {limit:?}")))
        }
    }
}

/// Runs one delivery's handler and turns its outcome into a settlement.
async fn execute<S: OutboxStore>(shared: Arc<Shared<S>>, delivery: ClaimedDelivery) -> Settlement {
    if shared.stopping.is_cancelled() {
        return Settlement::Release {
            lease: delivery.lease(),
        };
    }
    let span = tracing::info_span!(
        "courier.deliver",
        subscription = %shared.subscription,
        message_id = %delivery.message_id,
        tenant = %delivery.tenant,
        topic = %delivery.topic,
        attempt = delivery.attempt,
    );
    async move {
        record_pickup(&shared, &delivery);
        let started = Instant::now();
        let ids = [delivery.delivery_id];
        let timeout = shared.timeout_of(&delivery);
        let outcome = match shared.prepare(&delivery) {
            Err(error) => Outcome::Failed(error),
            Ok(Prepared::Plain(future)) => match shared
                .guarded(&ids, timeout, true, AssertUnwindSafe(future).catch_unwind())
                .await
            {
                Err(stopped) => stopped_outcome(&shared, stopped),
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
                match shared
                    .guarded(
                        &ids,
                        timeout,
                        !S::EXCLUSIVE_TRANSACTIONS,
                        AssertUnwindSafe(shared.store.run_transactional(&delivery, work))
                            .catch_unwind(),
                    )
                    .await
                {
                    Err(Stopped::TimedOut(limit)) => {
                        stopped_outcome(&shared, Stopped::TimedOut(limit))
                    }
                    Err(Stopped::LeaseLost) => stopped_outcome(&shared, Stopped::LeaseLost),
                    Ok(Ok(Ok(
                        TransactionalOutcome::Applied | TransactionalOutcome::AlreadyApplied,
                    ))) => Outcome::Committed,
                    Ok(Ok(Ok(TransactionalOutcome::LeaseLost))) => Outcome::LeaseLost,
                    Ok(Ok(Ok(TransactionalOutcome::HandlerFailed(error)))) => {
                        Outcome::Failed(error)
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
        metrics::histogram!(HANDLER_SECONDS, "subscription" => shared.subscription.clone(), "topic" => delivery.topic.clone())
            .record(started.elapsed().as_secs_f64());
        // Its outcome is known: while it waits for the rest of its unit of
        // work and the settler, its lease is kept (not counted lost if a
        // committed row is gone, not cut short at its handler's timeout).
        shared.in_flight.mark_settling(&[delivery.lease()]);
        settlement_for(&shared, &delivery, outcome)
    }
    .instrument(span)
    .await
}

/// Runs a unit of work from [`Shared::groups`]: one delivery on its own, or
/// transactional deliveries in one transaction. Normally the group runs
/// without savepoints (a savepoint costs a round trip per delivery on
/// PostgreSQL): if a handler fails, the transaction rolls back, the failed
/// handler's error is its outcome, and the others run again together, each in
/// a savepoint of their own, so one failure costs its batch-mates one rerun;
/// groups then keep isolating failures for [`BATCHING_PAUSE`]. When a group
/// rolls back for another reason (a lease lost, a store error such as a
/// deadlock, a panic), its deliveries run again each in its own transaction,
/// and so do groups for [`BATCHING_PAUSE`].
async fn execute_group<S: OutboxStore>(
    shared: Arc<Shared<S>>,
    mut group: Vec<ClaimedDelivery>,
) -> Vec<Settlement> {
    // In enqueue order, which is also the order every multi-row write locks
    // deliveries in (see InFlight::to_extend), so two never deadlock.
    group.sort_unstable_by_key(|d| d.delivery_id);
    if group.len() < 2 || shared.stopping.is_cancelled() {
        return execute_each(shared, group).await;
    }
    let mut settlements = Vec::with_capacity(group.len());
    let mut isolate = shared.isolating_failures();
    let mut first_run = true;
    loop {
        let (deliveries, works, singles) = transactional_works(&shared, group, first_run);
        first_run = false;
        for delivery in singles {
            // Not decodable (or not transactional): the single path reports it.
            settlements.push(execute(Arc::clone(&shared), delivery).await);
        }
        if deliveries.len() < 2 {
            drop(works);
            settlements.extend(execute_each(shared, deliveries).await);
            return settlements;
        }
        match run_batch(&shared, &deliveries, works, isolate).await {
            BatchRun::Committed(items) => {
                for (delivery, item) in deliveries.into_iter().zip(items) {
                    settlements.push(match item {
                        BatchItem::Applied | BatchItem::AlreadyApplied => Settlement::Committed {
                            lease: delivery.lease(),
                            topic: delivery.topic,
                        },
                        BatchItem::Failed(error) => {
                            settlement_for(&shared, &delivery, Outcome::Failed(error))
                        }
                    });
                }
                return settlements;
            }
            BatchRun::HandlerFailed { index, error } if !isolate && index < deliveries.len() => {
                shared.isolate_failures_for_a_while();
                let mut rest = deliveries;
                let failed = rest.remove(index);
                settlements.push(settlement_for(&shared, &failed, Outcome::Failed(error)));
                // The others again, together, each in its own savepoint.
                group = rest;
                isolate = true;
            }
            BatchRun::HandlerFailed { .. } => {
                return rolled_back(shared, deliveries, "rolled back".to_owned(), settlements)
                    .await;
            }
            BatchRun::RolledBack(reason) => {
                return rolled_back(shared, deliveries, reason, settlements).await;
            }
        }
    }
}

/// A group's transaction rolled back for a reason other than a handler's
/// failure: every delivery runs again in its own transaction.
async fn rolled_back<S: OutboxStore>(
    shared: Arc<Shared<S>>,
    deliveries: Vec<ClaimedDelivery>,
    reason: String,
    mut settlements: Vec<Settlement>,
) -> Vec<Settlement> {
    shared.pause_batching();
    tracing::warn!(
        subscription = shared.subscription,
        deliveries = deliveries.len(),
        reason,
        "transactional batch rolled back; running each delivery on its own"
    );
    settlements.extend(execute_each(shared, deliveries).await);
    settlements
}

/// Splits `group` into transactional deliveries with their prepared work and
/// the deliveries the single path must run (not decodable, not transactional).
fn transactional_works<S: OutboxStore>(
    shared: &Shared<S>,
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
        match shared.prepare(&delivery) {
            Ok(Prepared::Transactional(work)) => {
                if first_run {
                    record_pickup(shared, &delivery);
                }
                let work = limited(shared.timeout_of(&delivery), work);
                works.push(timed(shared, &delivery, work));
                deliveries.push(delivery);
            }
            Ok(Prepared::Plain(_)) | Err(_) => singles.push(delivery),
        }
    }
    (deliveries, works, singles)
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

/// Runs `works` for `deliveries` in one transaction while their leases are held.
async fn run_batch<S: OutboxStore>(
    shared: &Shared<S>,
    deliveries: &[ClaimedDelivery],
    works: Vec<TxWork<S::Connection>>,
    isolate: bool,
) -> BatchRun {
    let span = tracing::info_span!(
        "courier.deliver_batch",
        subscription = %shared.subscription,
        deliveries = deliveries.len(),
        isolate,
    );
    let batch = deliveries.iter().zip(works).collect();
    let ids: Vec<i64> = deliveries.iter().map(|d| d.delivery_id).collect();
    // Each handler's timeout is its own work's (see `limited`); the group as
    // a whole is stopped if a lease is no longer surely held, or once it ran
    // for the sum of its handlers' timeouts (a handler that ignores
    // cancellation must not keep the group's leases alive for ever).
    let group_timeout = deliveries
        .iter()
        .map(|d| shared.timeout_of(d))
        .try_fold(Duration::ZERO, |total, timeout| Some(total + timeout?));
    let outcome = shared
        .guarded(
            &ids,
            group_timeout,
            !S::EXCLUSIVE_TRANSACTIONS,
            AssertUnwindSafe(shared.store.run_transactional_batch(batch, isolate)).catch_unwind(),
        )
        .instrument(span)
        .await;
    match outcome {
        Err(Stopped::LeaseLost) => BatchRun::RolledBack("a lease was no longer held".to_owned()),
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
async fn execute_each<S: OutboxStore>(
    shared: Arc<Shared<S>>,
    deliveries: Vec<ClaimedDelivery>,
) -> Vec<Settlement> {
    futures_util::future::join_all(
        deliveries
            .into_iter()
            .map(|delivery| execute(Arc::clone(&shared), delivery)),
    )
    .await
}

/// Records how long a first attempt waited between enqueue and handler start.
fn record_pickup<S: OutboxStore>(shared: &Shared<S>, delivery: &ClaimedDelivery) {
    if delivery.attempt != 1 {
        return;
    }
    if let Ok(pickup) = (chrono::Utc::now() - delivery.enqueued_at).to_std() {
        metrics::histogram!(PICKUP_SECONDS, "subscription" => shared.subscription.clone())
            .record(pickup.as_secs_f64());
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

/// Wraps transactional work so its own run time is recorded as handler time.
fn timed<S: OutboxStore>(
    shared: &Shared<S>,
    delivery: &ClaimedDelivery,
    work: TxWork<S::Connection>,
) -> TxWork<S::Connection> {
    let histogram = metrics::histogram!(HANDLER_SECONDS, "subscription" => shared.subscription.clone(), "topic" => delivery.topic.clone());
    crate::handler::transactional_work(move |conn: &mut S::Connection| {
        Box::pin(async move {
            let started = Instant::now();
            let result = work(conn).await;
            histogram.record(started.elapsed().as_secs_f64());
            result
        }) as futures_util::future::BoxFuture<'_, Result<(), HandlerError>>
    })
}

/// The settlement that records a finished delivery's outcome.
fn settlement_for<S: OutboxStore>(
    shared: &Shared<S>,
    delivery: &ClaimedDelivery,
    outcome: Outcome,
) -> Settlement {
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
            let policy = shared
                .policies
                .get(&delivery.topic)
                .copied()
                .unwrap_or(shared.config.retry);
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
                    retry_in,
                },
                topic,
            }
        }
    }
}
