//! Background upkeep: the rescuer and the pruner.
//!
//! The **rescuer** returns deliveries whose lease expired on the database
//! clock (a crashed or partitioned worker) to the queue after a backoff, or
//! dead-letters them when that was their last attempt. The **pruner** deletes, in small batches,
//! receipts and fully delivered messages older than the retention; dead
//! letters and their messages are kept until an operator acts.
//!
//! They run on one elected worker per database: before each rescue pass a
//! runner takes or renews the database's maintenance lease
//! ([`OutboxStore::lead_maintenance`]), and only the leader rescues and
//! prunes; the others try again each interval and take over once a leader
//! that stopped resigned or one that died let its lease run out. Two leaders
//! at once (a lease that lapsed during a slow pass) is harmless: each write
//! is a short statement that skips rows others hold. A failed pass is logged
//! and tried again at the next pass: after the interval, or after up to ten
//! intervals when the last pass was slow (see [`Maintenance::run`]).

use std::time::Duration;

use courier_core::{
    OutboxStore, PruneReport, RescueParams, RetryPolicy, StoreError, ValidationError,
};
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
/// How long the maintenance leader's lease lasts, by default: a leader that
/// died is replaced within this plus one rescue interval.
pub const DEFAULT_LEADER_LEASE: Duration = Duration::from_secs(15);

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
    /// How rescued deliveries are spaced out before their next attempt (its
    /// `base` and `cap`; the crash may have been the message's fault).
    pub rescue_backoff: RetryPolicy,
    /// How long a leader's lease lasts without renewal; at least twice the
    /// rescue interval (the leader renews it before each rescue pass).
    pub leader_lease: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            rescue_interval: DEFAULT_RESCUE_INTERVAL,
            retention: Some(DEFAULT_RETENTION),
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            batch: DEFAULT_BATCH,
            rescue_backoff: RetryPolicy::default(),
            leader_lease: DEFAULT_LEADER_LEASE,
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
        if self.leader_lease < self.rescue_interval * 2 {
            return Err(ValidationError::new(
                "maintenance.leader_lease",
                format!(
                    "must be at least twice the rescue interval ({:?}), got {:?}",
                    self.rescue_interval, self.leader_lease
                ),
            ));
        }
        self.rescue_backoff
            .validate()
            .map_err(|error| ValidationError::new("maintenance.rescue_backoff", error.to_string()))
    }
}

/// The rescuer and pruner over one store.
#[derive(Debug, Clone)]
pub struct Maintenance<S> {
    store: S,
    config: MaintenanceConfig,
    holder: String,
}

impl<S: OutboxStore> Maintenance<S> {
    /// Maintenance of `store` per `config`, competing for leadership under
    /// a name of its own.
    pub fn new(store: S, config: MaintenanceConfig) -> Result<Self, ValidationError> {
        config.validate()?;
        let holder = format!("{}-{}", std::process::id(), uuid::Uuid::now_v7());
        Ok(Self {
            store,
            config,
            holder,
        })
    }

    /// The name this runner holds the maintenance lease under.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Takes or renews the database's maintenance lease; returns whether
    /// this runner leads (see [`OutboxStore::lead_maintenance`]).
    pub async fn lead(&self) -> Result<bool, StoreError> {
        self.store
            .lead_maintenance(&self.holder, self.config.leader_lease)
            .await
    }

    /// Gives up the lease if this runner holds it.
    pub async fn resign(&self) -> Result<(), StoreError> {
        self.store.resign_maintenance(&self.holder).await
    }

    /// Rescues every expired lease now; returns how many deliveries moved.
    pub async fn rescue_once(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        let params = RescueParams {
            limit: self.config.batch,
            backoff_base: self.config.rescue_backoff.base,
            backoff_cap: self.config.rescue_backoff.cap,
        };
        loop {
            let moved = self.store.rescue_expired(&params).await?;
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

    /// Runs both on their intervals until `stop` fires, while this runner
    /// leads (it tries for the lease before every rescue pass, and resigns
    /// when stopped). A pass that took long (its scans walk row versions an
    /// old snapshot elsewhere keeps alive) spaces the next one out to
    /// [`COST_RATIO`] times its duration, up to [`MAX_SPACING`] intervals, so
    /// upkeep takes a small share of the database's time.
    pub async fn run(self, stop: CancellationToken) {
        // Both run once at start, as a restarted worker should.
        let mut next_rescue = tokio::time::Instant::now();
        let mut next_prune = next_rescue;
        let mut leading = false;
        // The leader also renews between passes, which a slow pass spaces
        // out beyond the lease.
        let mut renew = tokio::time::interval(self.config.leader_lease / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.reset();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = renew.tick(), if leading => {
                    leading = self.elect(leading).await;
                }
                () = tokio::time::sleep_until(next_rescue) => {
                    let started = tokio::time::Instant::now();
                    leading = self.elect(leading).await;
                    if leading {
                        if let Err(error) = self.rescue_once().await {
                            metrics::counter!(STORE_ERRORS, "operation" => "rescue").increment(1);
                            tracing::warn!(%error, "rescue pass failed");
                        }
                    }
                    next_rescue = next_pass(started, started.elapsed(), self.config.rescue_interval);
                }
                () = tokio::time::sleep_until(next_prune), if leading => {
                    let started = tokio::time::Instant::now();
                    if let Err(error) = self.prune_once().await {
                        metrics::counter!(STORE_ERRORS, "operation" => "prune").increment(1);
                        tracing::warn!(%error, "prune pass failed");
                    }
                    next_prune = next_pass(started, started.elapsed(), self.config.prune_interval);
                }
            }
        }
        if leading {
            if let Err(error) = self.resign().await {
                tracing::warn!(%error, "could not resign the maintenance lease; it runs out on its own");
            }
        }
    }

    /// One election: whether this runner leads now (`was`: before).
    async fn elect(&self, was: bool) -> bool {
        match self.lead().await {
            Ok(now) => {
                if now != was {
                    tracing::info!(holder = %self.holder, leading = now, "maintenance leadership changed");
                }
                now
            }
            Err(error) => {
                metrics::counter!(STORE_ERRORS, "operation" => "lead_maintenance").increment(1);
                tracing::warn!(%error, "could not renew the maintenance lease; pausing maintenance");
                false
            }
        }
    }
}

/// A maintenance pass waits at least this multiple of the last one's duration.
pub const COST_RATIO: u32 = 20;

/// A slow pass spaces the next one out to at most this multiple of the interval.
pub const MAX_SPACING: u32 = 10;

/// When the pass after one that started at `started` and took `took` runs.
fn next_pass(
    started: tokio::time::Instant,
    took: Duration,
    interval: Duration,
) -> tokio::time::Instant {
    started + (took * COST_RATIO).clamp(interval, interval * MAX_SPACING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_pass_spaces_out_the_next_one() {
        let start = tokio::time::Instant::now();
        let every = Duration::from_secs(5);
        assert_eq!(
            next_pass(start, Duration::from_millis(3), every),
            start + every
        );
        assert_eq!(
            next_pass(start, Duration::from_secs(1), every),
            start + Duration::from_secs(20)
        );
        // Never more than ten intervals apart (a pass that waited for a
        // database that was down says nothing about the next one's cost).
        assert_eq!(
            next_pass(start, Duration::from_secs(30), every),
            start + Duration::from_secs(50)
        );
    }
}
