//! Relays: subscriptions that forward every message downstream — to a Redis
//! stream, a NATS JetStream subject, or a native stream in the outbox
//! database — and complete it only once the downstream write is confirmed
//! (seed 001's "forward downstream", done).
//!
//! # What confirms a message
//!
//! Each relay is a handler of its subscription, so each message is relayed
//! under a lease, with retries and dead letters like any other delivery (the
//! native relay, a transactional handler, with its receipt too).
//! Its delivery completes only after:
//! - **Redis** ([`RedisRelay`]): the append script returned the entry's id.
//! - **NATS** ([`NatsRelay`]): JetStream's `PubAck` arrived (the message is
//!   stored by the configured stream), within the publish timeout.
//! - **native** ([`NativeRelay`]): the append is made in the delivery's own
//!   transaction, so it commits together with the completion or not at all.
//!
//! # Why nothing is doubled downstream
//!
//! A delivery can run again after its downstream write landed: the process
//! crashed (or lost its lease) before completing, or the confirmation was
//! lost (a timeout) and the attempt retried. Every relay therefore dedupes by
//! message id:
//! - **Redis**: one Lua script per message sets
//!   `{prefix}{tenant}:{stream}:dedupe:{message id}` with `NX` and a time to
//!   live and, only if it was set, appends (`XADD`) and stores the new
//!   entry's id in that key; otherwise it appends nothing and returns the
//!   first append's id. Redis runs a script alone, so two runs of one message
//!   can never both append.
//! - **NATS**: every publish carries `Nats-Msg-Id` = `{subject}:{message
//!   id}`; JetStream drops a second publish of one id within the stream's
//!   `duplicate_window` and acknowledges it with `duplicate: true` (the
//!   subject is part of it because JetStream remembers ids per stream: two
//!   subscriptions relaying a message to two subjects of one stream each
//!   store it).
//! - **native**: the append commits with the completion, so a crash leaves
//!   neither; before appending, the relay still looks for an entry of the
//!   same message in that stream (a replay of the message: an operator's
//!   retry of a dead letter, a subscription's replay) and appends nothing if
//!   one exists.
//!
//! The Redis key's time to live and NATS's duplicate window must outlast the
//! longest time from a downstream write to the redelivery that follows it:
//! the [`RedeliveryHorizon`], the lease (a crash is noticed when it expires)
//! plus the larger of the subscription's retry cap and the rescuer's backoff
//! cap (the wait before the next attempt) plus the rescuer's interval. The
//! Redis relay's keys live twice that by default (`dedupe_ttl_ms`; never
//! less than the horizon); the NATS relay refuses to start when the stream's
//! `duplicate_window` is shorter. A redelivery later than that — the daemon,
//! or every daemon, down for longer after writing and before completing; the
//! outbox database unreachable that long — can append a message a second
//! time. Every relayed entry carries its message id (`message_id` field,
//! `Courier-Message-Id` header), so consumers can dedupe past the window.
//!
//! # Failures
//!
//! A downstream that is unreachable, times out or is restarting is a
//! retryable failure (the subscription's backoff); a name rendered from a
//! template that breaks the grammar, a payload over the target's limit, a
//! Redis key holding another type, a NATS subject stored by another stream
//! or a reserved header is permanent (dead letter at once, with the reason).
//! Connections reconnect by themselves (Redis: the store's connection
//! manager; NATS: the client), so a restarted server costs retries, never a
//! daemon restart. At start, each server must be reachable: the daemon
//! refuses to start when it is not (NATS: the stream must exist too).
//!
//! Metrics (no tenant or stream labels): [`RELAY_PUBLISHED`] by subscription
//! and outcome, [`RELAY_SECONDS`] by subscription. A native relay counts its
//! append when it is made; a transactional group that rolls back and runs
//! again counts it again.

pub mod native;
pub mod nats;
pub mod redis;
pub mod template;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use courier::{
    EntryOrigin, HandlerError, MaintenanceConfig, Message, NewStreamEntry, WorkerConfig,
};

use crate::config::SubscriptionConfig;
use crate::metrics::{RELAY_PUBLISHED, RELAY_SECONDS};
use crate::redact::redact_urls;

pub use native::{NativeRelay, NativeStreamStore};
pub use nats::{connect_nats, NatsRelay};
pub use redis::RedisRelay;

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The target's configuration is unusable.
    #[error("relay of subscription {subscription}: {reason}")]
    Invalid {
        /// The subscription.
        subscription: String,
        /// Why.
        reason: String,
    },
    /// The downstream server could not be reached or answered with an error.
    #[error("relay of subscription {subscription}: cannot reach {target}: {reason}")]
    Unreachable {
        /// The subscription.
        subscription: String,
        /// What was being reached (`redis`, `nats`, `JetStream stream ORDERS`).
        target: String,
        /// The error.
        reason: String,
    },
    /// The JetStream stream forgets message ids sooner than a redelivery
    /// can come, so a redelivered message could be stored twice.
    #[error(
        "relay of subscription {subscription}: JetStream stream {stream} has a duplicate_window of \
         {} but this subscription's redelivery horizon is {} ({horizon}); raise the stream's \
         duplicate_window to at least {}",
        seconds(*window), seconds(horizon.total()), seconds(horizon.total())
    )]
    DuplicateWindow {
        /// The subscription.
        subscription: String,
        /// The JetStream stream.
        stream: String,
        /// The stream's `duplicate_window`.
        window: Duration,
        /// What it must cover.
        horizon: RedeliveryHorizon,
    },
}

/// A duration in seconds, for messages (`335s`, `0.5s`).
fn seconds(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

/// The longest a relayed message can wait, after its downstream write, for
/// the delivery that runs it again (in the daemon, whose workers and
/// rescuer use the engine's defaults): the lease (a crashed worker's claim
/// is returned once it expires), plus the largest of the subscription's
/// retry caps (its own and each `topic_retry`'s) and the rescuer's backoff
/// cap, plus the longest wait between rescue passes (the interval, spaced
/// out up to [`courier::MAX_MAINTENANCE_SPACING`] times after a slow pass).
/// Dedupe state downstream must outlive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryHorizon {
    /// The lease of the subscription's claims.
    pub lease: Duration,
    /// The longest wait before a retry or a rescued delivery's next attempt.
    pub backoff_cap: Duration,
    /// The longest wait between two looks for expired leases.
    pub rescue_spacing: Duration,
}

impl RedeliveryHorizon {
    /// The horizon of a configured subscription run by the daemon.
    pub fn of(subscription: &SubscriptionConfig) -> Self {
        let worker = WorkerConfig::default();
        let maintenance = MaintenanceConfig::default();
        // A topic's own retry policy (`topic_retry`) is the one its
        // deliveries wait by, so the longest cap of any of them counts.
        let retry_cap = subscription
            .topic_retry
            .values()
            .map(|own| own.over(subscription.retry).policy().cap)
            .fold(subscription.retry.policy().cap, Duration::max);
        Self {
            lease: worker.lease,
            backoff_cap: retry_cap.max(maintenance.rescue_backoff.cap),
            // A slow rescue pass spaces out the next one, up to this many
            // intervals.
            rescue_spacing: maintenance.rescue_interval * courier::MAX_MAINTENANCE_SPACING,
        }
    }

    /// The whole horizon.
    pub fn total(&self) -> Duration {
        self.lease + self.backoff_cap + self.rescue_spacing
    }
}

impl fmt::Display for RedeliveryHorizon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {} + backoff cap {} + rescue spacing {}",
            seconds(self.lease),
            seconds(self.backoff_cap),
            seconds(self.rescue_spacing)
        )
    }
}

/// The connections the daemon's relays share: one Redis store (the
/// `[redis]` server under its key prefix) and one NATS client, each opened
/// only when a subscription relays there.
#[derive(Debug, Default)]
pub struct RelayConnections {
    redis: Option<courier::redis::RedisStreamStore>,
    nats: Option<async_nats::Client>,
}

impl RelayConnections {
    /// Connects to the servers `config`'s relays use; fails when one is
    /// unreachable (or, validated configs aside, not configured).
    pub async fn connect(config: &crate::config::Config) -> Result<Self, RelayError> {
        use crate::config::TargetConfig;
        let mut connections = Self::default();
        let uses = |kind: fn(&TargetConfig) -> bool| {
            config
                .subscriptions
                .iter()
                .find(|subscription| kind(&subscription.target))
        };
        if let Some(subscription) = uses(|t| matches!(t, TargetConfig::RedisStream(_))) {
            let unreachable = |reason: String| RelayError::Unreachable {
                subscription: subscription.name.clone(),
                target: "[redis] url".into(),
                reason,
            };
            let section = config
                .redis
                .as_ref()
                .ok_or_else(|| unreachable("no [redis] section is configured".into()))?;
            let store =
                courier::redis::RedisStreamStore::connect(&section.url, &section.key_prefix)
                    .await
                    .map_err(|e| unreachable(redact_urls(&e.to_string())))?;
            store
                .ping()
                .await
                .map_err(|e| unreachable(redact_urls(&e.to_string())))?;
            connections.redis = Some(store);
        }
        if let Some(subscription) = uses(|t| matches!(t, TargetConfig::Nats(_))) {
            let section = config
                .nats
                .as_ref()
                .ok_or_else(|| RelayError::Unreachable {
                    subscription: subscription.name.clone(),
                    target: "[nats] url".into(),
                    reason: "no [nats] section is configured".into(),
                })?;
            let client = connect_nats(&section.url)
                .await
                .map_err(|error| match error {
                    RelayError::Unreachable { target, reason, .. } => RelayError::Unreachable {
                        subscription: subscription.name.clone(),
                        target,
                        reason,
                    },
                    other => other,
                })?;
            connections.nats = Some(client);
        }
        Ok(connections)
    }

    /// The handler of a `redis_stream` subscription.
    pub fn redis_relay(&self, subscription: &SubscriptionConfig) -> Result<RedisRelay, RelayError> {
        let store = self.redis.clone().ok_or_else(|| RelayError::Invalid {
            subscription: subscription.name.clone(),
            reason: "Redis is not connected".into(),
        })?;
        RedisRelay::new(subscription, store)
    }

    /// The handler of a `nats` subscription (checks its JetStream stream).
    pub async fn nats_relay(
        &self,
        subscription: &SubscriptionConfig,
    ) -> Result<NatsRelay, RelayError> {
        let client = self.nats.clone().ok_or_else(|| RelayError::Invalid {
            subscription: subscription.name.clone(),
            reason: "NATS is not connected".into(),
        })?;
        NatsRelay::start(subscription, client).await
    }
}

/// What a relay's downstream write found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relayed {
    /// Written now; the downstream position (entry id, stream sequence).
    Stored(String),
    /// The target already held the message (an earlier run wrote it); its
    /// position, where the target reports it. Nothing new was written.
    Duplicate(String),
    /// Not relayed: the message's tenant is outside the subscription's
    /// `tenants`; the delivery completes.
    Skipped,
}

/// What every relay shares: its subscription (for metrics and errors) and
/// the tenants it relays.
#[derive(Debug, Clone)]
struct RelayCommon {
    subscription: String,
    tenants: Option<BTreeSet<String>>,
}

impl RelayCommon {
    fn of(subscription: &SubscriptionConfig) -> Self {
        Self {
            subscription: subscription.name.clone(),
            tenants: subscription
                .tenants
                .as_ref()
                .map(|tenants| tenants.iter().cloned().collect()),
        }
    }

    /// Whether messages of `tenant` are relayed.
    fn relays(&self, tenant: &str) -> bool {
        self.tenants
            .as_ref()
            .is_none_or(|tenants| tenants.contains(tenant))
    }

    /// Counts one relay's outcome and duration.
    fn record(&self, outcome: &Result<Relayed, HandlerError>, started: Instant) {
        let outcome = match outcome {
            Ok(Relayed::Stored(_)) => "stored",
            Ok(Relayed::Duplicate(_)) => "duplicate",
            Ok(Relayed::Skipped) => "skipped",
            Err(error) if error.is_permanent() => "permanent",
            Err(_) => "retry",
        };
        match outcome {
            "stored" | "duplicate" => crate::outcomes::global().succeeded(&self.subscription),
            "permanent" => {
                crate::outcomes::global().failed(&self.subscription, "the relay failed permanently")
            }
            "retry" => crate::outcomes::global()
                .failed(&self.subscription, "the relay failed; it is retried"),
            _ => {}
        }
        let subscription = self.subscription.clone();
        metrics::counter!(RELAY_PUBLISHED, "subscription" => subscription.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(RELAY_SECONDS, "subscription" => subscription)
            .record(started.elapsed().as_secs_f64());
    }
}

/// The headers a relay writes downstream for `message`: its own, with the
/// trace context of the relay's delivery span (`courier.deliver`, the
/// producer's child) in place of the producer's when the daemon traces, so
/// that the stream's consumers continue the trace from the relay's hop.
/// Without an OpenTelemetry context they are the message's own.
pub fn relayed_headers(message: &Message<crate::RawPayload>) -> BTreeMap<String, String> {
    let mut headers = message.headers.clone();
    if let Some(context) = courier::trace_context::current_trace_headers() {
        courier::replace_trace_context(&mut headers, &context);
    }
    headers
}

/// The stream entry that relays `message`: its payload and headers
/// ([`relayed_headers`]), and its origin (id, tenant, topic, schema
/// version). Stream entries hold JSON values, so the payload is decoded; a
/// payload no JSON value can hold (one nested deeper than the decoder
/// allows) is refused permanently.
pub fn entry_for(message: &Message<crate::RawPayload>) -> Result<NewStreamEntry, HandlerError> {
    let payload = serde_json::from_str(message.payload.get()).map_err(|e| {
        HandlerError::permanent(format!(
            "the payload cannot be a stream entry's JSON value: {e}"
        ))
    })?;
    Ok(NewStreamEntry {
        payload,
        headers: relayed_headers(message),
        origin: Some(EntryOrigin {
            message_id: message.id,
            tenant: message.tenant.clone(),
            topic: message.topic.clone(),
            schema_version: message.schema_version,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RetryConfig, TargetConfig, WebhookConfig};

    fn subscription(cap_ms: u64) -> SubscriptionConfig {
        SubscriptionConfig {
            name: "s".into(),
            topics: vec!["*".into()],
            tenants: None,
            versions: None,
            topic_retry: Default::default(),
            retry: RetryConfig {
                max_attempts: 3,
                base_ms: 10,
                cap_ms,
            },
            concurrency: 1,
            replay: None,
            target: TargetConfig::Webhook(WebhookConfig::new(
                "http://127.0.0.1:1/",
                crate::config::Secret("s".into()),
            )),
        }
    }

    #[test]
    fn the_horizon_takes_the_larger_backoff_cap() {
        let defaults = RedeliveryHorizon::of(&subscription(300_000));
        // Lease + retry cap + ten rescue intervals of 5 s.
        assert_eq!(defaults.total(), Duration::from_secs(30 + 300 + 50));
        let short = RedeliveryHorizon::of(&subscription(50));
        assert_eq!(
            short.backoff_cap,
            MaintenanceConfig::default().rescue_backoff.cap
        );
        let long = RedeliveryHorizon::of(&subscription(3_600_000));
        assert_eq!(long.total(), Duration::from_secs(30 + 3600 + 50));
        assert_eq!(
            defaults.to_string(),
            "lease 30s + backoff cap 300s + rescue spacing 50s"
        );
        // A topic's own cap counts: its deliveries wait by it.
        let mut topic = subscription(300_000);
        topic.topic_retry.insert(
            "order.paid".into(),
            crate::config::TopicRetryConfig {
                cap_ms: Some(7_200_000),
                ..Default::default()
            },
        );
        assert_eq!(
            RedeliveryHorizon::of(&topic).total(),
            Duration::from_secs(30 + 7200 + 50)
        );
    }
}
