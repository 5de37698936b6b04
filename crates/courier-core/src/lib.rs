//! Courier's core: the vocabulary shared by every backend and the runtime.
//!
//! This crate holds no I/O. It defines what a message is ([`NewMessage`],
//! [`Message`]), what a worker's claim looks like ([`ClaimedDelivery`]), how
//! retries are spaced ([`RetryPolicy`]), the errors every crate boundary speaks
//! ([`StoreError`], [`HandlerError`], [`ValidationError`]) and the storage seam
//! ([`OutboxStore`], [`DeadLetterStore`]) that the PostgreSQL and SQLite
//! backends implement and the conformance suite checks, and how both
//! backends check and report their migrations ([`Migration`],
//! [`check_applied`], [`migration_status`]).

mod admin;
mod error;
mod fingerprint;
mod message;
mod migration;
mod names;
mod retry;
mod store;
mod stream;
mod trace_context;

pub use admin::{
    AdminStore, CancelOutcome, DatabaseHealth, DeliveryStats, DeliveryStatsPage, DeliveryTotals,
    MessageFilter, MessageKey, MessagePage, RateLimit, StatsKey, StoredMessage, SubscriptionInfo,
    SubscriptionPage, MAX_LIST_PAGE, MAX_MESSAGE_PAGE, MESSAGE_FILTER_STATES,
};
pub use error::{HandlerError, StoreError, ValidationError};
pub use fingerprint::{
    error_fingerprint, lease_expired_fingerprint, normalise_error, validate_fingerprint, ErrorKind,
    UNKNOWN_FINGERPRINT,
};
pub use message::{
    enqueue_outcomes, truncate_chars, Availability, ClaimedDelivery, EnqueueOutcome, ErrorEntry,
    Message, NewMessage, MAX_ERROR_CHARS, MAX_HEADERS, MAX_HOLD, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES,
    MAX_PRIORITY, MIN_PRIORITY,
};
pub use migration::{
    check_applied, migration_checksum, migration_refusal, migration_status, AppliedMigration,
    Migration, MigrationState, MigrationStatus,
};
pub use names::{topic_matches, validate_name, NAME_MAX_LEN};
pub use retry::RetryPolicy;
pub use store::{
    single_transactional_outcome, BatchItem, BatchRollback, ClaimBatch, ClaimParams, Completion,
    DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterKey, DeadLetterPage, DeadLetterStore,
    DeliverySummary, Extended, Failure, FailureApplied, LeaseRef, OutboxStore, PruneReport,
    Registration, Replay, RescueParams, Route, Snooze, SubscriptionSpec, TransactionalBatchOutcome,
    TransactionalOutcome, TxWork, MAX_DEAD_LETTER_GROUPS, MAX_SNOOZES,
};
pub use stream::{
    dead_letter_entry, group_not_found, validate_block, validate_count, validate_own_pending,
    validate_tenants, ClaimIdle, ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry,
    EntryOrigin, GroupStart, GroupSummary, NewStreamEntry, PendingDetail, PendingEntry,
    PendingQuery, PendingSummary, ReadNew, ReceiptOutcome, StreamEntry, StreamEntryId, StreamKey,
    StreamPage, StreamReceipts, StreamStore, StreamSummary, TrimBound, DEAD_LETTER_HEADERS,
    DEAD_STREAM_SUFFIX, MAX_STREAM_BATCH, MAX_STREAM_BLOCK, MAX_STREAM_PAGE,
};
pub use trace_context::{
    current_trace_headers, entries_with_current_context, has_trace_context, insert_trace_context,
    messages_with_current_context, replace_trace_context, traceparent_trace_id, valid_traceparent,
    TraceHeaders, TRACEPARENT, TRACESTATE,
};
