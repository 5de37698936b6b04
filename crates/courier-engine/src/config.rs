//! How a worker is configured: [`WorkerConfig`], its defaults and its checks.
//!
//! Every default is a named constant. [`WorkerConfig::validate`] refuses a
//! setting the worker could not keep its promises under, naming the field:
//! for instance a heartbeat slower than half the lease, which could let a
//! lease lapse under a running handler. The durations the services derive
//! from the configuration (heartbeat interval, lease margin, timeout grace)
//! are computed here, once, so the executor and the heartbeat agree on them.

use std::time::Duration;

use courier_core::{RetryPolicy, ValidationError};

use crate::maintenance::MaintenanceConfig;

/// The route topic that stands for every topic a subscription receives
/// (stores treat a route with this topic and version 0 as a wildcard).
pub const CATCH_ALL_TOPIC: &str = "*";
/// The route version that stands for every schema version.
pub const CATCH_ALL_VERSION: i32 = 0;

/// Handlers running at once, by default.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Deliveries per claim, by default.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Transactional deliveries run in one database transaction, by default.
pub const DEFAULT_TRANSACTION_BATCH_SIZE: usize = 64;
/// Lease length, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long an idle worker waits between claims without a wake-up, by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long shutdown waits for running handlers, by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one handler may run before it is cancelled and its attempt
/// fails, by default (River's default too).
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(60);
/// A handler is stopped this share of the lease (at most
/// [`MAX_LEASE_MARGIN`]) before its lease could expire, so it has stopped
/// before anyone else can claim its delivery or the next of its ordering key.
const LEASE_MARGIN_DIVISOR: u32 = 10;
/// The most a handler is stopped before its lease could expire.
const MAX_LEASE_MARGIN: Duration = Duration::from_secs(1);

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Handlers running at once.
    pub concurrency: usize,
    /// The most deliveries claimed in one round trip.
    pub batch_size: usize,
    /// The most transactional deliveries of one claim that run in one
    /// database transaction, one after another, committing together (1: each
    /// in its own). If one fails, the transaction rolls back and the others
    /// run again together, each in a savepoint, so a failure costs its
    /// batch-mates at most one rerun (a transactional handler may be called
    /// twice for one attempt; its writes commit once); for 10 s after, groups
    /// run every handler in a savepoint from the start (a round trip each on
    /// PostgreSQL). After a rollback for another reason (a lost lease, a
    /// deadlock) the worker runs one delivery per transaction for 10 s, since
    /// handlers whose writes meet on the same rows deadlock across groups.
    /// Lower it for slow transactional handlers: a group holds its locks
    /// until it commits.
    pub transaction_batch_size: usize,
    /// How long a claim lasts without a heartbeat (database clock).
    pub lease: Duration,
    /// Time between heartbeats; a third of the lease if `None`.
    pub heartbeat_interval: Option<Duration>,
    /// Time between claims when idle and no wake-up arrives.
    pub poll_interval: Duration,
    /// The most deliveries of one tenant running at once in this subscription.
    pub tenant_in_flight_limit: Option<u32>,
    /// How long shutdown waits for running handlers.
    pub shutdown_timeout: Duration,
    /// How long one handler may run before it is cancelled and its attempt
    /// fails with `timeout after …` (`None`: no limit). The heartbeat never
    /// extends a lease past a handler's timeout (plus the time to write its
    /// outcome), so a hung handler cannot hold its slot and its ordering key.
    pub handler_timeout: Option<Duration>,
    /// The retry policy for topics without one of their own.
    pub retry: RetryPolicy,
    /// Who this worker is, in leases and logs.
    pub worker_id: String,
    /// Rescuer and pruner run by this worker; `None` leaves them to another process.
    pub maintenance: Option<MaintenanceConfig>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: DEFAULT_CONCURRENCY,
            batch_size: DEFAULT_BATCH_SIZE,
            transaction_batch_size: DEFAULT_TRANSACTION_BATCH_SIZE,
            lease: DEFAULT_LEASE,
            heartbeat_interval: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            tenant_in_flight_limit: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            handler_timeout: Some(DEFAULT_HANDLER_TIMEOUT),
            retry: RetryPolicy::default(),
            worker_id: default_worker_id(),
            maintenance: Some(MaintenanceConfig::default()),
        }
    }
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &suffix[..8])
}

impl WorkerConfig {
    /// Checks every field, naming the one refused.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(ValidationError::new(
                "concurrency",
                format!("must be between 1 and 10000, got {}", self.concurrency),
            ));
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(ValidationError::new(
                "batch_size",
                format!("must be between 1 and 10000, got {}", self.batch_size),
            ));
        }
        if self.transaction_batch_size == 0 || self.transaction_batch_size > 10_000 {
            return Err(ValidationError::new(
                "transaction_batch_size",
                format!(
                    "must be between 1 and 10000, got {}",
                    self.transaction_batch_size
                ),
            ));
        }
        if self.lease < Duration::from_millis(100) {
            return Err(ValidationError::new("lease", "must be at least 100 ms"));
        }
        if let Some(interval) = self.heartbeat_interval {
            // A handler is stopped a margin before its lease could lapse: the
            // heartbeat must extend well before that.
            if interval.is_zero() || interval > self.lease / 2 {
                return Err(ValidationError::new(
                    "heartbeat_interval",
                    "must be above zero and at most half the lease",
                ));
            }
        }
        if self.poll_interval.is_zero() {
            return Err(ValidationError::new("poll_interval", "must be above zero"));
        }
        if self.tenant_in_flight_limit == Some(0) {
            return Err(ValidationError::new(
                "tenant_in_flight_limit",
                "must be at least 1",
            ));
        }
        if self.handler_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ValidationError::new(
                "handler_timeout",
                "must be above zero (None for no limit)",
            ));
        }
        if self.worker_id.is_empty() || self.worker_id.len() > 200 {
            return Err(ValidationError::new("worker_id", "must be 1 to 200 bytes"));
        }
        self.retry.validate()?;
        if let Some(maintenance) = &self.maintenance {
            maintenance.validate()?;
        }
        Ok(())
    }

    /// Time between heartbeats: the configured interval, else a third of the lease.
    pub(crate) fn heartbeat(&self) -> Duration {
        self.heartbeat_interval.unwrap_or(self.lease / 3)
    }

    /// How long before its lease could expire a handler is stopped.
    pub(crate) fn lease_margin(&self) -> Duration {
        (self.lease / LEASE_MARGIN_DIVISOR).min(MAX_LEASE_MARGIN)
    }

    /// How far past a handler's timeout its lease is still extended, so its
    /// timeout (not a lapsed lease) ends it and its failure can be written.
    pub(crate) fn timeout_grace(&self) -> Duration {
        self.heartbeat().max(self.lease_margin() * 2)
    }
}
