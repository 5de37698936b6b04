//! The lease ledger: every delivery a worker has claimed and not yet settled.
//!
//! The fetcher adds a delivery when its claim returns, the executor asks how
//! long its lease is surely held, the heartbeat extends leases and reports
//! the ones it lost, the settler marks outcomes being written and forgets
//! them once written. The ledger is the only shared state between them.
//!
//! **Surely held.** The database sets a lease to expire `lease` after the
//! claim (or extension) statement ran, on its own clock. The ledger counts
//! from the moment the worker *sent* that statement, which is no later, so
//! its `held_until` is never after the real expiry (clock rates assumed
//! equal). A handler is stopped a margin before `held_until`: by the time the
//! lease expires in the database and another worker can claim the delivery
//! (or the next message of its ordering key), the handler was cancelled.
//!
//! **Handler timeouts.** A delivery past its handler's timeout is not
//! extended again (beyond the time to write its outcome), so a hung handler
//! cannot keep its slot and its ordering key forever, even one that ignores
//! cancellation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use courier_core::{ClaimedDelivery, LeaseRef};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One claimed delivery in the ledger.
#[derive(Debug, Clone)]
struct Held {
    lease: LeaseRef,
    /// Until when the lease is surely held (see the module docs).
    held_until: Instant,
    /// When the handler must stop (its start plus its timeout), once started.
    timeout_at: Option<Instant>,
    /// Cancelled when the heartbeat finds the lease lost.
    lost: CancellationToken,
    /// The settler has the outcome: the delivery may be gone from the
    /// database before it leaves the ledger, so a failed extension is no loss.
    settling: bool,
}

/// The deliveries a worker holds, by delivery id. Cheap to clone; clones
/// share the ledger.
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlight {
    held: Arc<Mutex<HashMap<i64, Held>>>,
}

/// A lease to extend and by how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extension {
    pub(crate) lease: LeaseRef,
    pub(crate) by: Duration,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<i64, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a delivery whose claim was sent at `claim_sent` with a lease of `lease`.
    pub(crate) fn track(&self, delivery: &ClaimedDelivery, claim_sent: Instant, lease: Duration) {
        self.lock().insert(
            delivery.delivery_id,
            Held {
                lease: delivery.lease(),
                held_until: claim_sent + lease,
                timeout_at: None,
                lost: CancellationToken::new(),
                settling: false,
            },
        );
    }

    /// Notes that a delivery's handler started and must stop by
    /// `timeout_at`; the heartbeat cancels `lost` if the lease is lost (one
    /// token may stand for several deliveries run together).
    pub(crate) fn started(
        &self,
        delivery_id: i64,
        timeout_at: Option<Instant>,
        lost: &CancellationToken,
    ) {
        match self.lock().get_mut(&delivery_id) {
            Some(entry) => {
                entry.timeout_at = timeout_at;
                entry.lost = lost.clone();
            }
            // Not tracked (cannot happen for a claimed delivery): treat as lost.
            None => lost.cancel(),
        }
    }

    /// Until when a delivery's lease is surely held; `None` if not tracked.
    pub(crate) fn held_until(&self, delivery_id: i64) -> Option<Instant> {
        self.lock().get(&delivery_id).map(|h| h.held_until)
    }

    /// Deliveries claimed and not yet settled.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The leases to extend at `now` by `lease`, by delivery id (every write
    /// that locks several deliveries lists them in that order, so two of them
    /// never deadlock). A delivery whose handler passed its timeout is left
    /// to lapse; one whose timeout comes within the lease is extended only
    /// to its timeout plus `grace`, the time to write its outcome.
    pub(crate) fn to_extend(
        &self,
        now: Instant,
        lease: Duration,
        grace: Duration,
    ) -> Vec<Extension> {
        let mut extensions: Vec<Extension> = self
            .lock()
            .values()
            .filter_map(|held| {
                let by = match held.timeout_at {
                    Some(at) if at <= now && !held.settling => return None,
                    Some(at) if !held.settling => lease.min(at - now + grace),
                    _ => lease,
                };
                Some(Extension {
                    lease: held.lease,
                    by,
                })
            })
            .collect();
        extensions.sort_unstable_by_key(|e| e.lease.delivery_id);
        extensions
    }

    /// Records that the extensions sent at `sent` and answered at `answered`
    /// were applied to `applied`, found the deliveries in `gone` no longer
    /// stored, and were lost for the rest of `asked`; returns how many lost
    /// ones still had a handler running (those handlers are told to stop).
    ///
    /// A delivery gone while its lease was surely held until after the
    /// answer is not lost: nobody else could have claimed it, so its row was
    /// deleted by this worker's own completion (a transactional group's
    /// commit, which the extension waited on, lands before the group is
    /// marked settling). It is left alone: stopping it could break off a
    /// group reading its own commit's reply. A delivery gone after its lease
    /// could have lapsed may have been run elsewhere: it counts as lost.
    pub(crate) fn extended(
        &self,
        sent: Instant,
        answered: Instant,
        asked: &[Extension],
        applied: &std::collections::HashSet<i64>,
        gone: &std::collections::HashSet<i64>,
    ) -> usize {
        let mut held = self.lock();
        let mut lost = 0;
        for extension in asked {
            let Some(entry) = held.get_mut(&extension.lease.delivery_id) else {
                continue;
            };
            if entry.lease != extension.lease {
                continue;
            }
            if applied.contains(&extension.lease.delivery_id) {
                entry.held_until = entry.held_until.max(sent + extension.by);
            } else if !entry.settling {
                if gone.contains(&extension.lease.delivery_id) && answered < entry.held_until {
                    continue;
                }
                entry.lost.cancel();
                lost += 1;
            }
        }
        lost
    }

    /// Notes that these claims' outcomes are being written (a delivery
    /// tracked under another lease since is left alone).
    pub(crate) fn mark_settling(&self, leases: &[LeaseRef]) {
        let mut held = self.lock();
        for lease in leases {
            if let Some(entry) = held.get_mut(&lease.delivery_id) {
                if entry.lease == *lease {
                    entry.settling = true;
                }
            }
        }
    }

    /// Forgets settled claims (a delivery claimed again since keeps its new entry).
    pub(crate) fn untrack(&self, leases: &[LeaseRef]) {
        let mut held = self.lock();
        for lease in leases {
            if held
                .get(&lease.delivery_id)
                .is_some_and(|entry| entry.lease == *lease)
            {
                held.remove(&lease.delivery_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(id: i64) -> ClaimedDelivery {
        ClaimedDelivery {
            delivery_id: id,
            message_id: uuid::Uuid::now_v7(),
            subscription: "sub".into(),
            tenant: "acme".into(),
            topic: "t".into(),
            schema_version: 1,
            ordering_key: None,
            priority: 0,
            payload: "{}".into(),
            headers: Default::default(),
            attempt: 1,
            max_attempts: 10,
            lease_token: uuid::Uuid::new_v4(),
            lease_expires_at: chrono::Utc::now(),
            occurred_at: chrono::Utc::now(),
            enqueued_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_lease_is_held_from_when_its_claim_was_sent() {
        let ledger = InFlight::default();
        let sent = Instant::now();
        ledger.track(&delivery(1), sent, Duration::from_secs(30));
        assert_eq!(ledger.held_until(1), Some(sent + Duration::from_secs(30)));
        let asked = ledger.to_extend(sent, Duration::from_secs(30), Duration::from_secs(1));
        let later = sent + Duration::from_secs(10);
        let applied = [1].into_iter().collect();
        assert_eq!(
            ledger.extended(later, later, &asked, &applied, &Default::default()),
            0
        );
        assert_eq!(ledger.held_until(1), Some(later + Duration::from_secs(30)));
    }

    #[test]
    fn a_lost_extension_tells_the_handler_to_stop() {
        let ledger = InFlight::default();
        let now = Instant::now();
        ledger.track(&delivery(1), now, Duration::from_secs(30));
        let lost = CancellationToken::new();
        ledger.started(1, None, &lost);
        let asked = ledger.to_extend(now, Duration::from_secs(30), Duration::from_secs(1));
        assert_eq!(
            ledger.extended(now, now, &asked, &Default::default(), &Default::default()),
            1
        );
        assert!(lost.is_cancelled());
    }

    /// A transactional group's rows are deleted by its commit, a moment
    /// before it is marked settling: a heartbeat answered while their leases
    /// were surely held finds them gone, and neither stops them nor counts a
    /// loss (nobody else could have claimed them). Gone after the lease
    /// could have lapsed, a delivery may have been run elsewhere: lost.
    #[test]
    fn a_delivery_gone_while_its_lease_was_held_is_not_lost() {
        let ledger = InFlight::default();
        let now = Instant::now();
        let lease = Duration::from_secs(30);
        ledger.track(&delivery(1), now, lease);
        ledger.track(&delivery(2), now, lease);
        ledger.track(&delivery(3), now, lease);
        let tokens: Vec<CancellationToken> = (1..=3)
            .map(|id| {
                let token = CancellationToken::new();
                ledger.started(id, None, &token);
                token
            })
            .collect();
        let asked = ledger.to_extend(now, lease, Duration::from_secs(1));
        let gone = [1, 2].into_iter().collect();
        let answered = now + Duration::from_secs(1);
        assert_eq!(
            ledger.extended(now, answered, &asked, &Default::default(), &gone),
            1,
            "only the delivery still stored under another lease is lost"
        );
        assert!(!tokens[0].is_cancelled() && !tokens[1].is_cancelled());
        assert!(tokens[2].is_cancelled());

        // Answered after the lease could have lapsed: gone may be someone
        // else's completion.
        let late = now + lease + Duration::from_secs(1);
        let first: Vec<Extension> = asked
            .into_iter()
            .filter(|e| e.lease.delivery_id == 1)
            .collect();
        assert_eq!(
            ledger.extended(now, late, &first, &Default::default(), &gone),
            1
        );
        assert!(tokens[0].is_cancelled());
    }

    #[test]
    fn settling_an_old_claim_leaves_the_delivery_s_new_claim_alone() {
        let ledger = InFlight::default();
        let now = Instant::now();
        let old = delivery(1);
        let mut new = delivery(1);
        new.lease_token = uuid::Uuid::new_v4();
        ledger.track(&old, now, Duration::from_secs(30));
        ledger.track(&new, now, Duration::from_secs(30));
        ledger.mark_settling(&[old.lease()]);
        ledger.untrack(&[old.lease()]);
        assert_eq!(ledger.len(), 1, "the new claim is still tracked");
        assert!(ledger.held_until(1).is_some());
        ledger.untrack(&[new.lease()]);
        assert_eq!(ledger.len(), 0);
    }

    #[test]
    fn leases_are_not_extended_past_the_handler_timeout() {
        let ledger = InFlight::default();
        let now = Instant::now();
        let lease = Duration::from_secs(30);
        let grace = Duration::from_secs(1);
        ledger.track(&delivery(1), now, lease);
        ledger.track(&delivery(2), now, lease);
        ledger.track(&delivery(3), now, lease);
        let lost = CancellationToken::new();
        ledger.started(1, Some(now + Duration::from_secs(120)), &lost);
        ledger.started(2, Some(now + Duration::from_secs(5)), &lost);
        ledger.started(3, Some(now), &lost);
        let asked = ledger.to_extend(now, lease, grace);
        let by: Vec<(i64, Duration)> = asked.iter().map(|e| (e.lease.delivery_id, e.by)).collect();
        assert_eq!(by, vec![(1, lease), (2, Duration::from_secs(6))]);
    }
}
