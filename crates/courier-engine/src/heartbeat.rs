//! Keeps the leases of running handlers alive.
//!
//! Every `interval` (a third of the lease by default) the heartbeat extends
//! the leases of all deliveries this worker is running, in one fenced write.
//! A lease that can no longer be extended has expired or been taken over: the
//! handler keeps running, but its completion will be refused and (for a
//! transactional handler) its writes rolled back.
//!
//! Failure: if the store is unreachable the extension is skipped; the next
//! tick tries again, and leases that expire meanwhile are rescued elsewhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{LeaseRef, OutboxStore};
use tokio_util::sync::CancellationToken;

use crate::metrics_names::{LEASES_LOST, STORE_ERRORS};

/// A lease the worker holds, and whether its outcome is being written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) lease: LeaseRef,
    /// The settler has the outcome: the delivery may be gone from the
    /// database before it leaves this map, so a failed extension is no loss.
    pub(crate) settling: bool,
}

/// The leases a worker currently holds, by delivery id.
pub(crate) type InFlight = Arc<Mutex<HashMap<i64, Held>>>;

/// The leases held now, by delivery id: every write that locks several
/// deliveries lists them in that order, so two of them never deadlock.
pub(crate) fn snapshot(in_flight: &InFlight) -> Vec<LeaseRef> {
    let mut leases: Vec<LeaseRef> = in_flight
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .map(|held| held.lease)
        .collect();
    leases.sort_unstable_by_key(|l| l.delivery_id);
    leases
}

/// Extends every held lease once; returns how many were lost.
pub(crate) async fn beat_once<S: OutboxStore>(
    store: &S,
    subscription: &str,
    in_flight: &InFlight,
    lease: Duration,
) -> usize {
    let leases = snapshot(in_flight);
    if leases.is_empty() {
        return 0;
    }
    match store.extend_many(&leases, lease).await {
        Ok(extended) => {
            let extended: std::collections::HashSet<i64> = extended.into_iter().collect();
            // A delivery may have finished between the snapshot and the write.
            let still_running: std::collections::HashSet<i64> = in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .filter(|(_, held)| !held.settling)
                .map(|(id, _)| *id)
                .collect();
            let lost = leases
                .iter()
                .filter(|l| {
                    !extended.contains(&l.delivery_id) && still_running.contains(&l.delivery_id)
                })
                .count();
            if lost > 0 {
                tracing::warn!(subscription, lost, "leases expired under running handlers");
                metrics::counter!(LEASES_LOST, "subscription" => subscription.to_owned())
                    .increment(u64::try_from(lost).unwrap_or(u64::MAX));
            }
            lost
        }
        Err(error) => {
            metrics::counter!(STORE_ERRORS, "operation" => "extend").increment(1);
            tracing::warn!(subscription, %error, "heartbeat failed");
            0
        }
    }
}

pub(crate) async fn run<S: OutboxStore>(
    store: S,
    subscription: String,
    in_flight: InFlight,
    lease: Duration,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        beat_once(&store, &subscription, &in_flight, lease).await;
    }
}
