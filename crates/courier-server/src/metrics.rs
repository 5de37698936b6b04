//! The process's Prometheus recorder, installed once, and the daemon's own
//! metric names. Labels stay bounded: subscriptions (configured) and outcomes,
//! never tenants or free-form topics.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Messages accepted over HTTP, by `outcome` (`stored` or `duplicate`).
pub const PUBLISHED: &str = "courier_messages_published_total";
/// Open deliveries by `subscription` and `state` (`available`, `running`, `dead`), set at scrape.
pub const QUEUE_DEPTH: &str = "courier_queue_depth";
/// Age of the oldest open delivery by `subscription`, set at scrape.
pub const OLDEST_PENDING_AGE: &str = "courier_oldest_pending_age_seconds";
/// Webhook requests by `subscription` and `outcome` (`delivered`, `retry`,
/// `permanent`, `skipped`, `deferred`: a 429 or 503 asking to wait; for
/// outbox subscriptions also `throttled`: a send held back, without a
/// request, while the endpoint's wait lasts).
pub const WEBHOOK_REQUESTS: &str = "courier_webhook_requests_total";
/// Webhook request duration by `subscription`.
pub const WEBHOOK_SECONDS: &str = "courier_webhook_duration_seconds";

/// Stream entries appended over the API, by `backend`.
pub const STREAM_ENTRIES_APPENDED: &str = "courier_stream_entries_appended_total";
/// Blocking stream reads over the API waiting right now.
pub const STREAM_READS_BLOCKED: &str = "courier_stream_reads_blocked";
/// Relayed messages by `subscription` and `outcome`: `stored` (appended or
/// published downstream), `duplicate` (the target already held it: nothing
/// new was written), `retry`, `permanent` and `skipped` (a tenant outside
/// the subscription's `tenants`).
pub const RELAY_PUBLISHED: &str = "courier_relay_published_total";
/// How long one relay of a message took, by `subscription`.
pub const RELAY_SECONDS: &str = "courier_relay_duration_seconds";

/// API requests refused with 429, by `limit` (`tenant_requests`: a tenant
/// over its request rate; `auth_failures`: an address past its failed
/// authentications). No tenant or address label.
pub const RATE_LIMITED: &str = "courier_http_rate_limited_total";

/// Seconds the oldest transaction open in the database has run (PostgreSQL),
/// set at scrape; 0 when none is (or it cannot be seen).
pub const DATABASE_OLDEST_TRANSACTION: &str = "courier_database_oldest_transaction_seconds";
/// Dead row versions of each of Courier's tables by `table` (PostgreSQL),
/// set at scrape.
pub const DATABASE_DEAD_TUPLES: &str = "courier_database_dead_tuples";

/// Histogram buckets for durations, in seconds.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The Prometheus handle of this process, installing the recorder on first use.
///
/// When another recorder was installed first (by the embedding program), the
/// handle still renders, but only what was recorded through it: a warning
/// says so once.
pub fn prometheus() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = match PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            {
                Ok(with_buckets) => with_buckets,
                Err(error) => {
                    tracing::warn!(%error, "histogram buckets refused; using summaries");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "a metrics recorder was already installed; /metrics shows only what this one records"
                );
            }
            handle
        })
        .clone()
}
