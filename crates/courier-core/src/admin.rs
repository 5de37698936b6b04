//! Operators' view of the outbox: messages, their per-subscription state,
//! counts, and subscriptions (list, pause, resume).

use std::collections::BTreeMap;
use std::future::Future;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{DeliverySummary, StoreError, ValidationError};

/// A stored message, as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredMessage {
    /// The message id.
    pub id: Uuid,
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// The payload as JSON text.
    pub payload: String,
    /// The headers.
    pub headers: BTreeMap<String, String>,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// When the event happened (producer clock).
    pub occurred_at: DateTime<Utc>,
    /// When it first became deliverable.
    pub available_at: DateTime<Utc>,
    /// When it was enqueued (database clock).
    pub enqueued_at: DateTime<Utc>,
}

/// Which messages a listing returns. Every field narrows; `None` is any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Only these tenants (a token's scope); `None` is every tenant.
    pub tenants: Option<Vec<String>>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only messages with a delivery in this state: `available`, `running`,
    /// `dead`, or `completed` (a receipt exists).
    pub state: Option<String>,
    /// Only messages owed to (or applied by) this subscription; with `state`,
    /// the state of this subscription's delivery.
    pub subscription: Option<String>,
}

/// The most messages one page of [`AdminStore::list_messages`] holds.
pub const MAX_MESSAGE_PAGE: usize = 1000;

/// The states a message listing can filter on.
pub const MESSAGE_FILTER_STATES: [&str; 4] = ["available", "running", "dead", "completed"];

impl MessageFilter {
    /// Refuses a `state` other than the four a delivery can show, naming the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self.state.as_deref() {
            Some(state) if !MESSAGE_FILTER_STATES.contains(&state) => Err(ValidationError::new(
                "state",
                format!("{state:?} is not one of available, running, dead, completed"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_four_delivery_states_pass_the_state_filter() {
        let with = |state: Option<&str>| MessageFilter {
            state: state.map(str::to_owned),
            ..MessageFilter::default()
        };
        for state in MESSAGE_FILTER_STATES {
            assert!(with(Some(state)).validate().is_ok(), "{state}");
        }
        assert!(with(None).validate().is_ok());
        for bad in ["", "Dead", "completed ", "done"] {
            let error = with(Some(bad)).validate().err();
            assert_eq!(error.map(|e| e.field), Some("state"), "{bad:?}");
        }
    }
}

/// One page of messages, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessagePage {
    /// The messages, by id descending (UUIDv7 ids descend in time).
    pub items: Vec<StoredMessage>,
    /// Pass as `before` to get the next page; `None` on the last page.
    pub next_cursor: Option<Uuid>,
}

/// What [`AdminStore::cancel_message`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The message is gone, with its `deliveries` (none had started): no
    /// subscription will see it, and its idempotency key is free again.
    Cancelled {
        /// How many deliveries (one per subscription owed it) were removed.
        deliveries: u64,
    },
    /// There is no such message (never stored, pruned, or cancelled before).
    NotFound,
    /// A subscription has started on it, so nothing was changed.
    Started {
        /// The first such subscription, by name.
        subscription: String,
        /// Its delivery's state there: `running`, `retrying` (an attempt
        /// failed), `dead` or `completed`.
        state: String,
    },
}

/// Open deliveries of one (subscription, topic) by state, and the age of the oldest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryStats {
    /// The subscription.
    pub subscription: String,
    /// The topic.
    pub topic: String,
    /// Deliveries waiting (including those in backoff or delayed).
    pub available: i64,
    /// Deliveries under a lease.
    pub running: i64,
    /// Dead letters.
    pub dead: i64,
    /// Seconds since the oldest waiting or running delivery was enqueued
    /// (database clock); `None` when none is open.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// A subscription as registered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriptionInfo {
    /// The name.
    pub name: String,
    /// Its topic patterns.
    pub topics: Vec<String>,
    /// Whether claiming is paused (its messages wait, nothing is lost).
    pub paused: bool,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// A per-tenant rate limit: a token bucket of `burst` tokens refilled at
/// `per_second`; each claimed delivery takes one. Kept in the database, so it
/// holds across every worker and process of the subscription.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RateLimit {
    /// Deliveries per second, sustained.
    pub per_second: f64,
    /// Deliveries that may start at once after a quiet spell (≥ 1).
    pub burst: u32,
}

impl RateLimit {
    /// Checks the limit can be followed.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !self.per_second.is_finite() || self.per_second <= 0.0 || self.per_second > 1e9 {
            return Err(ValidationError::new(
                "rate_limit.per_second",
                format!("must be above 0 and at most 1e9, got {}", self.per_second),
            ));
        }
        if self.burst == 0 || self.burst > 1_000_000 {
            return Err(ValidationError::new(
                "rate_limit.burst",
                format!("must be between 1 and 1000000, got {}", self.burst),
            ));
        }
        Ok(())
    }
}

/// The operator's read and control operations.
pub trait AdminStore: Send + Sync {
    /// One message with the state of each subscription's delivery.
    fn get_message(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<(StoredMessage, Vec<DeliverySummary>)>, StoreError>> + Send;

    /// Cancels message `id` if no subscription has started on it: the message
    /// and its deliveries are removed together, atomically with respect to
    /// claims (a claim either finds the delivery first, and the cancel is
    /// refused, or never sees it). A delivery that is running, has spent an
    /// attempt, is dead, or has completed refuses the cancel and nothing
    /// changes. A later message of the same ordering key moves up.
    fn cancel_message(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<CancelOutcome, StoreError>> + Send;

    /// The messages stored under these (tenant, idempotency key) pairs, in no
    /// particular order; pairs with none are left out.
    fn messages_by_idempotency_keys<'c>(
        &'c self,
        keys: &'c [(String, String)],
    ) -> impl Future<Output = Result<Vec<StoredMessage>, StoreError>> + Send + 'c;

    /// Messages matching `filter` with id below `before`, newest first.
    fn list_messages<'c>(
        &'c self,
        filter: &'c MessageFilter,
        before: Option<Uuid>,
        limit: usize,
    ) -> impl Future<Output = Result<MessagePage, StoreError>> + Send + 'c;

    /// Open deliveries per (subscription, topic), for the given tenants (`None`: all).
    fn delivery_stats<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
    ) -> impl Future<Output = Result<Vec<DeliveryStats>, StoreError>> + Send + 'c;

    /// Every subscription, by name.
    fn list_subscriptions(
        &self,
    ) -> impl Future<Output = Result<Vec<SubscriptionInfo>, StoreError>> + Send;

    /// Pauses or resumes claiming for a subscription; returns whether it exists.
    /// A paused subscription's deliveries wait; running ones finish.
    fn set_subscription_paused<'c>(
        &'c self,
        name: &'c str,
        paused: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c;

    /// Removes topic patterns (exactly as registered) from a subscription;
    /// returns how many it had. Messages committed after the removal are no
    /// longer owed to it; deliveries it is already owed stay.
    fn remove_subscription_topics<'c>(
        &'c self,
        name: &'c str,
        patterns: &'c [String],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Limits how fast `subscription` starts `tenant`'s deliveries (`None`
    /// lifts the limit). Deliveries over the limit wait without spending
    /// attempts; a tenant's bucket starts full.
    fn set_tenant_rate_limit<'c>(
        &'c self,
        subscription: &'c str,
        tenant: &'c str,
        limit: Option<RateLimit>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'c;

    /// Whether the database answers and its schema is the one this build expects.
    fn ready(&self) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
