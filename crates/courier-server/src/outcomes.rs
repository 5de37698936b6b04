//! Recent delivery outcomes per subscription, kept in this process's memory:
//! when a delivery last succeeded, the last error, and how many of the
//! deliveries in the last five minutes failed. `GET /v1/subscriptions/{name}`
//! shows them.
//!
//! Only this daemon's own deliveries are counted — its webhook handlers and
//! relays record each attempt here — so with several daemons on one database
//! each shows what it delivered, a restart starts empty, and a subscription
//! served by a library worker elsewhere shows none. What the database knows
//! exactly (backlog, oldest pending age) is read from it instead.
//!
//! The last error is a fixed description of what happened ("the endpoint
//! answered 503 Service Unavailable", "the relay failed; it is retried"),
//! never the target's URL, its answer's body or a credential: every reader of
//! any tenant sees it. Memory is bounded: per subscription, one counter pair
//! per second of the window.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// The window the failure rate covers.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(300);

/// The outcomes of every subscription this process delivers.
#[derive(Debug, Default)]
pub struct DeliveryOutcomes {
    by_subscription: Mutex<HashMap<String, Recent>>,
}

/// What one subscription's recent deliveries came to.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentOutcomes {
    /// When a delivery last succeeded.
    pub last_success_at: Option<DateTime<Utc>>,
    /// When a delivery last failed, and a description without URL or secret.
    pub last_error: Option<(DateTime<Utc>, String)>,
    /// Deliveries attempted within [`FAILURE_WINDOW`].
    pub attempts: u64,
    /// Of those, how many failed.
    pub failures: u64,
}

#[derive(Debug, Default)]
struct Recent {
    last_success_at: Option<DateTime<Utc>>,
    last_error: Option<(DateTime<Utc>, String)>,
    /// (second since `epoch`, succeeded, failed), oldest first.
    seconds: VecDeque<(u64, u64, u64)>,
}

/// The process's outcomes, shared by every handler and the API.
pub fn global() -> &'static DeliveryOutcomes {
    static OUTCOMES: OnceLock<DeliveryOutcomes> = OnceLock::new();
    OUTCOMES.get_or_init(DeliveryOutcomes::default)
}

/// Seconds since the first call in this process (monotonic).
fn now_second() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs()
}

impl DeliveryOutcomes {
    /// Records a delivery of `subscription` that succeeded.
    pub fn succeeded(&self, subscription: &str) {
        self.record(subscription, None);
    }

    /// Records a delivery of `subscription` that failed; `description` must
    /// hold no URL, answer body or secret.
    pub fn failed(&self, subscription: &str, description: impl Into<String>) {
        self.record(subscription, Some(description.into()));
    }

    fn record(&self, subscription: &str, error: Option<String>) {
        let second = now_second();
        let mut all = self
            .by_subscription
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let recent = all.entry(subscription.to_owned()).or_default();
        let failed = error.is_some();
        match error {
            None => recent.last_success_at = Some(Utc::now()),
            Some(description) => recent.last_error = Some((Utc::now(), description)),
        }
        match recent.seconds.back_mut() {
            Some((at, ok, bad)) if *at == second => {
                if failed {
                    *bad += 1;
                } else {
                    *ok += 1;
                }
            }
            _ => recent
                .seconds
                .push_back((second, u64::from(!failed), u64::from(failed))),
        }
        prune(&mut recent.seconds, second);
    }

    /// What `subscription`'s deliveries in this process came to; `None` when
    /// this process has delivered none.
    pub fn recent(&self, subscription: &str) -> Option<RecentOutcomes> {
        let second = now_second();
        let mut all = self
            .by_subscription
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let recent = all.get_mut(subscription)?;
        prune(&mut recent.seconds, second);
        let (succeeded, failures) = recent
            .seconds
            .iter()
            .fold((0, 0), |(ok, bad), (_, o, b)| (ok + o, bad + b));
        Some(RecentOutcomes {
            last_success_at: recent.last_success_at,
            last_error: recent.last_error.clone(),
            attempts: succeeded + failures,
            failures,
        })
    }
}

/// Drops the seconds that have left the window ending at `second`.
fn prune(seconds: &mut VecDeque<(u64, u64, u64)>, second: u64) {
    let window = FAILURE_WINDOW.as_secs();
    while seconds
        .front()
        .is_some_and(|(at, _, _)| at + window <= second)
    {
        seconds.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_count_within_the_window_and_keep_the_last_error() {
        let outcomes = DeliveryOutcomes::default();
        assert_eq!(outcomes.recent("s"), None);
        outcomes.succeeded("s");
        outcomes.failed("s", "the endpoint answered 503 Service Unavailable");
        outcomes.failed("s", "the endpoint timed out or could not be reached");
        let recent = outcomes.recent("s").unwrap_or_else(|| panic!("recorded"));
        assert_eq!((recent.attempts, recent.failures), (3, 2));
        assert!(recent.last_success_at.is_some());
        assert_eq!(
            recent.last_error.map(|(_, text)| text).as_deref(),
            Some("the endpoint timed out or could not be reached")
        );
        let mut seconds = VecDeque::from([(0, 1, 0), (10, 0, 1), (400, 1, 1)]);
        prune(&mut seconds, 400);
        assert_eq!(seconds, VecDeque::from([(400, 1, 1)]));
    }
}
