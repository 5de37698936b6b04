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
    /// The priority (0 to 9, higher first).
    pub priority: i16,
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
    /// `dead`, or `completed` (for some subscription, or for `subscription`,
    /// exactly when [`AdminStore::get_message`] reports `completed`).
    pub state: Option<String>,
    /// Only messages owed to (or applied by) this subscription; with `state`,
    /// the state of this subscription's delivery.
    pub subscription: Option<String>,
    /// Only the message with this id.
    pub message_id: Option<Uuid>,
    /// Only messages enqueued at or after this instant (`enqueued_at`, the
    /// database clock).
    pub enqueued_after: Option<DateTime<Utc>>,
    /// Only messages enqueued before this instant: with `enqueued_after`, the
    /// half-open range `[enqueued_after, enqueued_before)`.
    pub enqueued_before: Option<DateTime<Utc>>,
}

/// The most messages one page of [`AdminStore::list_messages`] holds.
pub const MAX_MESSAGE_PAGE: usize = 1000;

/// The states a message listing can filter on.
pub const MESSAGE_FILTER_STATES: [&str; 4] = ["available", "running", "dead", "completed"];

impl MessageFilter {
    /// Refuses a `state` other than the four a delivery can show, and a time
    /// range whose `enqueued_after` is not before its `enqueued_before`,
    /// naming the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self.state.as_deref() {
            Some(state) if !MESSAGE_FILTER_STATES.contains(&state) => {
                return Err(ValidationError::new(
                    "state",
                    format!("{state:?} is not one of available, running, dead, completed"),
                ))
            }
            _ => {}
        }
        validate_time_range(
            ("enqueued_after", self.enqueued_after),
            ("enqueued_before", self.enqueued_before),
        )
    }
}

impl MessageFilter {
    /// The bounds a store scans its (enqueued_at, id) index between for this
    /// filter: the lowest `enqueued_at` (inclusive) and the key the scan
    /// starts below (exclusive; `None`: from the newest). The start is the
    /// cursor `before` or the end of the `enqueued_before` range, whichever
    /// is lower, so the scan starts where the page does instead of walking
    /// down to it. With a `message_id`, the store passes that message's
    /// `enqueued_at` (looked up by id) as `message_enqueued_at`, and the scan
    /// covers only its key: an index seek, whatever else the filter says.
    pub fn scan_bounds(
        &self,
        before: Option<MessageKey>,
        message_enqueued_at: Option<DateTime<Utc>>,
    ) -> (Option<DateTime<Utc>>, Option<MessageKey>) {
        let order = |k: &MessageKey| (k.enqueued_at, k.id);
        // (enqueued_before, nil) is below every key at enqueued_before.
        let range_end = self.enqueued_before.map(|enqueued_at| MessageKey {
            enqueued_at,
            id: Uuid::nil(),
        });
        let just_above_message = self
            .message_id
            .zip(message_enqueued_at)
            .map(|(id, at)| match id.as_u128().checked_add(1) {
                Some(next) => MessageKey {
                    enqueued_at: at,
                    id: Uuid::from_u128(next),
                },
                None => MessageKey {
                    enqueued_at: at + chrono::TimeDelta::microseconds(1),
                    id: Uuid::nil(),
                },
            });
        let start = [before, range_end, just_above_message]
            .into_iter()
            .flatten()
            .min_by_key(order);
        let lowest = [self.enqueued_after, message_enqueued_at]
            .into_iter()
            .flatten()
            .max();
        (lowest, start)
    }
}

/// Refuses a half-open range `[after, before)` that holds no instant: both
/// bounds given and `after` not before `before`. Names the `before` field.
pub(crate) fn validate_time_range(
    (after_field, after): (&'static str, Option<DateTime<Utc>>),
    (before_field, before): (&'static str, Option<DateTime<Utc>>),
) -> Result<(), ValidationError> {
    match (after, before) {
        (Some(after), Some(before)) if after >= before => Err(ValidationError::new(
            before_field,
            format!(
                "must be after {after_field} ({}), got {}",
                after.to_rfc3339(),
                before.to_rfc3339()
            ),
        )),
        _ => Ok(()),
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

    #[test]
    fn the_scan_starts_at_the_lowest_of_cursor_range_end_and_message() {
        let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap_or_default();
        let id = Uuid::from_u128(7);
        let key = |ms: i64, id: Uuid| MessageKey {
            enqueued_at: at(ms),
            id,
        };
        let filter = MessageFilter {
            enqueued_after: Some(at(10)),
            enqueued_before: Some(at(50)),
            ..MessageFilter::default()
        };
        assert_eq!(
            filter.scan_bounds(None, None),
            (Some(at(10)), Some(key(50, Uuid::nil())))
        );
        assert_eq!(
            filter.scan_bounds(Some(key(40, id)), None),
            (Some(at(10)), Some(key(40, id)))
        );
        assert_eq!(
            filter.scan_bounds(Some(key(60, id)), None).1,
            Some(key(50, Uuid::nil()))
        );
        let one = MessageFilter {
            message_id: Some(id),
            ..MessageFilter::default()
        };
        assert_eq!(
            one.scan_bounds(None, Some(at(20))),
            (Some(at(20)), Some(key(20, Uuid::from_u128(8))))
        );
        assert_eq!(
            MessageFilter::default().scan_bounds(None, None),
            (None, None)
        );
    }

    #[test]
    fn an_empty_enqueued_range_is_refused_naming_enqueued_before() {
        let at = |seconds: i64| DateTime::from_timestamp(seconds, 0);
        let range = |after: Option<DateTime<Utc>>, before: Option<DateTime<Utc>>| MessageFilter {
            enqueued_after: after,
            enqueued_before: before,
            ..MessageFilter::default()
        };
        assert!(range(at(10), at(11)).validate().is_ok());
        assert!(range(at(10), None).validate().is_ok());
        assert!(range(None, at(10)).validate().is_ok());
        for (after, before) in [(10, 10), (11, 10)] {
            let error = range(at(after), at(before)).validate().err();
            assert_eq!(error.map(|e| e.field), Some("enqueued_before"));
        }
    }
}

/// Where a message listing stands: a message's place in the listing order,
/// `enqueued_at` then `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageKey {
    /// When the message was enqueued (database clock).
    pub enqueued_at: DateTime<Utc>,
    /// The message id, breaking ties between messages of one transaction.
    pub id: Uuid,
}

impl MessageKey {
    /// The key of `message`.
    pub fn of(message: &StoredMessage) -> Self {
        Self {
            enqueued_at: message.enqueued_at,
            id: message.id,
        }
    }
}

/// One page of messages, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessagePage {
    /// The messages, by (`enqueued_at`, `id`) descending: the order an index
    /// serves for every filter, time ranges included. (Ids alone would not
    /// do: producers may supply their own, so an id's time need not be its
    /// enqueue time.)
    pub items: Vec<StoredMessage>,
    /// Pass as `before` to get the next page; `None` on the last page.
    pub next_cursor: Option<MessageKey>,
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
        /// failed), `snoozed` (a handler ran and deferred it), `dead`,
        /// `discarded` or `completed`.
        state: String,
    },
}

/// Where a page of [`AdminStore::delivery_stats`] continues: after this
/// (subscription, topic), in byte order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatsKey {
    /// The subscription of the last row shown.
    pub subscription: String,
    /// The topic of the last row shown.
    pub topic: String,
}

/// One page of delivery stats, by (subscription, topic) in byte order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryStatsPage {
    /// The rows.
    pub items: Vec<DeliveryStats>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next_cursor: Option<StatsKey>,
}

/// Open deliveries by state over every (subscription, topic) a query covers,
/// and the age of the oldest.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeliveryTotals {
    /// Deliveries waiting (including those in backoff or delayed).
    pub available: i64,
    /// Of the waiting ones, those that already failed at least once and
    /// wait for their next attempt.
    pub retrying: i64,
    /// Deliveries under a lease.
    pub running: i64,
    /// Dead letters.
    pub dead: i64,
    /// Seconds since the oldest waiting or running delivery was enqueued
    /// (database clock); `None` when none is open.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// The most rows one page of [`AdminStore::delivery_stats`] or
/// [`AdminStore::list_subscriptions`] holds.
pub const MAX_LIST_PAGE: usize = 1000;

/// Open deliveries of one (subscription, topic) by state, and the age of the oldest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryStats {
    /// The subscription.
    pub subscription: String,
    /// The topic.
    pub topic: String,
    /// Deliveries waiting (including those in backoff or delayed).
    pub available: i64,
    /// Of the waiting ones, those that already failed at least once and
    /// wait for their next attempt.
    pub retrying: i64,
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

/// One page of subscriptions, by name in byte order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionPage {
    /// The subscriptions.
    pub items: Vec<SubscriptionInfo>,
    /// Pass as `after` to get the next page (the last name shown); `None` on
    /// the last page.
    pub next_cursor: Option<String>,
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
    /// attempt, was snoozed by its handler, is dead, was discarded or has
    /// completed (as [`AdminStore::get_message`] reports it) refuses the
    /// cancel and nothing changes. A later message of the same ordering key moves up.
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

    /// Messages matching `filter` that come after `before` in the listing
    /// order (newest first, see [`MessagePage`]), at most `limit` (clamped to
    /// 1..=[`MAX_MESSAGE_PAGE`]). A filter [`MessageFilter::validate`]
    /// refuses is an [`StoreError::Invalid`].
    fn list_messages<'c>(
        &'c self,
        filter: &'c MessageFilter,
        before: Option<MessageKey>,
        limit: usize,
    ) -> impl Future<Output = Result<MessagePage, StoreError>> + Send + 'c;

    /// Open deliveries per (subscription, topic) of the given tenants
    /// (`None`: all), after the key `after`, in byte order of (subscription,
    /// topic), at most `limit` (clamped to 1..=[`MAX_LIST_PAGE`]). Pairs with
    /// nothing open or dead have no row.
    fn delivery_stats<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StatsKey>,
        limit: usize,
    ) -> impl Future<Output = Result<DeliveryStatsPage, StoreError>> + Send + 'c;

    /// Open deliveries by state summed over every row
    /// [`AdminStore::delivery_stats`] shows for these tenants (`None`: all),
    /// or only `subscription`'s rows; the oldest age is the oldest of them.
    fn delivery_totals<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        subscription: Option<&'c str>,
    ) -> impl Future<Output = Result<DeliveryTotals, StoreError>> + Send + 'c;

    /// Subscriptions with a name after `after`, by name in byte order, at
    /// most `limit` (clamped to 1..=[`MAX_LIST_PAGE`]).
    fn list_subscriptions<'c>(
        &'c self,
        after: Option<&'c str>,
        limit: usize,
    ) -> impl Future<Output = Result<SubscriptionPage, StoreError>> + Send + 'c;

    /// One subscription, if it exists.
    fn get_subscription<'c>(
        &'c self,
        name: &'c str,
    ) -> impl Future<Output = Result<Option<SubscriptionInfo>, StoreError>> + Send + 'c;

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

    /// What operators watch in the database itself: the oldest open
    /// transaction and the dead row versions of the store's tables, where
    /// the backend has them.
    fn database_health(&self) -> impl Future<Output = Result<DatabaseHealth, StoreError>> + Send;
}

/// How the database behind a store is doing ([`AdminStore::database_health`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DatabaseHealth {
    /// How long, in seconds, the oldest transaction open in the database
    /// (other than the one asking) has run: on PostgreSQL it holds back
    /// the vacuum of every table, so dead rows pile up while it lasts.
    /// `None` when none is open, on SQLite, or when the database's role may
    /// not see other sessions' transactions (PostgreSQL shows them to
    /// superusers and members of `pg_read_all_stats`).
    pub oldest_transaction_seconds: Option<f64>,
    /// Dead row versions per table of the store's schema, by the database's
    /// statistics (PostgreSQL; empty on SQLite, which has no such count).
    pub dead_tuples: BTreeMap<String, i64>,
}
