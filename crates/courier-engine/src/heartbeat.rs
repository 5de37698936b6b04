//! Keeps the leases of running handlers alive.
//!
//! Every `interval` (a third of the lease by default) the heartbeat extends
//! the leases of all deliveries this worker holds, in one fenced write (plus
//! one per delivery close to its handler's timeout, which is extended only to
//! that timeout and the time to write its outcome; past it, not at all). A
//! lease that can no longer be extended has expired or been taken over: the
//! ledger tells its handler to stop, and its completion would be refused.
//!
//! Failure: if the store is unreachable or slow, the extension is skipped or
//! late; handlers stop on their own when their lease is no longer surely held
//! (see [`crate::in_flight`]), and leases that expire meanwhile are rescued
//! elsewhere.

use std::collections::HashSet;
use std::time::Duration;

use courier_core::OutboxStore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::in_flight::{Extension, InFlight};
use crate::metrics_names::{LEASES_LOST, STORE_ERRORS};

/// Extends every held lease once; returns how many were lost under running handlers.
pub(crate) async fn beat_once<S: OutboxStore>(
    store: &S,
    subscription: &str,
    in_flight: &InFlight,
    lease: Duration,
    grace: Duration,
) -> usize {
    let sent = Instant::now();
    let extensions = in_flight.to_extend(sent, lease, grace);
    if extensions.is_empty() {
        return 0;
    }
    let (full, short): (Vec<Extension>, Vec<Extension>) =
        extensions.into_iter().partition(|e| e.by == lease);
    let mut lost = 0;
    let mut batches: Vec<Vec<Extension>> = Vec::with_capacity(1 + short.len());
    if !full.is_empty() {
        batches.push(full);
    }
    batches.extend(short.into_iter().map(|e| vec![e]));
    for batch in batches {
        let leases: Vec<_> = batch.iter().map(|e| e.lease).collect();
        let by = batch.first().map_or(lease, |e| e.by);
        match store.extend_many(&leases, by).await {
            Ok(answer) => {
                let answered = Instant::now();
                let applied: HashSet<i64> = answer.extended.into_iter().collect();
                let gone: HashSet<i64> = answer.gone.into_iter().collect();
                lost += in_flight.extended(sent, answered, &batch, &applied, &gone);
            }
            Err(error) => {
                metrics::counter!(STORE_ERRORS, "operation" => "extend").increment(1);
                tracing::warn!(subscription, %error, "heartbeat failed");
            }
        }
    }
    if lost > 0 {
        tracing::warn!(
            subscription,
            lost,
            "leases expired under running handlers; they are told to stop"
        );
        metrics::counter!(LEASES_LOST, "subscription" => subscription.to_owned())
            .increment(u64::try_from(lost).unwrap_or(u64::MAX));
    }
    lost
}

pub(crate) async fn run<S: OutboxStore>(
    store: S,
    subscription: String,
    in_flight: InFlight,
    lease: Duration,
    interval: Duration,
    grace: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        // A stuck extension (a hung connection) must not hold up shutdown.
        tokio::select! {
            () = stop.cancelled() => return,
            _ = beat_once(&store, &subscription, &in_flight, lease, grace) => {}
        }
    }
}
