//! The worker: claims deliveries for one subscription and runs their handlers.
//!
//! States of a delivery as the worker sees it: claimed (leased, attempt
//! spent) → started (handler running, lease kept alive by the heartbeat) →
//! settled (completed, retried with backoff, or dead-lettered). A delivery
//! claimed but not started when shutdown begins is handed back with its
//! attempt refunded.
//!
//! A running worker is a set of services wired here around one lease ledger
//! ([`InFlight`]): the fetcher (`fetcher`, claims) adds what it claims, the
//! executor (`executor`, handlers) watches the leases of what runs, the
//! heartbeat (`heartbeat`) extends them, the settler (`settle`) writes
//! outcomes and forgets them; maintenance (rescuer and pruner) runs beside
//! them if configured.
//!
//! Failure: a crash of the whole process leaves its leases to expire, after
//! which any worker's rescuer returns them. Shutdown stops claiming, lets
//! running handlers finish until the deadline, then aborts the rest and
//! records them as failed attempts to retry at once; it returns once every
//! outcome was written (or given up on, see `settle`) and every service task
//! ended.

use std::sync::Arc;

use courier_core::{ClaimParams, ClaimedDelivery, LeaseRef, OutboxStore, Route, StoreError};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::executor::{Executor, Routes};
use crate::fetcher::{self, Fetcher};
use crate::heartbeat;
use crate::in_flight::InFlight;
use crate::maintenance::Maintenance;
use crate::settle;

/// A configured worker, registered with the store, not yet running.
pub struct Worker<S: OutboxStore> {
    store: S,
    subscription: String,
    config: WorkerConfig,
    /// A full-batch claim from the first tenant.
    claim: ClaimParams,
    in_flight: InFlight,
    /// Cancelled when shutdown begins.
    stopping: CancellationToken,
    executor: Arc<Executor<S>>,
    wake: Option<watch::Receiver<u64>>,
}

/// A running worker; [`WorkerHandle::shutdown`] stops it gracefully.
pub struct WorkerHandle {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    worker_id: String,
}

impl<S: OutboxStore> Worker<S> {
    /// Wires a worker's services over one lease ledger, from a configuration
    /// the builder checked: claims for `claim_routes`, runs `routes`.
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
        let claim = ClaimParams {
            subscription: subscription.clone(),
            routes: claim_routes,
            limit: config.batch_size,
            lease: config.lease,
            worker_id: config.worker_id.clone(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: config.tenant_in_flight_limit,
        };
        let executor = Arc::new(Executor::new(
            store.clone(),
            subscription.clone(),
            routes,
            &config,
            in_flight.clone(),
            stopping.clone(),
        ));
        Self {
            store,
            subscription,
            config,
            claim,
            in_flight,
            stopping,
            executor,
            wake,
        }
    }

    /// The subscription this worker serves.
    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Claims one batch, runs every handler to completion and settles the
    /// outcomes before returning how many deliveries were claimed. For tests
    /// and tools that want deterministic steps instead of a running loop.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let claim_sent = tokio::time::Instant::now();
        let batch = fetcher::claim(&self.store, &self.claim).await?.deliveries;
        let count = batch.len();
        let mut runs = JoinSet::new();
        let leases: Vec<LeaseRef> = batch.iter().map(ClaimedDelivery::lease).collect();
        for delivery in &batch {
            self.in_flight
                .track(delivery, claim_sent, self.config.lease);
        }
        for group in self.executor.groups(batch) {
            let executor = Arc::clone(&self.executor);
            runs.spawn(async move { executor.execute_group(group).await });
        }
        let mut settlements = Vec::with_capacity(count);
        while let Some(result) = runs.join_next().await {
            if let Ok(group) = result {
                settlements.extend(group);
            }
        }
        settle::settle_batch(&self.store, &self.subscription, settlements).await;
        self.in_flight.untrack(&leases);
        Ok(count)
    }

    /// Runs one heartbeat now; returns how many leases were found lost.
    pub async fn heartbeat_once(&self) -> usize {
        heartbeat::beat_once(
            &self.store,
            &self.subscription,
            &self.in_flight,
            self.config.lease,
            self.config.timeout_grace(),
        )
        .await
    }

    /// Starts the fetch loop, heartbeat, settler and (if configured)
    /// maintenance on the current tokio runtime.
    pub fn start(self) -> WorkerHandle {
        let stop = self.stopping.clone();
        let worker_id = self.config.worker_id.clone();
        let task = tokio::spawn(self.run());
        WorkerHandle {
            stop,
            task,
            worker_id,
        }
    }

    /// The services, until shutdown completes.
    async fn run(self) {
        let config = &self.config;
        let (settle_tx, settle_rx) = mpsc::unbounded_channel();
        let settled = Arc::new(Notify::new());
        let settler = tokio::spawn(settle::run(
            self.store.clone(),
            self.subscription.clone(),
            settle_rx,
            self.in_flight.clone(),
            Arc::clone(&settled),
        ));
        let services_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat::run(
            self.store.clone(),
            self.subscription.clone(),
            self.in_flight.clone(),
            config.lease,
            config.heartbeat(),
            config.timeout_grace(),
            services_stop.clone(),
        ));
        let maintenance = config.maintenance.clone().and_then(|maintenance_config| {
            Maintenance::new(self.store.clone(), maintenance_config)
                .map(|m| tokio::spawn(m.run(services_stop.clone())))
                .ok()
        });
        let mut fetcher = Fetcher::new(
            self.store.clone(),
            Arc::clone(&self.executor),
            self.in_flight.clone(),
            self.claim.clone(),
            config,
            settle_tx,
            settled,
        );
        let mut running: JoinSet<()> = JoinSet::new();
        tracing::info!(
            subscription = self.subscription,
            worker_id = config.worker_id,
            "worker started"
        );

        fetcher.run(self.wake, &self.stopping, &mut running).await;

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
                subscription = self.subscription,
                unfinished = running.len(),
                "shutdown deadline passed; recording unfinished handlers as failed attempts"
            );
            // Each aborted task's guard records its failed attempt.
            running.abort_all();
            while running.join_next().await.is_some() {}
        }
        // Dropping the fetcher closes the settler's queue: it ends once it
        // wrote what is queued.
        fetcher.finish().await;
        if let Err(error) = settler.await {
            tracing::error!(%error, "settler ended abnormally");
        }
        services_stop.cancel();
        let _ = heartbeat.await;
        if let Some(maintenance) = maintenance {
            let _ = maintenance.await;
        }
        tracing::info!(
            subscription = self.subscription,
            worker_id = config.worker_id,
            "worker stopped"
        );
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
        if let Err(error) = self.task.await {
            tracing::error!(%error, "worker task ended abnormally");
        }
    }

    /// Whether the worker has stopped (after shutdown, or a fatal error).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}
