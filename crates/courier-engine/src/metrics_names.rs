//! Metric names, in one place. Labels are subscription and topic only:
//! tenants are unbounded and stay out of labels.

pub(crate) const CLAIMED: &str = "courier_deliveries_claimed_total";
pub(crate) const COMPLETED: &str = "courier_deliveries_completed_total";
pub(crate) const FAILED: &str = "courier_deliveries_failed_total";
pub(crate) const DEAD_LETTERED: &str = "courier_deliveries_dead_lettered_total";
pub(crate) const LEASES_LOST: &str = "courier_leases_lost_total";
pub(crate) const HANDLER_SECONDS: &str = "courier_handler_duration_seconds";
pub(crate) const PICKUP_SECONDS: &str = "courier_delivery_latency_seconds";
pub(crate) const STORE_ERRORS: &str = "courier_store_errors_total";
pub(crate) const RESCUED: &str = "courier_deliveries_rescued_total";
pub(crate) const PRUNED_MESSAGES: &str = "courier_messages_pruned_total";
pub(crate) const PRUNED_RECEIPTS: &str = "courier_receipts_pruned_total";
pub(crate) const SNOOZED: &str = "courier_deliveries_snoozed_total";
pub(crate) const TIMED_OUT: &str = "courier_handler_timeouts_total";
pub(crate) const HANDLERS_STOPPED: &str = "courier_handlers_stopped_lease_lost_total";
