//! The storage seam: what a backend must do for producers, workers and operators.
//!
//! Every state change is fenced in the backend's SQL by the state it expects
//! and, for claimed deliveries, by the lease token and the lease's expiry on the
//! database clock. Batch operations report which items they applied; an item
//! missing from the answer was not applied (its lease was lost).

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::{
    ClaimedDelivery, EnqueueOutcome, ErrorEntry, HandlerError, NewMessage, StoreError,
    ValidationError,
};

/// A (topic, schema version) a worker can handle, with its attempt budget.
/// Topic `*` with version 0 handles every delivery the subscription is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The topic (`*`: any).
    pub topic: String,
    /// The schema version (0: any).
    pub schema_version: i32,
    /// Attempts before a delivery of this route is dead-lettered.
    pub max_attempts: i32,
}

/// A subscription as registered in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionSpec {
    /// The subscription's name.
    pub name: String,
    /// The topics it receives: exact names, `prefix.*` patterns, or `*` for all.
    pub topics: Vec<String>,
    /// Retained messages the subscription receives beside those committed
    /// after its registration. Applies only when the registration creates
    /// the subscription (like a consumer's first offset); `None`: none.
    pub replay: Option<Replay>,
}

impl SubscriptionSpec {
    /// A subscription receiving `topics`, without replay.
    pub fn new(
        name: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            replay: None,
        }
    }

    /// The same subscription, created with the retained messages `replay` names.
    #[must_use]
    pub fn with_replay(mut self, replay: Replay) -> Self {
        self.replay = Some(replay);
        self
    }
}

/// Which retained messages a new subscription receives besides those
/// committed after it was registered. Messages are taken in enqueue order
/// (`created_at`, then id), only those of the subscription's topics, and
/// only those not yet pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Every retained message.
    All,
    /// Messages enqueued at or after this instant (database clock).
    Since(DateTime<Utc>),
    /// This message and every message enqueued after it. It must still be
    /// retained, or registration fails with a validation error.
    FromMessage(Uuid),
}

impl std::str::FromStr for Replay {
    type Err = ValidationError;

    /// `all`, a message id (`FromMessage`), or an RFC 3339 instant (`Since`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "all" {
            return Ok(Replay::All);
        }
        if let Ok(id) = Uuid::parse_str(text) {
            return Ok(Replay::FromMessage(id));
        }
        DateTime::parse_from_rfc3339(text)
            .map(|at| Replay::Since(at.with_timezone(&Utc)))
            .map_err(|_| {
                ValidationError::new(
                    "replay",
                    format!(
                        "{text:?} is neither `all`, an RFC 3339 time (2026-12-01T10:00:00Z) nor a message id"
                    ),
                )
            })
    }
}

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registration {
    /// Whether the subscription was created by this registration.
    pub created: bool,
    /// Topic patterns added (already present ones are not counted).
    pub topics_added: u64,
    /// Retained messages delivered by the replay.
    pub replayed: u64,
}

/// What a worker asks for when it claims.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// The subscription to claim for.
    pub subscription: String,
    /// The (topic, version) pairs this worker handles; nothing else is claimed.
    pub routes: Vec<Route>,
    /// The most deliveries to claim.
    pub limit: usize,
    /// How long the lease lasts (database clock).
    pub lease: Duration,
    /// Who claims, for operators.
    pub worker_id: String,
    /// Tenants after this one (in the database's text order) are served first; the rest wait
    /// for the next turn. Pass the previous batch's `next_tenant_cursor`.
    pub tenant_cursor: String,
    /// The most deliveries one tenant may have running in this subscription at once.
    pub tenant_in_flight_limit: Option<u32>,
}

/// The deliveries a claim took and where the next claim's tenant turn starts.
#[derive(Debug, Clone, Default)]
pub struct ClaimBatch {
    /// The claimed deliveries, each under its own lease.
    pub deliveries: Vec<ClaimedDelivery>,
    /// The cursor to pass as the next claim's `tenant_cursor`.
    pub next_tenant_cursor: String,
}

/// Identifies one claim: the delivery and the token of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    /// The delivery.
    pub delivery_id: i64,
    /// The lease token the claim returned.
    pub lease_token: Uuid,
}

/// A successful delivery to record.
pub type Completion = LeaseRef;

/// A failed attempt to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The claim that failed.
    pub lease: LeaseRef,
    /// What went wrong (cut to 2,000 characters by the store).
    pub error: String,
    /// What kind of failure it is: with `error`, it makes the fingerprint
    /// the store keeps with the delivery's last error (see
    /// [`error_fingerprint`](crate::error_fingerprint)).
    pub kind: crate::ErrorKind,
    /// When to try again; `None` dead-letters now. A retry on a delivery that
    /// has used its last attempt dead-letters too.
    pub retry_in: Option<Duration>,
}

/// A snoozed delivery to put back: it comes back after `delay` without
/// spending an attempt (a tenant over its quota, a dependency not ready).
/// Snoozes are counted apart from attempts; past [`MAX_SNOOZES`] of them a
/// snooze spends its attempt like a failure, so a delivery cannot snooze
/// forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snooze {
    /// The claim that snoozed.
    pub lease: LeaseRef,
    /// When to offer the delivery again.
    pub delay: Duration,
    /// Why, kept in the error history only once a snooze spends an attempt.
    pub reason: String,
}

/// Snoozes a delivery may take before each further one spends an attempt.
pub const MAX_SNOOZES: i32 = 1000;

/// What a rescue pass returns and how it spaces out the deliveries' next attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RescueParams {
    /// The most deliveries to move in one statement.
    pub limit: usize,
    /// The delay after a first expired attempt; doubled per attempt spent,
    /// jittered to between half and all of it.
    pub backoff_base: Duration,
    /// The longest delay.
    pub backoff_cap: Duration,
}

impl RescueParams {
    /// A rescue of up to `limit` deliveries that makes them available again
    /// at once, with no backoff (for tools and tests).
    pub const fn at_once(limit: usize) -> Self {
        Self {
            limit,
            backoff_base: Duration::ZERO,
            backoff_cap: Duration::ZERO,
        }
    }
}

/// The result of one failure write that was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureApplied {
    /// The delivery.
    pub delivery_id: i64,
    /// Whether the delivery is now dead-lettered.
    pub dead: bool,
}

/// What running a transactional handler came to.
#[derive(Debug)]
pub enum TransactionalOutcome {
    /// The effect, the receipt and the completion committed together.
    Applied,
    /// A receipt already existed: the effect was skipped and the delivery completed.
    AlreadyApplied,
    /// The lease was lost: the handler's writes were rolled back.
    LeaseLost,
    /// The handler failed: its writes were rolled back; the failure is not yet recorded.
    HandlerFailed(HandlerError),
}

/// What became of one delivery of a committed transactional batch.
#[derive(Debug)]
pub enum BatchItem {
    /// Its effect, receipt and completion committed.
    Applied,
    /// A receipt already existed: the effect was skipped and the delivery completed.
    AlreadyApplied,
    /// Its handler failed (batches that isolate failures only): its writes
    /// were rolled back to its savepoint, nothing of it committed, and its
    /// lease is still held for the caller to record the failure.
    Failed(HandlerError),
}

/// What running several transactional handlers in one transaction came to.
#[derive(Debug)]
pub enum TransactionalBatchOutcome {
    /// The transaction committed. Per delivery, in input order, what became of it.
    Committed(Vec<BatchItem>),
    /// Nothing was committed; every delivery is as it was before. The caller
    /// runs each one again on its own to learn its outcome.
    RolledBack(BatchRollback),
}

/// Why a transactional batch was rolled back.
#[derive(Debug)]
pub enum BatchRollback {
    /// The work at this position (input order) failed.
    HandlerFailed {
        /// The position of the failed work in the batch.
        index: usize,
        /// What it failed with.
        error: HandlerError,
    },
    /// At least one delivery's lease was no longer held.
    LeaseLost,
}

/// What a transactional batch of one delivery, run without isolating
/// failures, came to as that delivery's [`TransactionalOutcome`]: for a
/// backend whose [`OutboxStore::run_transactional`] is
/// [`OutboxStore::run_transactional_batch`] of one.
///
/// A committed batch is `Applied` or `AlreadyApplied` by its item (a failed
/// item, which only an isolating batch reports, is `HandlerFailed`); a rolled
/// back one is `HandlerFailed` with the handler's error or `LeaseLost`.
pub fn single_transactional_outcome(outcome: TransactionalBatchOutcome) -> TransactionalOutcome {
    match outcome {
        TransactionalBatchOutcome::Committed(mut items) => match items.pop() {
            Some(BatchItem::Failed(error)) => TransactionalOutcome::HandlerFailed(error),
            Some(BatchItem::AlreadyApplied) => TransactionalOutcome::AlreadyApplied,
            Some(BatchItem::Applied) | None => TransactionalOutcome::Applied,
        },
        TransactionalBatchOutcome::RolledBack(BatchRollback::HandlerFailed { error, .. }) => {
            TransactionalOutcome::HandlerFailed(error)
        }
        TransactionalBatchOutcome::RolledBack(BatchRollback::LeaseLost) => {
            TransactionalOutcome::LeaseLost
        }
    }
}

/// A transactional handler's work, run inside the delivery's transaction.
pub type TxWork<C> =
    Box<dyn for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<(), HandlerError>> + Send + 'static>;

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Messages removed (every delivery done, older than the retention).
    pub messages: u64,
    /// Receipts removed (older than the retention): the outbox's and the
    /// stream subscriptions'.
    pub receipts: u64,
}

/// The outbox: enqueue, claim and settle deliveries.
pub trait OutboxStore: Clone + Send + Sync + 'static {
    /// The backend's connection type: what producers enqueue on and
    /// transactional handlers write through.
    type Connection: Send;

    /// Whether a transactional run, once its transaction is open, excludes
    /// every other writer until it ends (SQLite's single writer): then no
    /// lease it holds can be taken over meanwhile, and the engine does not
    /// stop such a run for a lease its heartbeat could not extend.
    const EXCLUSIVE_TRANSACTIONS: bool;

    /// Creates or upgrades Courier's tables.
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Enqueues `messages` on the caller's connection (inside their transaction,
    /// if one is open) in one round trip, all or nothing. Outcomes are in input order.
    fn enqueue_batch<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        messages: &'c [NewMessage],
    ) -> impl Future<Output = Result<Vec<EnqueueOutcome>, StoreError>> + Send + 'c;

    /// Enqueues `messages` in a transaction of the store's own.
    fn publish_batch<'c>(
        &'c self,
        messages: &'c [NewMessage],
    ) -> impl Future<Output = Result<Vec<EnqueueOutcome>, StoreError>> + Send + 'c;

    /// Creates the subscription or adds topics to it; never removes topics
    /// (see [`AdminStore::remove_subscription_topics`](crate::AdminStore::remove_subscription_topics)).
    ///
    /// Takes effect in commit order: every message whose transaction commits
    /// after the registration is owed to the subscription, every message
    /// committed before it is not (unless replayed). A producer in a
    /// REPEATABLE READ or SERIALIZABLE transaction whose snapshot predates a
    /// registration that committed before its insert gets a serialization
    /// failure (SQLSTATE 40001) and retries, rather than a message silently
    /// missing its new subscription.
    fn register_subscription<'c>(
        &'c self,
        spec: &'c SubscriptionSpec,
    ) -> impl Future<Output = Result<Registration, StoreError>> + Send + 'c;

    /// Claims up to `params.limit` ready deliveries, taking tenants in turn.
    fn claim<'c>(
        &'c self,
        params: &'c ClaimParams,
    ) -> impl Future<Output = Result<ClaimBatch, StoreError>> + Send + 'c;

    /// Completes deliveries whose leases are still held; returns the ids
    /// applied. Writes no receipt (a plain handler's completion is not a
    /// proof of effect; transactional work writes its receipt itself, see
    /// [`Self::run_transactional_batch`]): the admin views show such a
    /// delivery as `completed` while its message is retained.
    fn complete_many<'c>(
        &'c self,
        completions: &'c [Completion],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send + 'c;

    /// Records failed attempts whose leases are still held.
    fn fail_many<'c>(
        &'c self,
        failures: &'c [Failure],
    ) -> impl Future<Output = Result<Vec<FailureApplied>, StoreError>> + Send + 'c;

    /// Puts snoozed deliveries whose leases are still held back after their
    /// delay, refunding the attempt their claim spent (see [`Snooze`]).
    /// `dead` in the answer is true when a snooze past [`MAX_SNOOZES`] spent
    /// the last attempt.
    fn snooze_many<'c>(
        &'c self,
        snoozes: &'c [Snooze],
    ) -> impl Future<Output = Result<Vec<FailureApplied>, StoreError>> + Send + 'c;

    /// Extends leases still held by `lease`. A lease that was not extended
    /// is either [`Extended::gone`] (its delivery no longer exists: completed
    /// or cancelled, by this lease's holder or, once the lease had lapsed,
    /// by another's) or not (the delivery is there, dead-lettered or under
    /// an expired lease or another claim's). A delivery whose completion was
    /// committing while the extension waited for it reads as gone.
    fn extend_many<'c>(
        &'c self,
        leases: &'c [LeaseRef],
        lease: Duration,
    ) -> impl Future<Output = Result<Extended, StoreError>> + Send + 'c;

    /// Hands claimed-but-unstarted deliveries whose leases are still held
    /// back without spending an attempt.
    fn release_many<'c>(
        &'c self,
        leases: &'c [LeaseRef],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send + 'c;

    /// Returns deliveries whose leases expired (database clock) to the queue
    /// after a backoff, or dead-letters them when that was their last
    /// attempt; returns how many.
    fn rescue_expired<'c>(
        &'c self,
        params: &'c RescueParams,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Runs `work` in a transaction with the delivery's receipt and completion:
    /// all three commit together or none does. (A transactional batch of one.)
    fn run_transactional<'c>(
        &'c self,
        delivery: &'c ClaimedDelivery,
        work: TxWork<Self::Connection>,
    ) -> impl Future<Output = Result<TransactionalOutcome, StoreError>> + Send + 'c;

    /// Runs several deliveries' `work` in one transaction, each after its
    /// receipt is written (work whose receipt already exists is skipped), and
    /// completes them. The deliveries must be distinct and of this store's
    /// subscriptions. The work runs in input order on one connection.
    ///
    /// With `isolate_failures`, each work runs in a savepoint: a failing one
    /// is rolled back alone (its receipt too, and it is not completed) and
    /// the others commit. Without, the first failure rolls back everything
    /// (cheaper: a savepoint costs a round trip on PostgreSQL and a hand-off
    /// to SQLite's thread).
    fn run_transactional_batch<'c>(
        &'c self,
        batch: Vec<(&'c ClaimedDelivery, TxWork<Self::Connection>)>,
        isolate_failures: bool,
    ) -> impl Future<Output = Result<TransactionalBatchOutcome, StoreError>> + Send + 'c;

    /// Tells producers whether a worker of `subscription` is idle, so that
    /// they wake it when they enqueue (`idle`) or need not (`!idle`). When an
    /// announcement of idleness returns, every message committed by a producer
    /// that did not see it is visible to the next claim. Returns `false` if
    /// this store wakes workers without announcements (then it need not be
    /// called again).
    fn announce_idle<'c>(
        &'c self,
        subscription: &'c str,
        worker_id: &'c str,
        idle: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c;

    /// Removes up to `batch` finished messages and up to `batch` receipt rows
    /// older than `older_than` of each kind (on PostgreSQL a row of a plain
    /// stream subscription's receipts holds a batch of up to 1,000; the
    /// report counts receipts). Dead letters and their messages are kept.
    fn prune(
        &self,
        older_than: Duration,
        batch: usize,
    ) -> impl Future<Output = Result<PruneReport, StoreError>> + Send;

    /// Takes or renews the database's maintenance lease for `holder` until
    /// `lease` from now (database clock); returns whether `holder` leads.
    /// Another holder's lease is taken over only after it expired, so one
    /// worker per database runs the rescuer and the pruner.
    fn lead_maintenance<'c>(
        &'c self,
        holder: &'c str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c;

    /// Gives up `holder`'s maintenance lease (nothing if it does not lead),
    /// so another worker takes over at its next try.
    fn resign_maintenance<'c>(
        &'c self,
        holder: &'c str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'c;
}

/// What [`OutboxStore::extend_many`] did with the leases it was given; a
/// delivery id in neither list was lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extended {
    /// The deliveries whose leases were extended.
    pub extended: Vec<i64>,
    /// The deliveries that no longer exist (completed or cancelled).
    pub gone: Vec<i64>,
}

/// Which dead letters an operation concerns. Every field narrows; `None` is any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only this subscription's.
    pub subscription: Option<String>,
    /// Only this message's.
    pub message_id: Option<Uuid>,
    /// Only those dead-lettered at or after this instant (`dead_at`, the
    /// database clock).
    pub dead_after: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant: with `dead_after`, the
    /// half-open range `[dead_after, dead_before)`.
    pub dead_before: Option<DateTime<Utc>>,
    /// Only those whose last failure has this fingerprint (see
    /// [`error_fingerprint`](crate::error_fingerprint);
    /// [`UNKNOWN_FINGERPRINT`](crate::UNKNOWN_FINGERPRINT): those recorded
    /// before fingerprints were stored).
    pub fingerprint: Option<String>,
}

impl DeadLetterFilter {
    /// Whether the filter names nothing, so it matches every dead letter.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The bounds a store scans its (dead_at, id) index between for this
    /// filter: the key the scan starts above (exclusive; `None`: from the
    /// oldest) and the `dead_at` it stops before (`None`: the newest). The
    /// start is the cursor `after` or the start of the `dead_after` range,
    /// whichever is higher, so the scan starts where the page does. With a
    /// `message_id`, the store passes the oldest and newest `dead_at` of that
    /// message's dead letters (looked up by id) as `message_dead_at`, and the
    /// scan covers only them.
    pub fn scan_bounds(
        &self,
        after: Option<DeadLetterKey>,
        message_dead_at: Option<(DateTime<Utc>, DateTime<Utc>)>,
    ) -> (Option<DeadLetterKey>, Option<DateTime<Utc>>) {
        let from = |dead_at: DateTime<Utc>| DeadLetterKey {
            // Delivery ids start at 1: (t, 0) is below every key at t.
            dead_at,
            delivery_id: 0,
        };
        let message = message_dead_at.filter(|_| self.message_id.is_some());
        let start = [
            after,
            self.dead_after.map(from),
            message.map(|(oldest, _)| from(oldest)),
        ]
        .into_iter()
        .flatten()
        .max_by_key(|k| (k.dead_at, k.delivery_id));
        let end = [
            self.dead_before,
            message.map(|(_, newest)| newest + chrono::TimeDelta::microseconds(1)),
        ]
        .into_iter()
        .flatten()
        .min();
        (start, end)
    }

    /// Refuses a time range whose `dead_after` is not before its
    /// `dead_before`, naming `dead_before`, and a `fingerprint` that is not
    /// one, naming `fingerprint`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(fingerprint) = &self.fingerprint {
            crate::validate_fingerprint("fingerprint", fingerprint)?;
        }
        crate::admin::validate_time_range(
            ("dead_after", self.dead_after),
            ("dead_before", self.dead_before),
        )
    }
}

/// A dead-lettered delivery with what an operator needs to decide on it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The delivery id (what retry and discard take).
    pub delivery_id: i64,
    /// The message id.
    pub message_id: Uuid,
    /// The subscription that gave up.
    pub subscription: String,
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The schema version.
    pub schema_version: i32,
    /// The payload as JSON text.
    pub payload: String,
    /// Attempts spent.
    pub attempts: i32,
    /// The bounded error history, oldest first.
    pub errors: Vec<ErrorEntry>,
    /// When it was dead-lettered.
    pub dead_at: Option<DateTime<Utc>>,
    /// When the message was enqueued.
    pub enqueued_at: DateTime<Utc>,
}

/// Where a dead-letter listing stands: a dead letter's place in the listing
/// order, `dead_at` then delivery id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeadLetterKey {
    /// When the delivery was dead-lettered (database clock).
    pub dead_at: DateTime<Utc>,
    /// The delivery id, breaking ties between deliveries that died together.
    pub delivery_id: i64,
}

/// One page of dead letters, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterPage {
    /// The dead letters, by (`dead_at`, delivery id) ascending: the order an
    /// index serves with or without a `dead_at` range.
    pub items: Vec<DeadLetter>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next_cursor: Option<DeadLetterKey>,
}

/// Dead letters that failed the same way: one fingerprint's count, when it
/// started and last happened, and what it touched.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterGroup {
    /// The fingerprint of the dead letters' last failure (what
    /// [`DeadLetterFilter::fingerprint`] takes); [`UNKNOWN_FINGERPRINT`](crate::UNKNOWN_FINGERPRINT)
    /// for dead letters recorded before fingerprints were stored.
    pub fingerprint: String,
    /// The last error of the group's most recent dead letter, as stored.
    pub sample_error: String,
    /// How many dead letters the group holds (within the filter).
    pub count: u64,
    /// The oldest `dead_at` in the group (`None` only if none has one).
    pub first_seen: Option<DateTime<Utc>>,
    /// The newest `dead_at` in the group.
    pub last_seen: Option<DateTime<Utc>>,
    /// The subscriptions the group's dead letters belong to, sorted.
    pub subscriptions: Vec<String>,
    /// The topics of the group's dead letters, sorted.
    pub topics: Vec<String>,
}

/// The most groups [`DeadLetterStore::dead_letter_groups`] returns.
pub const MAX_DEAD_LETTER_GROUPS: usize = 1000;

/// The state of one (message, subscription) pair, for inspection.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeliverySummary {
    /// The subscription.
    pub subscription: String,
    /// The open delivery's id (what dead-letter retry and discard take);
    /// `None` once completed or discarded, when the delivery is gone.
    pub delivery_id: Option<i64>,
    /// `available`, `running`, `dead`, `discarded` (a dead letter an
    /// operator discarded: never applied) or `completed`: a transactional
    /// handler's receipt, or, for a plain handler (which leaves no record),
    /// a subscription that receives the message's topic since before it was
    /// enqueued and has no open delivery of it.
    pub state: String,
    /// Attempts spent.
    pub attempts: i32,
    /// The bounded error history, oldest first.
    pub errors: Vec<ErrorEntry>,
}

/// Operators' dead-letter work: list, inspect, retry, discard.
pub trait DeadLetterStore: Send + Sync {
    /// Lists dead letters matching `filter` that come after `after` in the
    /// listing order (oldest first, see [`DeadLetterPage`]), at most `limit`
    /// (clamped to 1..=1000). A filter [`DeadLetterFilter::validate`]
    /// refuses is an [`StoreError::Invalid`], here, in
    /// [`DeadLetterStore::count_dead_letters`] and in every `_matching`
    /// operation.
    fn list_dead_letters<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> impl Future<Output = Result<DeadLetterPage, StoreError>> + Send + 'c;

    /// How many dead letters match `filter`: what
    /// [`DeadLetterStore::retry_dead_letters_matching`] or
    /// [`DeadLetterStore::discard_dead_letters_matching`] would act on now.
    fn count_dead_letters<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Dead letters matching `filter`, grouped by the fingerprint of their
    /// last failure: the `limit` largest groups (clamped to
    /// 1..=[`MAX_DEAD_LETTER_GROUPS`]), by count descending, then
    /// fingerprint. Counts are what
    /// [`DeadLetterStore::count_dead_letters`] gives for the filter with the
    /// group's fingerprint. Reads dead rows only (a partial index), never
    /// live deliveries.
    fn dead_letter_groups<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetterGroup>, StoreError>> + Send + 'c;

    /// One dead letter with its error history, if it exists.
    fn get_dead_letter(
        &self,
        delivery_id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetter>, StoreError>> + Send;

    /// Makes the given dead letters deliverable now with attempts reset; returns how many.
    fn retry_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Retries the given dead letters that belong to one of `tenants`, in one
    /// statement; ids of other tenants (or not dead) are left alone and not
    /// counted. Returns how many were retried.
    fn retry_tenants_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
        tenants: &'c [String],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Retries every dead letter matching `filter`; returns how many.
    fn retry_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Discards the given dead letters for good; returns how many.
    fn discard_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Discards the given dead letters that belong to one of `tenants`, in
    /// one statement; ids of other tenants are left alone and not counted.
    /// Returns how many were discarded.
    fn discard_tenants_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
        tenants: &'c [String],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Discards every dead letter matching `filter`; returns how many.
    fn discard_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// The per-subscription state of one message.
    fn message_deliveries(
        &self,
        message_id: Uuid,
    ) -> impl Future<Output = Result<Vec<DeliverySummary>, StoreError>> + Send;
}
