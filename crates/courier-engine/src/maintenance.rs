//! Background upkeep: the rescuer and the pruner.
//!
//! The **rescuer** returns deliveries whose lease expired on the database
//! clock (a crashed or partitioned worker) to the queue, or dead-letters them
//! when that was their last attempt. The **pruner** deletes, in small batches,
//! receipts and fully delivered messages older than the retention; dead
//! letters and their messages are kept until an operator acts.
//!
//! Both are safe to run in every process at once: each write is a short
//! statement that skips rows others hold. A failed pass is logged and tried
//! again at the next interval.

use std::time::Duration;

use courier_core::{OutboxStore, PruneReport, StoreError, ValidationError};
use tokio_util::sync::CancellationToken;

use crate::metrics_names::{PRUNED_MESSAGES, PRUNED_RECEIPTS, RESCUED, STORE_ERRORS};

/// How often expired leases are looked for, by default.
pub const DEFAULT_RESCUE_INTERVAL: Duration = Duration::from_secs(5);
/// How long completed messages and receipts are kept, by default (7 days).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the pruner runs, by default.
pub const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// Rows per rescue or prune statement, by default.
pub const DEFAULT_BATCH: usize = 1000;

/// When and how much maintenance runs.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// Time between rescue passes.
    pub rescue_interval: Duration,
    /// Keep completed messages and receipts this long; `None` keeps them forever.
    pub retention: Option<Duration>,
    /// Time between prune passes.
    pub prune_interval: Duration,
    /// Rows per statement.
    pub batch: usize,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            rescue_interval: DEFAULT_RESCUE_INTERVAL,
            retention: Some(DEFAULT_RETENTION),
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            batch: DEFAULT_BATCH,
        }
    }
}

impl MaintenanceConfig {
    /// Checks the intervals and batch size.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.rescue_interval.is_zero() {
            return Err(ValidationError::new(
                "maintenance.rescue_interval",
                "must be above zero",
            ));
        }
        if self.prune_interval.is_zero() {
            return Err(ValidationError::new(
                "maintenance.prune_interval",
                "must be above zero",
            ));
        }
        if self.batch == 0 || self.batch > 100_000 {
            return Err(ValidationError::new(
                "maintenance.batch",
                format!("must be between 1 and 100000, got {}", self.batch),
            ));
        }
        Ok(())
    }
}

/// The rescuer and pruner over one store.
#[derive(Debug, Clone)]
pub struct Maintenance<S> {
    store: S,
    config: MaintenanceConfig,
}

impl<S: OutboxStore> Maintenance<S> {
    /// Maintenance of `store` per `config`.
    pub fn new(store: S, config: MaintenanceConfig) -> Result<Self, ValidationError> {
        config.validate()?;
        Ok(Self { store, config })
    }

    /// Rescues every expired lease now; returns how many deliveries moved.
    pub async fn rescue_once(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let moved = self.store.rescue_expired(self.config.batch).await?;
            total += moved;
            if moved < u64::try_from(self.config.batch).unwrap_or(u64::MAX) {
                break;
            }
        }
        if total > 0 {
            tracing::info!(rescued = total, "returned deliveries with expired leases");
            metrics::counter!(RESCUED).increment(total);
        }
        Ok(total)
    }

    /// Prunes everything past the retention now, batch by batch.
    pub async fn prune_once(&self) -> Result<PruneReport, StoreError> {
        let mut total = PruneReport::default();
        let Some(retention) = self.config.retention else {
            return Ok(total);
        };
        let full = u64::try_from(self.config.batch).unwrap_or(u64::MAX);
        loop {
            let report = self.store.prune(retention, self.config.batch).await?;
            total.messages += report.messages;
            total.receipts += report.receipts;
            if report.messages < full && report.receipts < full {
                break;
            }
            tokio::task::yield_now().await;
        }
        metrics::counter!(PRUNED_MESSAGES).increment(total.messages);
        metrics::counter!(PRUNED_RECEIPTS).increment(total.receipts);
        Ok(total)
    }

    /// Runs both on their intervals until `stop` fires.
    pub async fn run(self, stop: CancellationToken) {
        let mut rescue = tokio::time::interval(self.config.rescue_interval);
        let mut prune = tokio::time::interval(self.config.prune_interval);
        rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = rescue.tick() => {
                    if let Err(error) = self.rescue_once().await {
                        metrics::counter!(STORE_ERRORS, "operation" => "rescue").increment(1);
                        tracing::warn!(%error, "rescue pass failed");
                    }
                }
                _ = prune.tick() => {
                    if let Err(error) = self.prune_once().await {
                        metrics::counter!(STORE_ERRORS, "operation" => "prune").increment(1);
                        tracing::warn!(%error, "prune pass failed");
                    }
                }
            }
        }
    }
}
