//! The daemon's configuration: a TOML file, every key overridable by an
//! environment variable, validated before anything starts.
//!
//! Sources, later ones winning: the defaults, the TOML file, then environment
//! variables `COURIER_<KEY>` where `<KEY>` is the key's path in upper case
//! with `__` between levels and array indices as numbers:
//! `COURIER_LISTEN`, `COURIER_DATABASE_URL`, `COURIER_SUBSCRIPTIONS__0__TARGET__URL`.
//! An environment value is read as a TOML integer, float, boolean, array or
//! quoted string when it parses as one, and as a plain string otherwise
//! (`COURIER_MAX_PAYLOAD_BYTES=65536` is a number, `COURIER_LISTEN=0.0.0.0:7070`
//! a string; write `'"123"'` for a string of digits). `COURIER_CONFIG`,
//! `COURIER_URL` and `COURIER_TOKEN` belong to the command line and are not keys.
//!
//! Failure: an unknown key, a value of the wrong type or a value outside its
//! range is a [`ConfigError`] naming the key (and the environment variable it
//! came from), the value and why, so the daemon refuses to start instead of
//! running with a guess.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use courier::{validate_name, RetryPolicy, MAX_PAYLOAD_BYTES};
use serde::Deserialize;

use crate::redact::redact_urls;
use crate::relay::template::{stream_template, subject_template, validate_jetstream_name};
use crate::relay::RedeliveryHorizon;

/// The default, and the largest, `max_hold_days`: the store's `MAX_HOLD`.
pub const MAX_HOLD_DAYS: u64 = courier::MAX_HOLD.as_secs() / 86_400;

/// The database used when none is configured: an SQLite file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "./courier.db";
/// The PostgreSQL schema holding Courier's tables, by default.
pub const DEFAULT_SCHEMA: &str = "courier";
/// The address the daemon listens on, by default (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// The largest accepted payload, by default (the store's own limit, 1 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = MAX_PAYLOAD_BYTES;
/// How long shutdown waits for in-flight deliveries, by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// How long one webhook request may take, by default.
pub const DEFAULT_WEBHOOK_TIMEOUT_MS: u64 = 10_000;
/// The shortest accepted webhook signing key, in bytes (after base64
/// decoding of a `whsec_` secret): the Standard Webhooks minimum.
pub const MIN_WEBHOOK_SECRET_BYTES: usize = 24;
/// The longest accepted webhook timeout.
pub const MAX_WEBHOOK_TIMEOUT_MS: u64 = 300_000;
/// The longest accepted shutdown timeout.
pub const MAX_SHUTDOWN_TIMEOUT_MS: u64 = 3_600_000;
/// The most handlers of one subscription running at once.
pub const MAX_CONCURRENCY: usize = 10_000;
/// The longest accepted header read or request timeout.
pub const MAX_SERVER_TIMEOUT_MS: u64 = 3_600_000;
/// The most connections the server may be configured to serve at once.
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// The prefix of every environment variable that sets a key.
pub const ENV_PREFIX: &str = "COURIER_";
/// `COURIER_*` variables that belong to the command line, not to the config.
pub const ENV_NOT_KEYS: &[&str] = &["CONFIG", "URL", "TOKEN"];

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file (or `<text>` for a string).
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key is unknown or its value is refused.
    #[error("config key `{key}`{}: {reason}", value.as_ref().map(|v| format!(" = {}", redact_urls(v))).unwrap_or_default())]
    Invalid {
        /// The key's path (`listen`, `subscriptions[0].target.url`), with the
        /// environment variable it came from, if any.
        key: String,
        /// The refused value, as written, with secrets left out (the
        /// password and query values of a URL are `***`).
        value: Option<String>,
        /// Why.
        reason: String,
    },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, value: Option<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            value: value.map(|v| redact_urls(&v)),
            reason: reason.into(),
        }
    }

    /// The key the error concerns, if it concerns one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// What a bearer token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Dead letters (retry, discard), subscriptions (pause, resume) and
    /// streams (create groups, trim, delete consumers); implies `read`.
    Admin,
    /// Consuming streams through a group: read, ack and claim entries.
    Consume,
    /// Publishing messages and appending stream entries.
    Publish,
    /// Reading messages, dead letters, stats, subscriptions, metrics, stream
    /// entries, pending entries and consumers.
    Read,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Admin => "admin",
            Role::Consume => "consume",
            Role::Publish => "publish",
            Role::Read => "read",
        })
    }
}

/// A string that is never printed by `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// One bearer token: stored as the hex SHA-256 of the token, never in clear.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for logs.
    pub name: String,
    /// The hex SHA-256 of the token (`printf %s "$TOKEN" | sha256sum`).
    pub sha256: String,
    /// The tenants the token may see, or `["*"]` for all.
    pub tenants: Vec<String>,
    /// What the token may do.
    pub roles: Vec<Role>,
}

/// A subscription's retry policy, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts before a delivery is dead-lettered.
    pub max_attempts: i32,
    /// The first retry's delay.
    pub base_ms: u64,
    /// The longest delay.
    pub cap_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        let policy = RetryPolicy::default();
        Self {
            max_attempts: policy.max_attempts,
            base_ms: u64::try_from(policy.base.as_millis()).unwrap_or(u64::MAX),
            cap_ms: u64::try_from(policy.cap.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A topic's own retry policy within a subscription
/// (`[subscriptions.topic_retry."invoice.paid"]`): each key left out is the
/// subscription's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRetryConfig {
    /// Attempts before a delivery of this topic is dead-lettered.
    pub max_attempts: Option<i32>,
    /// The first retry's delay.
    pub base_ms: Option<u64>,
    /// The longest delay.
    pub cap_ms: Option<u64>,
}

impl TopicRetryConfig {
    /// This topic's policy: its own keys over the subscription's `retry`.
    pub fn over(&self, retry: RetryConfig) -> RetryConfig {
        RetryConfig {
            max_attempts: self.max_attempts.unwrap_or(retry.max_attempts),
            base_ms: self.base_ms.unwrap_or(retry.base_ms),
            cap_ms: self.cap_ms.unwrap_or(retry.cap_ms),
        }
    }
}

impl RetryConfig {
    /// The engine's policy.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts,
            base: Duration::from_millis(self.base_ms),
            cap: Duration::from_millis(self.cap_ms),
        }
    }
}

/// Where a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TargetConfig {
    /// An HTTP endpoint, signed per Standard Webhooks.
    Webhook(WebhookConfig),
    /// A Redis stream on the `[redis]` server (`type = "redis_stream"`).
    #[serde(rename = "redis_stream")]
    RedisStream(RedisStreamTargetConfig),
    /// A subject of a JetStream stream on the `[nats]` server (`type = "nats"`).
    Nats(NatsTargetConfig),
    /// A native stream in the outbox database (`type = "stream"`).
    Stream(NativeStreamTargetConfig),
}

impl TargetConfig {
    /// The target's `type` as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            TargetConfig::Webhook(_) => "webhook",
            TargetConfig::RedisStream(_) => "redis_stream",
            TargetConfig::Nats(_) => "nats",
            TargetConfig::Stream(_) => "stream",
        }
    }
}

/// A relay to a Redis stream: `{prefix}{tenant}:{stream}` on `[redis]`, the
/// key layout of Courier's Redis stream store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStreamTargetConfig {
    /// The stream's name, a template over `{tenant}` and `{topic}`; the
    /// rendered name must follow the name grammar.
    pub stream: String,
    /// Trim the stream to about this many entries on every append
    /// (`XADD MAXLEN ~`); `None`: never trimmed by the relay.
    #[serde(default)]
    pub maxlen: Option<u64>,
    /// How long a relayed message's dedupe key lives, in milliseconds; at
    /// least the subscription's redelivery horizon
    /// ([`RedeliveryHorizon`]), at most [`MAX_DEDUPE_TTL_MS`], by default
    /// twice the horizon. See the `relay` module.
    #[serde(default)]
    pub dedupe_ttl_ms: Option<u64>,
}

/// A relay to NATS JetStream: publish on `subject`, stored by `stream`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsTargetConfig {
    /// The subject, a template over `{tenant}` and `{topic}`.
    pub subject: String,
    /// The JetStream stream that stores the subject; its `duplicate_window`
    /// must cover the subscription's redelivery horizon (checked at start).
    pub stream: String,
    /// How long one publish may wait for its acknowledgement, in milliseconds.
    #[serde(default = "default_relay_timeout_ms")]
    pub timeout_ms: u64,
}

/// A relay to a native stream of the message's tenant in the outbox database.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeStreamTargetConfig {
    /// The stream's name, a template over `{tenant}` and `{topic}`.
    pub stream: String,
}

/// How long one NATS publish may wait for its acknowledgement, by default.
pub const DEFAULT_RELAY_TIMEOUT_MS: u64 = 5_000;
/// The longest accepted relay publish timeout.
pub const MAX_RELAY_TIMEOUT_MS: u64 = 60_000;

fn default_relay_timeout_ms() -> u64 {
    DEFAULT_RELAY_TIMEOUT_MS
}

/// An HTTP webhook target.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The endpoint (`http` or `https`).
    pub url: String,
    /// A signing secret: `whsec_<base64>` or raw text, at least
    /// [`MIN_WEBHOOK_SECRET_BYTES`] bytes of key. `secret`, `secrets` or both;
    /// every request is signed with each of them.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// More signing secrets, as `secret` is written: while a receiver moves
    /// to a new secret, list the old and the new one and every request
    /// carries a signature by each (`webhook-signature: v1,<a> v1,<b>`).
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// How long one request may take.
    #[serde(default = "default_webhook_timeout_ms")]
    pub timeout_ms: u64,
    /// What the request's body is: the payload (`raw`) or the Standard
    /// Webhooks envelope (`envelope`). Outbox subscriptions only; a stream
    /// subscription's webhook sends the entry's payload.
    #[serde(default)]
    pub format: WebhookFormat,
}

/// What a webhook request's body holds. Either way the message's metadata
/// and its forwardable headers go as HTTP headers (see [`crate::webhook`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// The payload itself, as JSON.
    #[default]
    Raw,
    /// `{"type": <topic>, "timestamp": <occurred_at, RFC 3339>, "data":
    /// <payload>}`, the Standard Webhooks envelope.
    Envelope,
}

impl WebhookFormat {
    /// The format's name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            WebhookFormat::Raw => "raw",
            WebhookFormat::Envelope => "envelope",
        }
    }
}

fn default_webhook_timeout_ms() -> u64 {
    DEFAULT_WEBHOOK_TIMEOUT_MS
}

impl WebhookConfig {
    /// A webhook to `url` signed with `secret`, with the default timeout and
    /// the `raw` format; change a field afterwards for anything else.
    pub fn new(url: impl Into<String>, secret: Secret) -> Self {
        Self {
            url: url.into(),
            secret: Some(secret),
            secrets: Vec::new(),
            timeout_ms: DEFAULT_WEBHOOK_TIMEOUT_MS,
            format: WebhookFormat::Raw,
        }
    }

    /// The signing keys, `secret` first, then `secrets` in order: each
    /// base64-decoded after `whsec_`, else the raw text's bytes. Refused,
    /// naming the field (`secret`, `secrets[1]`), when there is none or one
    /// is shorter than [`MIN_WEBHOOK_SECRET_BYTES`] or not base64 after
    /// `whsec_`.
    pub fn signing_keys(&self) -> Result<Vec<Vec<u8>>, InvalidSecret> {
        let named = self
            .secret
            .iter()
            .map(|secret| ("secret".to_owned(), secret))
            .chain(
                self.secrets
                    .iter()
                    .enumerate()
                    .map(|(i, secret)| (format!("secrets[{i}]"), secret)),
            );
        let mut keys = Vec::new();
        for (field, secret) in named {
            let key = match secret.0.strip_prefix("whsec_") {
                Some(encoded) => base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| InvalidSecret {
                        field: field.clone(),
                        reason: format!("the part after `whsec_` is not base64: {e}"),
                    })?,
                None => secret.0.as_bytes().to_vec(),
            };
            if key.len() < MIN_WEBHOOK_SECRET_BYTES {
                return Err(InvalidSecret {
                    field,
                    reason: format!(
                        "is {} bytes of key; at least {MIN_WEBHOOK_SECRET_BYTES} are required \
                         (Standard Webhooks: 24 to 64, e.g. `whsec_` followed by the output of \
                         `openssl rand -base64 32`)",
                        key.len()
                    ),
                });
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(InvalidSecret {
                field: "secret".into(),
                reason: "is missing: a webhook needs `secret` or `secrets` (at least one \
                         signing secret)"
                    .into(),
            });
        }
        Ok(keys)
    }
}

/// Why a webhook's signing secrets were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct InvalidSecret {
    /// The field, under the target: `secret` or `secrets[i]`.
    pub field: String,
    /// Why, without the secret.
    pub reason: String,
}

/// A subscription the daemon delivers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    /// The subscription's name.
    pub name: String,
    /// Topic patterns: exact topics, `prefix.*`, or `*`.
    pub topics: Vec<String>,
    /// Only these tenants' messages are sent; the others are completed
    /// without sending (they read `completed`). `None`: every tenant.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// Only messages of these schema versions are claimed; the others wait,
    /// spending no attempt, until a daemon whose config accepts them runs
    /// (a rolling deploy publishing v2 before the endpoint takes it).
    /// `None`: every version.
    #[serde(default)]
    pub versions: Option<Vec<i32>>,
    /// The retry policy.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Retry policies of single topics (exact topics the subscription's
    /// patterns take), over `retry`.
    #[serde(default)]
    pub topic_retry: BTreeMap<String, TopicRetryConfig>,
    /// Deliveries in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// When the daemon creates this subscription, it also receives these
    /// retained messages: `all`, an RFC 3339 time (messages enqueued then or
    /// later) or a message id (it and every later one). Ignored once the
    /// subscription exists.
    #[serde(default)]
    pub replay: Option<String>,
    /// Where messages go.
    pub target: TargetConfig,
}

fn default_concurrency() -> usize {
    16
}

impl SubscriptionConfig {
    /// The subscription `name` on `topics` delivering to `target`, with what
    /// a `[[subscriptions]]` entry naming only these three gets: every
    /// tenant, the default retry policy, 16 deliveries in flight, no replay.
    /// For code that builds a relay or webhook handler without a config file
    /// ([`RedisRelay::new`](crate::relay::RedisRelay::new),
    /// [`NatsRelay::start`](crate::relay::NatsRelay::start),
    /// [`NativeRelay::new`](crate::relay::NativeRelay::new)); change a field
    /// afterwards for anything else. Nothing is checked here:
    /// [`Config::validate`] checks subscriptions of a loaded config, and the
    /// relays check their target when they are made.
    pub fn new(name: impl Into<String>, topics: Vec<String>, target: TargetConfig) -> Self {
        Self {
            name: name.into(),
            topics,
            tenants: None,
            versions: None,
            retry: RetryConfig::default(),
            topic_retry: BTreeMap::new(),
            concurrency: default_concurrency(),
            replay: None,
            target,
        }
    }
}

/// `[redis]`: the Redis server streams (`[streams] backend = "redis"`) and
/// Redis relays use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// `redis://` or `rediss://` URL.
    pub url: String,
    /// Prepended to every key Courier writes (`{prefix}{tenant}:{stream}`).
    #[serde(default)]
    pub key_prefix: String,
}

/// `[nats]`: the NATS server JetStream relays publish to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSection {
    /// `nats://` or `tls://` URL.
    pub url: String,
}

/// `[otel]`: export spans (each delivery's `courier.deliver`, in its
/// producer's trace) to an OpenTelemetry collector over OTLP/HTTP with
/// protobuf. Needs a `courier` built with the `otel` feature (the default).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelSection {
    /// The collector's base URL, `http://` or `https://`
    /// (`http://127.0.0.1:4318`); spans are POSTed to `{endpoint}/v1/traces`,
    /// as with `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    /// The `service.name` of the exported spans.
    #[serde(default = "default_otel_service_name")]
    pub service_name: String,
}

/// The default `otel.service_name`.
pub const DEFAULT_OTEL_SERVICE_NAME: &str = "courier";

fn default_otel_service_name() -> String {
    DEFAULT_OTEL_SERVICE_NAME.to_owned()
}

impl OtelSection {
    /// Where spans are sent: `{endpoint}/v1/traces`.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
    }
}

/// Where the daemon's streams live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamBackendKind {
    /// Native streams in the outbox database (PostgreSQL or SQLite).
    #[default]
    Native,
    /// Redis Streams at `[redis] url`.
    Redis,
}

/// `[streams]`: the stream backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamsSection {
    /// `native` (default) or `redis`.
    pub backend: StreamBackendKind,
}

/// One `[[stream_subscriptions]]` entry: a tenant's stream delivered to a
/// target through a consumer group named after the subscription (see
/// [`courier::StreamSubscription`]). Durations are in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSubscriptionSettings {
    /// The subscription's name: also its consumer group's, and the first part
    /// of each entry's correlation id `{name}:{stream}:{entry id}`.
    pub name: String,
    /// The tenant whose stream is read.
    pub tenant: String,
    /// The stream.
    pub stream: String,
    /// With `[streams] backend = "redis"`: read the Redis stream at this key
    /// (verbatim, no `key_prefix`) instead of `{key_prefix}{tenant}:{stream}`,
    /// e.g. a stream another program writes; dead letters go to
    /// `{redis_key}.dead`. `stream` still names it in correlation ids.
    #[serde(default)]
    pub redis_key: Option<String>,
    /// This daemon's consumer in the group (default
    /// `{hostname}-{name}`, stable across restarts).
    #[serde(default)]
    pub consumer: Option<String>,
    /// Where the group starts when the daemon creates it: `end` (default),
    /// `beginning`, or an entry id (the entries after it).
    #[serde(default = "default_stream_start")]
    pub start: String,
    /// Entries per read or claim.
    #[serde(default = "default_stream_batch")]
    pub batch: usize,
    /// How long a read waits for new entries.
    #[serde(default = "default_stream_block_ms")]
    pub block_ms: u64,
    /// How long an entry must be pending and idle before it is claimed again
    /// (the redelivery delay after a failed delivery).
    #[serde(default = "default_min_idle_ms")]
    pub min_idle_ms: u64,
    /// How often idle entries are claimed.
    #[serde(default = "default_claim_interval_ms")]
    pub claim_interval_ms: u64,
    /// Deliveries after which a failing entry is dead-lettered to
    /// `{stream}.dead`.
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u64,
    /// The first pause after the target asked to wait (429, or 503 with
    /// `Retry-After`).
    #[serde(default = "default_defer_min_ms")]
    pub defer_min_ms: u64,
    /// The longest such pause.
    #[serde(default = "default_defer_max_ms")]
    pub defer_max_ms: u64,
    /// Entries delivered at once.
    #[serde(default = "default_stream_concurrency")]
    pub concurrency: usize,
    /// How long one delivery may take before it counts as failed.
    #[serde(default = "default_handler_timeout_ms")]
    pub handler_timeout_ms: u64,
    /// Where entries go.
    pub target: StreamTargetConfig,
}

/// Where a stream subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum StreamTargetConfig {
    /// An HTTP endpoint, signed per Standard Webhooks; `webhook-id` is the
    /// entry's correlation id.
    Webhook(WebhookConfig),
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn default_stream_start() -> String {
    "end".to_owned()
}

fn default_stream_batch() -> usize {
    courier::DEFAULT_STREAM_BATCH
}

fn default_stream_block_ms() -> u64 {
    millis(courier::DEFAULT_STREAM_BLOCK)
}

fn default_min_idle_ms() -> u64 {
    millis(courier::DEFAULT_MIN_IDLE)
}

fn default_claim_interval_ms() -> u64 {
    millis(courier::DEFAULT_CLAIM_INTERVAL)
}

fn default_max_deliveries() -> u64 {
    courier::DEFAULT_MAX_DELIVERIES
}

fn default_defer_min_ms() -> u64 {
    millis(courier::DEFAULT_DEFER_MIN)
}

fn default_defer_max_ms() -> u64 {
    millis(courier::DEFAULT_DEFER_MAX)
}

fn default_stream_concurrency() -> usize {
    1
}

fn default_handler_timeout_ms() -> u64 {
    millis(courier::DEFAULT_HANDLER_TIMEOUT)
}

/// The longest accepted stream subscription duration setting (one day).
pub const MAX_STREAM_SETTING_MS: u64 = 86_400_000;

impl StreamSubscriptionSettings {
    /// Where the group starts (checked when the configuration loads).
    pub fn group_start(&self) -> Result<courier::GroupStart, courier::ValidationError> {
        self.start.parse()
    }

    /// The tenant's stream (checked when the configuration loads).
    pub fn key(&self) -> Result<courier::StreamKey, courier::ValidationError> {
        courier::StreamKey::new(self.tenant.clone(), self.stream.clone())
    }

    /// The engine's settings for this subscription, with `shutdown_timeout`.
    pub fn engine_config(
        &self,
        shutdown_timeout: Duration,
    ) -> Result<courier::StreamSubscriptionConfig, courier::ValidationError> {
        let mut config = courier::StreamSubscriptionConfig::new(self.name.clone(), self.key()?)?;
        if let Some(consumer) = &self.consumer {
            config.consumer = consumer.clone();
        }
        config.start = self.group_start()?;
        config.batch = self.batch;
        config.block = Duration::from_millis(self.block_ms);
        config.min_idle = Duration::from_millis(self.min_idle_ms);
        config.claim_interval = Duration::from_millis(self.claim_interval_ms);
        config.max_deliveries = self.max_deliveries;
        config.defer_min = Duration::from_millis(self.defer_min_ms);
        config.defer_max = Duration::from_millis(self.defer_max_ms);
        config.concurrency = self.concurrency;
        config.handler_timeout = Some(Duration::from_millis(self.handler_timeout_ms));
        config.shutdown_timeout = shutdown_timeout;
        config.validate()?;
        Ok(config)
    }
}

/// The daemon's whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `postgres://…` / `postgresql://…` for PostgreSQL; a path or `sqlite:` URL for SQLite.
    pub database_url: String,
    /// The PostgreSQL schema of Courier's tables.
    pub schema: String,
    /// The address the HTTP API listens on.
    pub listen: SocketAddr,
    /// How logs are written.
    pub log_format: LogFormat,
    /// The largest accepted payload, in bytes of JSON text.
    pub max_payload_bytes: usize,
    /// The furthest ahead a published message's `available_at` may be, in
    /// days (1 to 366, the store's `MAX_HOLD`): a held message with an
    /// ordering key holds back its key as long.
    pub max_hold_days: u64,
    /// How long shutdown waits for in-flight deliveries.
    pub shutdown_timeout_ms: u64,
    /// Bearer tokens; none means an open API on loopback only.
    pub tokens: Vec<TokenConfig>,
    /// Subscriptions the daemon delivers.
    pub subscriptions: Vec<SubscriptionConfig>,
    /// Publish a sample event every 2 s to a built-in `demo` subscription that
    /// logs what it receives, so a newcomer sees messages flow at once.
    pub demo: bool,
    /// The Redis server, when streams or relays use one.
    pub redis: Option<RedisSection>,
    /// The NATS server, when relays use one.
    pub nats: Option<NatsSection>,
    /// OpenTelemetry trace export; none: nothing is exported.
    pub otel: Option<OtelSection>,
    /// Where streams live.
    pub streams: StreamsSection,
    /// Stream subscriptions the daemon delivers.
    pub stream_subscriptions: Vec<StreamSubscriptionSettings>,
    /// The HTTP server's limits and extra listeners.
    pub server: ServerSection,
}

/// `[server]`: how the HTTP API meets its clients.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// How long a connection may take to send a request's head; past it the
    /// connection is closed (slowloris).
    pub header_read_timeout_ms: u64,
    /// How long one request may take, body and answer; past it the answer
    /// is 408. Blocking stream reads longer than this are cut too.
    pub request_timeout_ms: u64,
    /// How many connections are served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Extra `Host` values the API answers to besides its listen address
    /// (and, on loopback, `localhost:PORT`, `127.0.0.1:PORT`, `[::1]:PORT`):
    /// `courier.internal` (any port) or `courier.internal:8443`. Others: 421.
    pub allowed_hosts: Vec<String>,
    /// Origins (`https://ops.example.com`) whose browser pages may call the
    /// API; a request with any other `Origin` header is 403. Default: none.
    pub allowed_origins: Vec<String>,
    /// An extra address serving only `GET /metrics`, without tokens, for a
    /// Prometheus scraper (`127.0.0.1:9464`); none by default, and then
    /// `/metrics` on `listen` needs an `admin` token.
    pub metrics_listen: Option<SocketAddr>,
    /// Requests per second a tenant may make, sustained (see
    /// [`crate::limits`]); past it 429 with `Retry-After`. 0: no limit.
    pub tenant_requests_per_second: u32,
    /// Requests a tenant may make at once above its rate (at least 1).
    pub tenant_request_burst: u32,
    /// Requests with a missing or unknown token an address may make per
    /// minute; past it every request from it is 429 until the minute ends.
    /// 0: no limit.
    pub auth_failures_per_minute: u32,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: crate::http_server::DEFAULT_HEADER_READ_TIMEOUT_MS,
            request_timeout_ms: crate::http_server::DEFAULT_REQUEST_TIMEOUT_MS,
            max_connections: crate::http_server::DEFAULT_MAX_CONNECTIONS,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            metrics_listen: None,
            tenant_requests_per_second: DEFAULT_TENANT_REQUESTS_PER_SECOND,
            tenant_request_burst: DEFAULT_TENANT_REQUEST_BURST,
            auth_failures_per_minute: DEFAULT_AUTH_FAILURES_PER_MINUTE,
        }
    }
}

/// The default of `server.tenant_requests_per_second`.
pub const DEFAULT_TENANT_REQUESTS_PER_SECOND: u32 = 1_000;
/// The default of `server.tenant_request_burst`.
pub const DEFAULT_TENANT_REQUEST_BURST: u32 = 2_000;
/// The default of `server.auth_failures_per_minute`.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 20;

impl ServerSection {
    /// The API's request limits.
    pub fn limit_settings(&self) -> crate::limits::LimitSettings {
        crate::limits::LimitSettings {
            tenant_requests_per_second: self.tenant_requests_per_second,
            tenant_request_burst: self.tenant_request_burst,
            auth_failures_per_minute: self.auth_failures_per_minute,
        }
    }

    /// The limits of each listener.
    pub fn limits(&self) -> crate::http_server::HttpLimits {
        crate::http_server::HttpLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_connections: self.max_connections,
        }
    }

    /// How long one request may take.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            log_format: LogFormat::Text,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_hold_days: MAX_HOLD_DAYS,
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            tokens: Vec::new(),
            subscriptions: Vec::new(),
            demo: false,
            redis: None,
            nats: None,
            otel: None,
            streams: StreamsSection::default(),
            stream_subscriptions: Vec::new(),
            server: ServerSection::default(),
        }
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseKind {
    /// PostgreSQL at this URL.
    Postgres(String),
    /// SQLite at this path or `sqlite:` URL.
    Sqlite(String),
}

impl Config {
    /// Reads the file at `path` (if any), applies the process's `COURIER_*`
    /// environment variables and validates the result.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let text = match path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                        path: path.display().to_string(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let name = path.map(|p| p.display().to_string());
        Self::from_sources(text.as_deref(), name.as_deref(), std::env::vars())
    }

    /// Parses TOML text (no environment) and validates it.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_sources(Some(text), None, std::iter::empty())
    }

    /// Parses optional TOML text, applies `env` (pairs of variable and value;
    /// variables without the `COURIER_` prefix are ignored) and validates.
    /// `file_name` names the text in syntax errors.
    pub fn from_sources(
        toml_text: Option<&str>,
        file_name: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut root = match toml_text {
            Some(text) => toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Syntax {
                path: file_name.unwrap_or("<text>").to_owned(),
                message: e.to_string(),
            })?,
            None => toml::Table::new(),
        };
        let origins = apply_env(&mut root, env)?;
        let root = toml::Value::Table(root);
        let config: Config = serde_path_to_error::deserialize(root.clone())
            .map_err(|error| deserialize_error(&root, &origins, error))?;
        config
            .validate()
            .map_err(|error| with_origin(error, &origins))?;
        Ok(config)
    }

    /// Checks every value, naming the key, the value and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, value: &dyn fmt::Display, reason: &str| {
            ConfigError::invalid(key, Some(format!("{:?}", value.to_string())), reason)
        };
        self.database()?;
        courier::postgres::validate_schema(&self.schema)
            .map_err(|e| bad("schema", &self.schema, &e.reason))?;
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_BYTES {
            return Err(bad(
                "max_payload_bytes",
                &self.max_payload_bytes,
                &format!("must be between 1 and {MAX_PAYLOAD_BYTES} (the store's limit)"),
            ));
        }
        if self.max_hold_days == 0 || self.max_hold_days > MAX_HOLD_DAYS {
            return Err(bad(
                "max_hold_days",
                &self.max_hold_days,
                &format!("must be between 1 and {MAX_HOLD_DAYS} (the store's MAX_HOLD)"),
            ));
        }
        if self.shutdown_timeout_ms > MAX_SHUTDOWN_TIMEOUT_MS {
            return Err(bad(
                "shutdown_timeout_ms",
                &self.shutdown_timeout_ms,
                &format!("must be at most {MAX_SHUTDOWN_TIMEOUT_MS} (one hour)"),
            ));
        }
        if self.tokens.is_empty() && !self.listen.ip().is_loopback() {
            return Err(bad(
                "listen",
                &self.listen,
                "refusing to listen on a non-loopback address without [[tokens]]: \
                 anyone who can reach it could publish and read every tenant's messages; \
                 configure tokens or listen on 127.0.0.1",
            ));
        }
        let mut token_names = BTreeSet::new();
        let mut token_hashes = BTreeSet::new();
        for (i, token) in self.tokens.iter().enumerate() {
            let key = |field: &str| format!("tokens[{i}].{field}");
            validate_name("name", &token.name)
                .map_err(|e| bad(&key("name"), &token.name, &e.reason))?;
            if !token_names.insert(token.name.as_str()) {
                return Err(bad(&key("name"), &token.name, "two tokens have this name"));
            }
            let hash = decode_sha256(&token.sha256).map_err(|reason| {
                ConfigError::invalid(key("sha256"), Some(format!("{:?}", token.sha256)), reason)
            })?;
            if !token_hashes.insert(hash) {
                return Err(ConfigError::invalid(
                    key("sha256"),
                    None,
                    "two tokens have the same hash",
                ));
            }
            validate_tenants(&key("tenants"), &token.tenants, true)?;
            if token.roles.is_empty() {
                return Err(ConfigError::invalid(
                    key("roles"),
                    Some("[]".into()),
                    "must name at least one of admin, consume, publish, read",
                ));
            }
        }
        for (key, value) in [
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            ("server.request_timeout_ms", self.server.request_timeout_ms),
        ] {
            if value == 0 || value > MAX_SERVER_TIMEOUT_MS {
                return Err(bad(
                    key,
                    &value,
                    &format!("must be between 1 and {MAX_SERVER_TIMEOUT_MS} (one hour)"),
                ));
            }
        }
        if self.server.tenant_requests_per_second > 0 && self.server.tenant_request_burst == 0 {
            return Err(bad(
                "server.tenant_request_burst",
                &self.server.tenant_request_burst,
                "must be at least 1 while server.tenant_requests_per_second is set",
            ));
        }
        if self.server.max_connections == 0 || self.server.max_connections > MAX_CONNECTIONS {
            return Err(bad(
                "server.max_connections",
                &self.server.max_connections,
                &format!("must be between 1 and {MAX_CONNECTIONS}"),
            ));
        }
        for (i, host) in self.server.allowed_hosts.iter().enumerate() {
            let ok = !host.is_empty()
                && host.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_')
                });
            if !ok {
                return Err(bad(
                    &format!("server.allowed_hosts[{i}]"),
                    host,
                    "must be a host name or address, optionally with :port                      (`courier.internal`, `10.0.0.5:7070`, `[::1]:7070`), without scheme or path",
                ));
            }
        }
        for (i, origin) in self.server.allowed_origins.iter().enumerate() {
            let rest = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            let ok = rest.is_some_and(|rest| {
                let rest = rest.trim_end_matches('/');
                !rest.is_empty() && !rest.contains(['/', '?', '#', '@', ' '])
            });
            if !ok {
                return Err(bad(
                    &format!("server.allowed_origins[{i}]"),
                    origin,
                    "must be an origin: http:// or https://, a host and an optional port,                      no path (`https://ops.example.com`)",
                ));
            }
        }
        if let Some(metrics_listen) = self.server.metrics_listen {
            if metrics_listen == self.listen && metrics_listen.port() != 0 {
                return Err(bad(
                    "server.metrics_listen",
                    &metrics_listen,
                    "must differ from `listen`",
                ));
            }
        }
        if let Some(redis) = &self.redis {
            if !(redis.url.starts_with("redis://") || redis.url.starts_with("rediss://")) {
                return Err(bad(
                    "redis.url",
                    &redis.url,
                    "must be a redis:// or rediss:// URL",
                ));
            }
            courier::redis::validate_key_prefix(&redis.key_prefix)
                .map_err(|e| bad("redis.key_prefix", &redis.key_prefix, &e.reason))?;
        }
        if let Some(nats) = &self.nats {
            if !["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|scheme| nats.url.starts_with(scheme))
            {
                return Err(bad(
                    "nats.url",
                    &nats.url,
                    "must be a nats://, tls://, ws:// or wss:// URL",
                ));
            }
        }
        if let Some(otel) = &self.otel {
            let parsed = reqwest::Url::parse(&otel.endpoint);
            let ok = parsed.as_ref().is_ok_and(|url| {
                matches!(url.scheme(), "http" | "https")
                    && url.host_str().is_some_and(|host| !host.is_empty())
                    && url.query().is_none()
                    && url.fragment().is_none()
            });
            if !ok {
                return Err(bad(
                    "otel.endpoint",
                    &otel.endpoint,
                    "must be the collector's http:// or https:// base URL, without query \
                     (`http://127.0.0.1:4318`; spans go to {endpoint}/v1/traces)",
                ));
            }
            if otel.service_name.trim().is_empty() {
                return Err(bad(
                    "otel.service_name",
                    &otel.service_name,
                    "must not be empty",
                ));
            }
            if !cfg!(feature = "otel") {
                return Err(bad(
                    "otel.endpoint",
                    &otel.endpoint,
                    "this courier was built without the `otel` feature and cannot export \
                     traces; build it with `--features otel` or remove [otel]",
                ));
            }
        }
        if self.streams.backend == StreamBackendKind::Redis && self.redis.is_none() {
            return Err(ConfigError::invalid(
                "streams.backend",
                Some("\"redis\"".into()),
                "needs a [redis] section with the server's url",
            ));
        }
        let mut subscription_names = BTreeSet::new();
        for (i, subscription) in self.subscriptions.iter().enumerate() {
            let key = |field: &str| format!("subscriptions[{i}].{field}");
            validate_name("name", &subscription.name)
                .map_err(|e| bad(&key("name"), &subscription.name, &e.reason))?;
            if !subscription_names.insert(subscription.name.as_str()) {
                return Err(bad(
                    &key("name"),
                    &subscription.name,
                    "two subscriptions have this name",
                ));
            }
            if subscription.topics.is_empty() {
                return Err(ConfigError::invalid(
                    key("topics"),
                    Some("[]".into()),
                    "must name at least one topic pattern (exact, `prefix.*` or `*`)",
                ));
            }
            for (j, pattern) in subscription.topics.iter().enumerate() {
                validate_topic_pattern(pattern)
                    .map_err(|reason| bad(&key(&format!("topics[{j}]")), pattern, &reason))?;
            }
            if let Some(tenants) = &subscription.tenants {
                validate_tenants(&key("tenants"), tenants, false)?;
            }
            if let Some(versions) = &subscription.versions {
                if versions.is_empty() {
                    return Err(ConfigError::invalid(
                        key("versions"),
                        Some("[]".into()),
                        "must list at least one schema version (leave it out for every version)",
                    ));
                }
                for (j, version) in versions.iter().enumerate() {
                    if *version < 1 {
                        return Err(bad(
                            &key(&format!("versions[{j}]")),
                            version,
                            "a schema version is at least 1",
                        ));
                    }
                    if versions[..j].contains(version) {
                        return Err(bad(
                            &key(&format!("versions[{j}]")),
                            version,
                            "listed twice",
                        ));
                    }
                }
            }
            if let Some(replay) = &subscription.replay {
                replay
                    .parse::<courier::Replay>()
                    .map_err(|e| bad(&key("replay"), replay, &e.reason))?;
            }
            validate_retry(&key("retry"), subscription.retry)?;
            for (topic, own) in &subscription.topic_retry {
                let at = key(&format!("topic_retry.{topic:?}"));
                validate_name("topic", topic).map_err(|e| {
                    ConfigError::invalid(
                        at.clone(),
                        None,
                        format!("{}; a topic's retry names one exact topic", e.reason),
                    )
                })?;
                if !subscription
                    .topics
                    .iter()
                    .any(|pattern| courier::topic_matches(pattern, topic))
                {
                    return Err(ConfigError::invalid(
                        at,
                        None,
                        "none of the subscription's topics takes this topic",
                    ));
                }
                validate_retry(&at, own.over(subscription.retry))?;
            }
            if subscription.concurrency == 0 || subscription.concurrency > MAX_CONCURRENCY {
                return Err(bad(
                    &key("concurrency"),
                    &subscription.concurrency,
                    &format!("must be between 1 and {MAX_CONCURRENCY}"),
                ));
            }
            match &subscription.target {
                TargetConfig::Webhook(webhook) => {
                    validate_webhook(&key("target"), &subscription.name, webhook)?;
                }
                target => self.validate_relay(i, subscription, target)?,
            }
        }
        self.validate_stream_subscriptions()?;
        Ok(())
    }

    /// Checks the relay target of `subscription` (the `i`th): its templates
    /// render valid names, its numbers are in range, and the server section
    /// it relays to is configured.
    fn validate_relay(
        &self,
        i: usize,
        subscription: &SubscriptionConfig,
        target: &TargetConfig,
    ) -> Result<(), ConfigError> {
        let key = |field: &str| format!("subscriptions[{i}].target.{field}");
        let bad = |field: &str, value: &dyn fmt::Display, reason: &str| {
            ConfigError::invalid(key(field), Some(format!("{:?}", value.to_string())), reason)
        };
        let needs = |section: &str| {
            ConfigError::invalid(
                format!("{section}.url"),
                None,
                format!(
                    "is missing: subscription {:?} (subscriptions[{i}].target) relays to {}; \
                     add a [{section}] section with the server's url",
                    subscription.name,
                    target.kind()
                ),
            )
        };
        match target {
            TargetConfig::Webhook(_) => {}
            TargetConfig::RedisStream(redis) => {
                stream_template(&redis.stream)
                    .map_err(|reason| bad("stream", &redis.stream, &reason))?;
                if redis.maxlen == Some(0) {
                    return Err(bad(
                        "maxlen",
                        &0,
                        "must be at least 1 (leave it out to never trim)",
                    ));
                }
                if let Some(ttl) = redis.dedupe_ttl_ms {
                    if ttl > MAX_DEDUPE_TTL_MS {
                        return Err(bad(
                            "dedupe_ttl_ms",
                            &ttl,
                            &format!("must be at most {MAX_DEDUPE_TTL_MS} (1,000 days)"),
                        ));
                    }
                    let horizon = RedeliveryHorizon::of(subscription);
                    if Duration::from_millis(ttl) < horizon.total() {
                        return Err(bad(
                            "dedupe_ttl_ms",
                            &ttl,
                            &format!(
                                "must be at least the subscription's redelivery horizon, {} ms ({horizon}), \
                                 or a message redelivered after its key expired is appended twice",
                                horizon.total().as_millis()
                            ),
                        ));
                    }
                }
                if self.redis.is_none() {
                    return Err(needs("redis"));
                }
            }
            TargetConfig::Nats(nats) => {
                subject_template(&nats.subject)
                    .map_err(|reason| bad("subject", &nats.subject, &reason))?;
                validate_jetstream_name(&nats.stream)
                    .map_err(|reason| bad("stream", &nats.stream, &reason))?;
                if nats.timeout_ms == 0 || nats.timeout_ms > MAX_RELAY_TIMEOUT_MS {
                    return Err(bad(
                        "timeout_ms",
                        &nats.timeout_ms,
                        &format!("must be between 1 and {MAX_RELAY_TIMEOUT_MS}"),
                    ));
                }
                let Some(section) = &self.nats else {
                    return Err(needs("nats"));
                };
                if !(section.url.starts_with("nats://") || section.url.starts_with("tls://")) {
                    return Err(ConfigError::invalid(
                        "nats.url",
                        Some(format!("{:?}", section.url)),
                        format!(
                            "must be a nats:// or tls:// URL for subscription {:?}: \
                             the relay's NATS client does not speak WebSocket",
                            subscription.name
                        ),
                    ));
                }
            }
            TargetConfig::Stream(native) => {
                stream_template(&native.stream)
                    .map_err(|reason| bad("stream", &native.stream, &reason))?;
            }
        }
        Ok(())
    }

    /// Checks `[[stream_subscriptions]]`, naming
    /// `stream_subscriptions[i].key`.
    fn validate_stream_subscriptions(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, value: &dyn fmt::Display, reason: &str| {
            ConfigError::invalid(key, Some(format!("{:?}", value.to_string())), reason)
        };
        // Receipts are kept per (subscription, correlation id) and the
        // correlation id `{name}:{stream}:{entry id}` holds no tenant, so a
        // name may serve a stream name once, whatever the tenant.
        let mut seen = BTreeSet::new();
        for (i, sub) in self.stream_subscriptions.iter().enumerate() {
            let key = |field: &str| format!("stream_subscriptions[{i}].{field}");
            validate_name("name", &sub.name)
                .map_err(|e| bad(&key("name"), &sub.name, &e.reason))?;
            validate_name("tenant", &sub.tenant)
                .map_err(|e| bad(&key("tenant"), &sub.tenant, &e.reason))?;
            // The stream's dead-letter stream, `{stream}.dead`, must be a name too.
            sub.key()
                .and_then(|k| k.dead_letters())
                .map_err(|e| bad(&key("stream"), &sub.stream, &e.reason))?;
            if !seen.insert((sub.name.as_str(), sub.stream.as_str())) {
                return Err(bad(
                    &key("name"),
                    &sub.name,
                    &format!(
                        "another stream subscription with this name reads a stream named {:?}; \
                         a name may read each stream name once (its consumer group and \
                         receipts are keyed by name and stream)",
                        sub.stream
                    ),
                ));
            }
            if let Some(raw) = &sub.redis_key {
                if self.streams.backend != StreamBackendKind::Redis {
                    return Err(bad(
                        &key("redis_key"),
                        raw,
                        "needs [streams] backend = \"redis\"",
                    ));
                }
                courier::redis::validate_raw_key(raw)
                    .map_err(|e| bad(&key("redis_key"), raw, &e.reason))?;
            }
            if let Some(consumer) = &sub.consumer {
                validate_name("consumer", consumer)
                    .map_err(|e| bad(&key("consumer"), consumer, &e.reason))?;
            }
            sub.group_start()
                .map_err(|e| bad(&key("start"), &sub.start, &e.reason))?;
            if sub.batch == 0 || sub.batch > courier::MAX_STREAM_BATCH {
                return Err(bad(
                    &key("batch"),
                    &sub.batch,
                    &format!("must be between 1 and {}", courier::MAX_STREAM_BATCH),
                ));
            }
            let max_block = millis(courier::MAX_STREAM_BLOCK);
            if sub.block_ms == 0 || sub.block_ms > max_block {
                return Err(bad(
                    &key("block_ms"),
                    &sub.block_ms,
                    &format!("must be between 1 and {max_block}"),
                ));
            }
            for (field, value) in [
                ("min_idle_ms", sub.min_idle_ms),
                ("claim_interval_ms", sub.claim_interval_ms),
                ("defer_min_ms", sub.defer_min_ms),
                ("defer_max_ms", sub.defer_max_ms),
                ("handler_timeout_ms", sub.handler_timeout_ms),
            ] {
                if value == 0 || value > MAX_STREAM_SETTING_MS {
                    return Err(bad(
                        &key(field),
                        &value,
                        &format!("must be between 1 and {MAX_STREAM_SETTING_MS} (one day)"),
                    ));
                }
            }
            if sub.defer_min_ms > sub.defer_max_ms {
                return Err(bad(
                    &key("defer_min_ms"),
                    &sub.defer_min_ms,
                    &format!("must be at most defer_max_ms ({})", sub.defer_max_ms),
                ));
            }
            if sub.max_deliveries == 0 {
                return Err(bad(
                    &key("max_deliveries"),
                    &sub.max_deliveries,
                    "must be at least 1",
                ));
            }
            if sub.concurrency == 0 || sub.concurrency > MAX_CONCURRENCY {
                return Err(bad(
                    &key("concurrency"),
                    &sub.concurrency,
                    &format!("must be between 1 and {MAX_CONCURRENCY}"),
                ));
            }
            match &sub.target {
                StreamTargetConfig::Webhook(webhook) => {
                    validate_webhook(&key("target"), &sub.name, webhook)?;
                    if webhook.format != WebhookFormat::Raw {
                        return Err(bad(
                            &key("target.format"),
                            &webhook.format.name(),
                            "must be \"raw\": a stream entry has no topic or event time to put in an envelope",
                        ));
                    }
                }
            }
            // The engine's own checks, should they ever be stricter.
            sub.engine_config(self.shutdown_timeout())
                .map_err(|e| ConfigError::invalid(key(e.field), None, e.reason))?;
        }
        Ok(())
    }

    /// Which database `database_url` names.
    pub fn database(&self) -> Result<DatabaseKind, ConfigError> {
        let url = self.database_url.trim();
        let bad =
            |reason: &str| ConfigError::invalid("database_url", Some(format!("{url:?}")), reason);
        if url.is_empty() {
            return Err(bad("must not be empty"));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseKind::Postgres(url.to_owned()));
        }
        if url.starts_with("sqlite:") {
            return Ok(DatabaseKind::Sqlite(url.to_owned()));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(bad(&format!(
                "unsupported scheme {scheme:?}: use postgres://, postgresql://, sqlite: or a file path"
            )));
        }
        Ok(DatabaseKind::Sqlite(url.to_owned()))
    }

    /// How long shutdown waits for in-flight deliveries.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }
}

/// Checks the webhook target of `subscription` at `key`
/// (`subscriptions[0].target`).
fn validate_webhook(
    key: &str,
    subscription: &str,
    webhook: &WebhookConfig,
) -> Result<(), ConfigError> {
    let bad = |field: &str, value: &dyn fmt::Display, reason: &str| {
        ConfigError::invalid(
            format!("{key}.{field}"),
            Some(format!("{:?}", value.to_string())),
            reason,
        )
    };
    match reqwest::Url::parse(&webhook.url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
        Ok(_) => {
            return Err(bad(
                "url",
                &webhook.url,
                "must be an http:// or https:// URL with a host",
            ))
        }
        Err(e) => return Err(bad("url", &webhook.url, &format!("is not a URL: {e}"))),
    }
    webhook.signing_keys().map_err(|e| {
        ConfigError::invalid(
            format!("{key}.{}", e.field),
            None,
            format!(
                "the webhook secret of subscription {subscription} {}",
                e.reason
            ),
        )
    })?;
    if webhook.timeout_ms == 0 || webhook.timeout_ms > MAX_WEBHOOK_TIMEOUT_MS {
        return Err(bad(
            "timeout_ms",
            &webhook.timeout_ms,
            &format!("must be between 1 and {MAX_WEBHOOK_TIMEOUT_MS}"),
        ));
    }
    Ok(())
}

/// Decodes a hex SHA-256 digest (64 hex digits, any case).
pub(crate) fn decode_sha256(text: &str) -> Result<[u8; 32], String> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut hash).map_err(|e| {
        format!(
            "must be the 64 hex digits of a SHA-256 digest (printf %s \"$TOKEN\" | sha256sum): {e}"
        )
    })?;
    Ok(hash)
}

fn validate_tenants(key: &str, tenants: &[String], wildcard: bool) -> Result<(), ConfigError> {
    if tenants.is_empty() {
        return Err(ConfigError::invalid(
            key,
            Some("[]".into()),
            if wildcard {
                "must name at least one tenant, or [\"*\"] for all"
            } else {
                "must name at least one tenant (leave the key out for all)"
            },
        ));
    }
    for (j, tenant) in tenants.iter().enumerate() {
        if tenant == "*" {
            if !wildcard {
                return Err(ConfigError::invalid(
                    format!("{key}[{j}]"),
                    Some("\"*\"".into()),
                    "a subscription takes every tenant when `tenants` is left out; `*` is not a tenant",
                ));
            }
            if tenants.len() > 1 {
                return Err(ConfigError::invalid(
                    format!("{key}[{j}]"),
                    Some("\"*\"".into()),
                    "`*` means every tenant and must stand alone",
                ));
            }
            continue;
        }
        validate_name("tenant", tenant).map_err(|e| {
            ConfigError::invalid(format!("{key}[{j}]"), Some(format!("{tenant:?}")), e.reason)
        })?;
    }
    Ok(())
}

/// Checks a subscription's topic pattern: an exact topic, `prefix.*`, or `*`.
pub fn validate_topic_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let (name, what) = match pattern.strip_suffix(".*") {
        Some(prefix) => (prefix, "the prefix before `.*`"),
        None => (pattern, "the topic"),
    };
    validate_name("topic", name).map_err(|e| {
        format!(
            "{what} {}; a pattern is an exact topic, `prefix.*` or `*`",
            e.reason
        )
    })
}

/// Checks a retry policy at `at` (`subscriptions[0].retry`).
fn validate_retry(at: &str, retry: RetryConfig) -> Result<(), ConfigError> {
    let bad = |key: &str, value: &dyn fmt::Display, reason: &str| {
        ConfigError::invalid(key, Some(format!("{:?}", value.to_string())), reason)
    };
    if retry.max_attempts < 1 {
        return Err(bad(
            &format!("{at}.max_attempts"),
            &retry.max_attempts,
            "must be at least 1",
        ));
    }
    if retry.base_ms == 0 {
        return Err(bad(
            &format!("{at}.base_ms"),
            &retry.base_ms,
            "must be above 0",
        ));
    }
    if retry.cap_ms < retry.base_ms {
        return Err(bad(
            &format!("{at}.cap_ms"),
            &retry.cap_ms,
            &format!("must be at least base_ms ({})", retry.base_ms),
        ));
    }
    if retry.cap_ms > MAX_RETRY_CAP_MS {
        return Err(bad(
            &format!("{at}.cap_ms"),
            &retry.cap_ms,
            &format!("must be at most {MAX_RETRY_CAP_MS} (365 days)"),
        ));
    }
    Ok(())
}

/// The longest retry delay a policy may set: 365 days.
pub const MAX_RETRY_CAP_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// The longest a relay's Redis dedupe keys may live: 1,000 days, more than
/// twice the longest redelivery horizon (a retry cap of
/// [`MAX_RETRY_CAP_MS`]), and a time to live Redis takes.
pub const MAX_DEDUPE_TTL_MS: u64 = 1000 * 24 * 60 * 60 * 1000;

/// Where each key set from the environment came from: key path → variable.
type Origins = HashMap<String, String>;

fn apply_env(
    root: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Origins, ConfigError> {
    let mut entries: Vec<(Vec<String>, String, String)> = env
        .into_iter()
        .filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            if ENV_NOT_KEYS.contains(&rest) {
                return None;
            }
            let segments = rest.split("__").map(str::to_ascii_lowercase).collect();
            Some((segments, name, value))
        })
        .collect();
    // Natural order, so index 2 is set before index 10.
    entries.sort_by(|a, b| {
        let key = |segments: &[String]| {
            segments
                .iter()
                .map(|s| (s.parse::<usize>().ok(), s.clone()))
                .collect::<Vec<_>>()
        };
        key(&a.0).cmp(&key(&b.0))
    });
    let mut origins = Origins::new();
    for (segments, variable, value) in entries {
        let key = path_text(&segments);
        let bad = |reason: &str| {
            ConfigError::invalid(format!("{key} (from {variable})"), None, reason.to_owned())
        };
        if segments.iter().any(String::is_empty) {
            return Err(bad("has an empty segment (levels are joined by `__`)"));
        }
        let mut tree = toml::Value::Table(std::mem::take(root));
        let result = set_path(&mut tree, &segments, parse_env_value(&value));
        if let toml::Value::Table(table) = tree {
            *root = table;
        }
        result.map_err(|reason| bad(&reason))?;
        origins.insert(key, variable);
    }
    Ok(origins)
}

/// Sets `segments` (names, or list indices as numbers) under `slot` to `value`,
/// creating tables and list entries on the way.
fn set_path(slot: &mut toml::Value, segments: &[String], value: toml::Value) -> Result<(), String> {
    let Some((segment, rest)) = segments.split_first() else {
        *slot = value;
        return Ok(());
    };
    if let Ok(index) = segment.parse::<usize>() {
        if !slot.is_array() {
            *slot = toml::Value::Array(Vec::new());
        }
        let toml::Value::Array(array) = slot else {
            return Err("cannot be set here".into());
        };
        if index == array.len() {
            array.push(toml::Value::Table(toml::Table::new()));
        }
        let length = array.len();
        let entry = array
            .get_mut(index)
            .ok_or_else(|| format!("list index {index} skips entries (the list has {length})"))?;
        set_path(entry, rest, value)
    } else {
        if !slot.is_table() {
            *slot = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(table) = slot else {
            return Err("cannot be set here".into());
        };
        let entry = table
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        set_path(entry, rest, value)
    }
}

fn parse_env_value(raw: &str) -> toml::Value {
    if let Ok(mut table) = toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        if table.len() == 1 {
            if let Some(value) = table.remove("v") {
                if matches!(
                    value,
                    toml::Value::Integer(_)
                        | toml::Value::Float(_)
                        | toml::Value::Boolean(_)
                        | toml::Value::Array(_)
                        | toml::Value::String(_)
                ) {
                    return value;
                }
            }
        }
    }
    toml::Value::String(raw.to_owned())
}

fn path_text(segments: &[String]) -> String {
    let mut text = String::new();
    for segment in segments {
        if segment.parse::<usize>().is_ok() {
            text.push_str(&format!("[{segment}]"));
        } else {
            if !text.is_empty() {
                text.push('.');
            }
            text.push_str(segment);
        }
    }
    text
}

fn deserialize_error(
    root: &toml::Value,
    origins: &Origins,
    error: serde_path_to_error::Error<toml::de::Error>,
) -> ConfigError {
    let mut segments = Vec::new();
    let mut value = Some(root);
    for segment in error.path().iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => {
                segments.push(index.to_string());
                value = value.and_then(|v| v.get(*index));
            }
            serde_path_to_error::Segment::Map { key } => {
                segments.push(key.clone());
                value = value.and_then(|v| v.get(key.as_str()));
            }
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let message = error.inner().message().to_owned();
    // "unknown field `x`, expected …" and "missing field `x`" concern a
    // child of the path serde reports.
    let child = ["unknown field `", "missing field `", "unknown variant `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next())
        .map(str::to_owned);
    let mut shown_value = value.filter(|_| !is_secret(&segments)).map(toml_display);
    if message.starts_with("unknown field `") || message.starts_with("missing field `") {
        if let Some(child) = child {
            if segments.last() != Some(&child) {
                segments.push(child);
            }
        }
        shown_value = None;
    }
    let key = path_text(&segments);
    let key = if key.is_empty() {
        "(root)".to_owned()
    } else {
        key
    };
    with_origin(ConfigError::invalid(key, shown_value, message), origins)
}

fn is_secret(segments: &[String]) -> bool {
    segments.iter().any(|s| s == "secret" || s == "secrets")
}

fn toml_display(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn with_origin(error: ConfigError, origins: &Origins) -> ConfigError {
    match error {
        ConfigError::Invalid { key, value, reason } => {
            let origin = origins
                .iter()
                .filter(|(path, _)| {
                    key == **path
                        || key.starts_with(&format!("{path}."))
                        || key.starts_with(&format!("{path}["))
                })
                .max_by_key(|(path, _)| path.len())
                .map(|(_, variable)| variable.clone());
            let key = match origin {
                Some(variable) if !key.contains(" (from ") => format!("{key} (from {variable})"),
                _ => key,
            };
            ConfigError::Invalid {
                key,
                value: value.map(|v| redact_urls(&v)),
                reason,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_subscription_made_in_code_has_the_config_file_defaults() {
        let text = "[[subscriptions]]\nname = \"to-native\"\ntopics = [\"order.*\"]\n\
                    [subscriptions.target]\ntype = \"stream\"\nstream = \"events\"\n";
        let config = Config::from_sources(Some(text), None, Vec::new()).unwrap();
        let made = SubscriptionConfig::new(
            "to-native",
            vec!["order.*".into()],
            TargetConfig::Stream(NativeStreamTargetConfig {
                stream: "events".into(),
            }),
        );
        assert_eq!(config.subscriptions, vec![made]);
    }

    #[test]
    fn the_otel_endpoint_is_checked_and_named_when_refused() {
        for bad in [
            "127.0.0.1:4318",
            "ftp://collector:4318",
            "http://",
            "http://collector:4318/?token=1",
            "not a url",
        ] {
            let text = format!("[otel]\nendpoint = {bad:?}\n");
            let error = Config::from_toml_str(&text).unwrap_err();
            assert_eq!(error.key(), Some("otel.endpoint"), "{bad}: {error}");
            assert!(error.to_string().contains("base URL"), "{bad}: {error}");
        }
        let from_env = Config::from_sources(
            None,
            None,
            env(&[("COURIER_OTEL__ENDPOINT", "collector:4318")]),
        )
        .unwrap_err();
        assert!(
            from_env.key().is_some_and(
                |key| key.contains("otel.endpoint") && key.contains("COURIER_OTEL__ENDPOINT")
            ),
            "{from_env}"
        );
        let empty_name = Config::from_toml_str(
            "[otel]\nendpoint = \"http://127.0.0.1:4318\"\nservice_name = \" \"\n",
        )
        .unwrap_err();
        assert_eq!(empty_name.key(), Some("otel.service_name"));

        let good = Config::from_toml_str("[otel]\nendpoint = \"http://127.0.0.1:4318/\"\n");
        if cfg!(feature = "otel") {
            let otel = good.unwrap().otel.unwrap();
            assert_eq!(otel.traces_url(), "http://127.0.0.1:4318/v1/traces");
            assert_eq!(otel.service_name, DEFAULT_OTEL_SERVICE_NAME);
        } else {
            // A build that cannot export refuses the key instead of ignoring it.
            let error = good.unwrap_err();
            assert_eq!(error.key(), Some("otel.endpoint"));
            assert!(error.to_string().contains("without the `otel` feature"));
        }
    }

    #[test]
    fn defaults_are_sqlite_on_loopback() {
        let config = Config::from_sources(None, None, Vec::new()).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(
            config.database().unwrap(),
            DatabaseKind::Sqlite("./courier.db".into())
        );
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn environment_overrides_the_file() {
        let text = "listen = \"127.0.0.1:9000\"\nmax_payload_bytes = 1000\n";
        let config = Config::from_sources(
            Some(text),
            None,
            env(&[
                ("COURIER_LISTEN", "127.0.0.1:9001"),
                ("COURIER_MAX_PAYLOAD_BYTES", "2048"),
                ("COURIER_DATABASE_URL", "postgres://u@h/db"),
                ("COURIER_CONFIG", "/ignored.toml"),
                ("HOME", "/root"),
            ]),
        )
        .unwrap();
        assert_eq!(config.listen.port(), 9001);
        assert_eq!(config.max_payload_bytes, 2048);
        assert_eq!(
            config.database().unwrap(),
            DatabaseKind::Postgres("postgres://u@h/db".into())
        );
    }

    #[test]
    fn nested_keys_and_list_entries_come_from_the_environment() {
        let text = r#"
            [[subscriptions]]
            name = "hooks"
            topics = ["invoice.*"]
            target = { type = "webhook", url = "http://127.0.0.1:1/a", secret = "a-test-secret-of-24-bytes" }
        "#;
        let config = Config::from_sources(
            Some(text),
            None,
            env(&[
                (
                    "COURIER_SUBSCRIPTIONS__0__TARGET__URL",
                    "http://127.0.0.1:2/b",
                ),
                ("COURIER_SUBSCRIPTIONS__0__RETRY__MAX_ATTEMPTS", "3"),
                ("COURIER_TOKENS__0__NAME", "ci"),
                ("COURIER_TOKENS__0__SHA256", HASH),
                ("COURIER_TOKENS__0__TENANTS", "[\"*\"]"),
                ("COURIER_TOKENS__0__ROLES", "[\"publish\"]"),
            ]),
        )
        .unwrap();
        let TargetConfig::Webhook(webhook) = &config.subscriptions[0].target else {
            panic!("not a webhook: {:?}", config.subscriptions[0].target);
        };
        assert_eq!(webhook.url, "http://127.0.0.1:2/b");
        assert_eq!(config.subscriptions[0].retry.max_attempts, 3);
        assert_eq!(config.tokens[0].roles, vec![Role::Publish]);
    }

    #[test]
    fn a_subscription_s_replay_is_checked_when_the_config_loads() {
        let with = |replay: &str| {
            format!(
                r#"
                [[subscriptions]]
                name = "hooks"
                topics = ["invoice.*"]
                replay = "{replay}"
                target = {{ type = "webhook", url = "http://127.0.0.1:1/a", secret = "a-test-secret-of-24-bytes" }}
            "#
            )
        };
        for good in [
            "all",
            "2026-12-01T10:00:00Z",
            "01938e9c-7a2b-7c3d-8e4f-0123456789ab",
        ] {
            let config = Config::from_sources(Some(&with(good)), None, Vec::new()).unwrap();
            assert_eq!(config.subscriptions[0].replay.as_deref(), Some(good));
        }
        let err = Config::from_sources(Some(&with("yesterday")), None, Vec::new()).unwrap_err();
        assert_eq!(err.key(), Some("subscriptions[0].replay"), "{err}");
        assert!(err.to_string().contains("RFC 3339"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::from_toml_str("listne = \"x\"").unwrap_err();
        assert_eq!(err.key(), Some("listne"), "{err}");
        let err = Config::from_sources(None, None, env(&[("COURIER_LISTNE", "x")])).unwrap_err();
        assert_eq!(err.key(), Some("listne (from COURIER_LISTNE)"), "{err}");
        let text = r#"
            [[subscriptions]]
            name = "hooks"
            topics = ["a"]
            target = { type = "webhook", url = "http://127.0.0.1:1/", secret = "a-test-secret-of-24-bytes", tiemout_ms = 1 }
        "#;
        let err = Config::from_toml_str(text).unwrap_err();
        assert!(err.to_string().contains("tiemout_ms"), "{err}");
        assert!(err.to_string().contains("subscriptions[0].target"), "{err}");
    }

    #[test]
    fn bad_values_name_key_value_and_reason() {
        let cases: &[(&str, &str, &str)] = &[
            ("listen = \"nowhere\"", "listen", "nowhere"),
            ("max_payload_bytes = 0", "max_payload_bytes", "0"),
            ("max_payload_bytes = \"big\"", "max_payload_bytes", "big"),
            (
                "max_payload_bytes = 2000000",
                "max_payload_bytes",
                "2000000",
            ),
            ("log_format = \"xml\"", "log_format", "xml"),
            ("schema = \"Bad-Schema\"", "schema", "Bad-Schema"),
            ("database_url = \"mysql://x\"", "database_url", "mysql://x"),
            ("listen = \"0.0.0.0:7070\"", "listen", "0.0.0.0:7070"),
        ];
        for (text, key, value) in cases {
            let err = Config::from_toml_str(text).unwrap_err();
            assert_eq!(err.key(), Some(*key), "{text}: {err}");
            assert!(err.to_string().contains(value), "{text}: {err}");
        }
    }

    #[test]
    fn non_loopback_needs_tokens() {
        let err = Config::from_toml_str("listen = \"0.0.0.0:7070\"").unwrap_err();
        assert!(err.to_string().contains("without [[tokens]]"), "{err}");
        let text = format!(
            "listen = \"0.0.0.0:7070\"\n[[tokens]]\nname = \"a\"\nsha256 = \"{HASH}\"\ntenants = [\"*\"]\nroles = [\"admin\"]\n"
        );
        assert!(Config::from_toml_str(&text).is_ok());
    }

    #[test]
    fn token_and_subscription_values_are_checked() {
        let token = |body: &str| format!("[[tokens]]\n{body}\n");
        let cases = [
            (
                token("name = \"a\"\nsha256 = \"xyz\"\ntenants = [\"*\"]\nroles = [\"read\"]"),
                "tokens[0].sha256",
            ),
            (
                token(&format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenants = [\"*\", \"b\"]\nroles = [\"read\"]")),
                "tokens[0].tenants[0]",
            ),
            (
                token(&format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenants = [\"a:b\"]\nroles = [\"read\"]")),
                "tokens[0].tenants[0]",
            ),
            (
                token(&format!("name = \"a\"\nsha256 = \"{HASH}\"\ntenants = [\"a\"]\nroles = [\"root\"]")),
                "tokens[0].roles[0]",
            ),
        ];
        for (text, key) in cases {
            let err = Config::from_toml_str(&text).unwrap_err();
            assert_eq!(err.key(), Some(key), "{text}: {err}");
        }
        let subscription = |topics: &str, extra: &str, target: &str| {
            format!("[[subscriptions]]\nname = \"s\"\ntopics = {topics}\n{extra}\n[subscriptions.target]\ntype = \"webhook\"\n{target}\n")
        };
        let ok_target =
            "url = \"http://127.0.0.1:1/\"\nsecret = \"whsec_YSAyNCBieXRlIHNpZ25pbmcgc2VjcmV0\"";
        let cases = [
            (
                subscription("[\"a b\"]", "", ok_target),
                "subscriptions[0].topics[0]",
            ),
            (subscription("[]", "", ok_target), "subscriptions[0].topics"),
            (
                subscription(
                    "[\"a\"]",
                    "topic_retry = { b = { max_attempts = 2 } }",
                    ok_target,
                ),
                "subscriptions[0].topic_retry.\"b\"",
            ),
            (
                subscription(
                    "[\"a.*\"]",
                    "topic_retry = { \"a.b\" = { max_attempts = 0 } }",
                    ok_target,
                ),
                "subscriptions[0].topic_retry.\"a.b\".max_attempts",
            ),
            (
                subscription(
                    "[\"a\"]",
                    "retry = { cap_ms = 9223372036854775807 }",
                    ok_target,
                ),
                "subscriptions[0].retry.cap_ms",
            ),
            (
                subscription(
                    "[\"a.*\"]",
                    "topic_retry = { \"a.b\" = { cap_ms = 31536000001 } }",
                    ok_target,
                ),
                "subscriptions[0].topic_retry.\"a.b\".cap_ms",
            ),
            (
                subscription("[\"a\"]", "versions = []", ok_target),
                "subscriptions[0].versions",
            ),
            (
                subscription("[\"a\"]", "versions = [1, 0]", ok_target),
                "subscriptions[0].versions[1]",
            ),
            (
                subscription("[\"a\"]", "versions = [2, 2]", ok_target),
                "subscriptions[0].versions[1]",
            ),
            (
                subscription("[\"a\"]", "concurrency = 0", ok_target),
                "subscriptions[0].concurrency",
            ),
            (
                subscription("[\"a\"]", "retry = { max_attempts = 0 }", ok_target),
                "subscriptions[0].retry.max_attempts",
            ),
            (
                subscription("[\"a\"]", "", "url = \"ftp://x/\"\nsecret = \"s\""),
                "subscriptions[0].target.url",
            ),
            (
                subscription("[\"a\"]", "", "url = \"http://x/\"\nsecret = \"whsec_!!\""),
                "subscriptions[0].target.secret",
            ),
            (
                subscription(
                    "[\"a\"]",
                    "",
                    "url = \"http://x/\"\nsecret = \"23 bytes is too short!!\"",
                ),
                "subscriptions[0].target.secret",
            ),
            (
                subscription(
                    "[\"a\"]",
                    "",
                    "url = \"http://x/\"\nsecret = \"whsec_c2VjcmV0\"",
                ),
                "subscriptions[0].target.secret",
            ),
            (
                subscription(
                    "[\"a\"]",
                    "",
                    "url = \"http://x/\"\nsecrets = [\"a-test-secret-of-24-bytes\", \"short\"]",
                ),
                "subscriptions[0].target.secrets[1]",
            ),
            (
                subscription("[\"a\"]", "", "url = \"http://x/\""),
                "subscriptions[0].target.secret",
            ),
        ];
        for (text, key) in cases {
            let err = Config::from_toml_str(&text).unwrap_err();
            assert_eq!(err.key(), Some(key), "{text}: {err}");
        }
        let ok = subscription(
            "[\"invoice.*\", \"*\", \"a\"]",
            "tenants = [\"acme\"]",
            ok_target,
        );
        let config = Config::from_toml_str(&ok).unwrap();
        let TargetConfig::Webhook(webhook) = &config.subscriptions[0].target else {
            panic!("not a webhook: {:?}", config.subscriptions[0].target);
        };
        assert_eq!(
            webhook.signing_keys().unwrap(),
            [b"a 24 byte signing secret".to_vec()]
        );
        let both = subscription(
            "[\"a\"]",
            "",
            "url = \"http://x/\"\nsecret = \"whsec_YSAyNCBieXRlIHNpZ25pbmcgc2VjcmV0\"\nsecrets = [\"a-test-secret-of-24-bytes\"]",
        );
        let config = Config::from_toml_str(&both).unwrap();
        let TargetConfig::Webhook(webhook) = &config.subscriptions[0].target else {
            panic!("not a webhook: {:?}", config.subscriptions[0].target);
        };
        assert_eq!(
            webhook.signing_keys().unwrap(),
            [
                b"a 24 byte signing secret".to_vec(),
                b"a-test-secret-of-24-bytes".to_vec()
            ]
        );
        assert_eq!(webhook.timeout_ms, DEFAULT_WEBHOOK_TIMEOUT_MS);
    }

    #[test]
    fn relay_targets_are_checked_when_the_config_loads() {
        let with = |sections: &str, target: &str| {
            format!(
                "{sections}\n[[subscriptions]]\nname = \"relay\"\ntopics = [\"order.*\"]\n[subscriptions.target]\n{target}\n"
            )
        };
        let redis = "[redis]\nurl = \"redis://127.0.0.1:6379\"\nkey_prefix = \"c:\"";
        let nats = "[nats]\nurl = \"nats://127.0.0.1:4222\"";
        let cases = [
            // The server section a relay needs, named by its key.
            (
                with("", "type = \"redis_stream\"\nstream = \"{topic}\""),
                "redis.url",
                "relay",
            ),
            (
                with(
                    "",
                    "type = \"nats\"\nsubject = \"a.{topic}\"\nstream = \"A\"",
                ),
                "nats.url",
                "relay",
            ),
            (
                with(
                    "[nats]\nurl = \"ws://127.0.0.1:80\"",
                    "type = \"nats\"\nsubject = \"a.{topic}\"\nstream = \"A\"",
                ),
                "nats.url",
                "WebSocket",
            ),
            // Templates that cannot render a valid name.
            (
                with(redis, "type = \"redis_stream\"\nstream = \"a:{topic}\""),
                "subscriptions[0].target.stream",
                "a:sample",
            ),
            (
                with(redis, "type = \"redis_stream\"\nstream = \"{tenants}\""),
                "subscriptions[0].target.stream",
                "placeholders",
            ),
            (
                with("", "type = \"stream\"\nstream = \".{topic}\""),
                "subscriptions[0].target.stream",
                "rendered from",
            ),
            (
                with(
                    nats,
                    "type = \"nats\"\nsubject = \"a..{topic}\"\nstream = \"A\"",
                ),
                "subscriptions[0].target.subject",
                "empty token",
            ),
            (
                with(
                    nats,
                    "type = \"nats\"\nsubject = \"a.*.{topic}\"\nstream = \"A\"",
                ),
                "subscriptions[0].target.subject",
                "wildcards",
            ),
            (
                with(
                    nats,
                    "type = \"nats\"\nsubject = \"a.{topic}\"\nstream = \"A.B\"",
                ),
                "subscriptions[0].target.stream",
                "JetStream stream name",
            ),
            // Numbers out of range.
            (
                with(
                    redis,
                    "type = \"redis_stream\"\nstream = \"{topic}\"\nmaxlen = 0",
                ),
                "subscriptions[0].target.maxlen",
                "at least 1",
            ),
            (
                with(
                    redis,
                    "type = \"redis_stream\"\nstream = \"{topic}\"\ndedupe_ttl_ms = 60000",
                ),
                "subscriptions[0].target.dedupe_ttl_ms",
                "380000 ms",
            ),
            // A topic's own retry cap is the one its deliveries wait by: the
            // horizon takes the longest (lease 30 s + 3,600 s + 10 rescue
            // intervals of 5 s).
            (
                with(
                    redis,
                    "type = \"redis_stream\"\nstream = \"{topic}\"\ndedupe_ttl_ms = 1000000\n\
                     [subscriptions.topic_retry.\"order.placed\"]\ncap_ms = 3600000",
                ),
                "subscriptions[0].target.dedupe_ttl_ms",
                "3680000 ms",
            ),
            (
                with(
                    redis,
                    "type = \"redis_stream\"\nstream = \"{topic}\"\ndedupe_ttl_ms = 9223372036854775807",
                ),
                "subscriptions[0].target.dedupe_ttl_ms",
                "at most",
            ),
            (
                with(
                    nats,
                    "type = \"nats\"\nsubject = \"a.{topic}\"\nstream = \"A\"\ntimeout_ms = 0",
                ),
                "subscriptions[0].target.timeout_ms",
                "between 1 and",
            ),
        ];
        for (text, key, reason) in cases {
            let err = Config::from_toml_str(&text).unwrap_err();
            assert_eq!(err.key(), Some(key), "{text}: {err}");
            assert!(err.to_string().contains(reason), "{text}: {err}");
        }
        let err = Config::from_toml_str(&with(
            redis,
            "type = \"redis_stream\"\nstream = \"{topic}\"\nmax_len = 5",
        ))
        .unwrap_err();
        assert!(err.to_string().contains("max_len"), "{err}");
        assert_eq!(err.key(), Some("subscriptions[0].target.max_len"), "{err}");
        let err = Config::from_toml_str(&with("", "type = \"kafka\"")).unwrap_err();
        assert!(err.to_string().contains("redis_stream"), "{err}");

        let config = Config::from_toml_str(&with(
            redis,
            "type = \"redis_stream\"\nstream = \"{topic}\"\nmaxlen = 1000000",
        ))
        .unwrap();
        let TargetConfig::RedisStream(target) = &config.subscriptions[0].target else {
            panic!("{:?}", config.subscriptions[0].target);
        };
        assert_eq!(target.maxlen, Some(1_000_000));
        let config = Config::from_toml_str(&with(
            nats,
            "type = \"nats\"\nsubject = \"courier.{tenant}.{topic}\"\nstream = \"ORDERS\"",
        ))
        .unwrap();
        let TargetConfig::Nats(target) = &config.subscriptions[0].target else {
            panic!("{:?}", config.subscriptions[0].target);
        };
        assert_eq!(target.timeout_ms, DEFAULT_RELAY_TIMEOUT_MS);
        assert!(
            Config::from_toml_str(&with("", "type = \"stream\"\nstream = \"{topic}\"")).is_ok()
        );
    }

    #[test]
    fn a_short_secret_is_refused_naming_the_subscription_and_the_field() {
        let text = "[[subscriptions]]\nname = \"billing-hook\"\ntopics = [\"a\"]\ntarget = { type = \"webhook\", url = \"http://x/\", secrets = [\"a-test-secret-of-24-bytes\", \"hunter2\"] }\n";
        let err = Config::from_toml_str(text).unwrap_err();
        assert_eq!(
            err.key(),
            Some("subscriptions[0].target.secrets[1]"),
            "{err}"
        );
        let shown = err.to_string();
        assert!(shown.contains("subscription billing-hook"), "{shown}");
        assert!(shown.contains("7 bytes"), "{shown}");
        assert!(shown.contains("at least 24"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn secrets_are_not_printed() {
        let text = "[[subscriptions]]\nname = \"s\"\ntopics = [\"a\"]\ntarget = { type = \"webhook\", url = \"http://x/\", secret = \"hunter2-hunter2-hunter2-hunter2\" }\n";
        let config = Config::from_toml_str(text).unwrap();
        assert!(!format!("{config:?}").contains("hunter2-hunter2-hunter2-hunter2"));
    }

    const STREAM_SUBSCRIPTION: &str = r#"
        [[stream_subscriptions]]
        name = "billing"
        tenant = "acme"
        stream = "orders"
        target = { type = "webhook", url = "http://127.0.0.1:1/a", secret = "a-test-secret-of-24-bytes" }
    "#;

    #[test]
    fn stream_subscriptions_take_the_engine_defaults() {
        let config = Config::from_toml_str(STREAM_SUBSCRIPTION).unwrap();
        let sub = &config.stream_subscriptions[0];
        assert_eq!(sub.start, "end");
        assert_eq!(sub.min_idle_ms, 30_000);
        assert_eq!(sub.claim_interval_ms, 10_000);
        assert_eq!(sub.max_deliveries, 10);
        assert_eq!((sub.defer_min_ms, sub.defer_max_ms), (1_000, 60_000));
        let engine = sub.engine_config(config.shutdown_timeout()).unwrap();
        assert_eq!(engine.name, "billing");
        assert_eq!(engine.key.to_string(), "acme/orders");
        assert_eq!(engine.start, courier::GroupStart::End);
        assert_eq!(engine.batch, courier::DEFAULT_STREAM_BATCH);
        assert_eq!(engine.block, courier::DEFAULT_STREAM_BLOCK);
        assert_eq!(engine.min_idle, courier::DEFAULT_MIN_IDLE);
        assert_eq!(
            engine.handler_timeout,
            Some(courier::DEFAULT_HANDLER_TIMEOUT)
        );
        assert_eq!(engine.consumer, courier::default_consumer("billing"));
    }

    #[test]
    fn every_stream_subscription_key_comes_from_the_environment() {
        let config = Config::from_sources(
            None,
            None,
            env(&[
                ("COURIER_STREAM_SUBSCRIPTIONS__0__NAME", "billing"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__TENANT", "acme"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__STREAM", "orders"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__CONSUMER", "daemon-1"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__START", "beginning"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__BATCH", "7"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__BLOCK_MS", "250"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__MIN_IDLE_MS", "500"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__CLAIM_INTERVAL_MS", "100"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__MAX_DELIVERIES", "3"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__DEFER_MIN_MS", "20"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__DEFER_MAX_MS", "40"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__CONCURRENCY", "4"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__HANDLER_TIMEOUT_MS", "900"),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__TARGET__TYPE", "webhook"),
                (
                    "COURIER_STREAM_SUBSCRIPTIONS__0__TARGET__URL",
                    "http://127.0.0.1:2/b",
                ),
                (
                    "COURIER_STREAM_SUBSCRIPTIONS__0__TARGET__SECRET",
                    "a-test-secret-of-24-bytes",
                ),
                ("COURIER_STREAM_SUBSCRIPTIONS__0__TARGET__TIMEOUT_MS", "800"),
            ]),
        )
        .unwrap();
        let sub = &config.stream_subscriptions[0];
        let engine = sub.engine_config(Duration::from_secs(1)).unwrap();
        assert_eq!(engine.consumer, "daemon-1");
        assert_eq!(engine.start, courier::GroupStart::Beginning);
        assert_eq!(engine.batch, 7);
        assert_eq!(engine.block, Duration::from_millis(250));
        assert_eq!(engine.min_idle, Duration::from_millis(500));
        assert_eq!(engine.claim_interval, Duration::from_millis(100));
        assert_eq!(engine.max_deliveries, 3);
        assert_eq!(engine.defer_min, Duration::from_millis(20));
        assert_eq!(engine.defer_max, Duration::from_millis(40));
        assert_eq!(engine.concurrency, 4);
        assert_eq!(engine.handler_timeout, Some(Duration::from_millis(900)));
        let StreamTargetConfig::Webhook(webhook) = &sub.target;
        assert_eq!(webhook.url, "http://127.0.0.1:2/b");
        assert_eq!(webhook.timeout_ms, 800);
        let err = Config::from_sources(
            Some(STREAM_SUBSCRIPTION),
            None,
            env(&[("COURIER_STREAM_SUBSCRIPTIONS__0__MAX_DELIVERIES", "0")]),
        )
        .unwrap_err();
        assert_eq!(
            err.key(),
            Some("stream_subscriptions[0].max_deliveries (from COURIER_STREAM_SUBSCRIPTIONS__0__MAX_DELIVERIES)"),
            "{err}"
        );
    }

    /// A `[[stream_subscriptions]]` entry with `key = value` set (replacing
    /// the default of `name`, `tenant` or `stream`).
    fn stream_subscription(key: &str, value: &str) -> String {
        let mut lines = vec![
            "[[stream_subscriptions]]".to_owned(),
            "target = { type = \"webhook\", url = \"http://127.0.0.1:1/a\", secret = \"a-test-secret-of-24-bytes\" }"
                .to_owned(),
        ];
        for (name, default) in [
            ("name", "\"billing\""),
            ("tenant", "\"acme\""),
            ("stream", "\"orders\""),
        ] {
            if name != key {
                lines.push(format!("{name} = {default}"));
            }
        }
        lines.push(format!("{key} = {value}"));
        lines.join("\n")
    }

    #[test]
    fn every_stream_subscription_key_is_checked_by_name() {
        let cases: &[(&str, &str)] = &[
            ("name", "\"a:b\""),
            ("tenant", "\"\""),
            ("stream", "\"x y\""),
            ("stream", &format!("\"{}\"", "s".repeat(125))),
            ("consumer", "\"-c\""),
            ("start", "\"middle\""),
            ("batch", "0"),
            ("batch", "10001"),
            ("block_ms", "0"),
            ("block_ms", "30001"),
            ("min_idle_ms", "0"),
            ("claim_interval_ms", "0"),
            ("max_deliveries", "0"),
            ("max_deliveries", "-1"),
            ("defer_min_ms", "0"),
            ("defer_min_ms", "70000"),
            ("defer_max_ms", "86400001"),
            ("concurrency", "0"),
            ("handler_timeout_ms", "0"),
            ("colour", "1"),
        ];
        for (key, value) in cases {
            let text = stream_subscription(key, value);
            let err = Config::from_toml_str(&text).unwrap_err();
            let expected = format!("stream_subscriptions[0].{key}");
            assert_eq!(err.key(), Some(expected.as_str()), "{key} = {value}: {err}");
        }
        let text = STREAM_SUBSCRIPTION.replace("http://127.0.0.1:1/a", "ftp://x/");
        let err = Config::from_toml_str(&text).unwrap_err();
        assert_eq!(
            err.key(),
            Some("stream_subscriptions[0].target.url"),
            "{err}"
        );
        let text = STREAM_SUBSCRIPTION.replace("type = \"webhook\"", "type = \"pigeon\"");
        let err = Config::from_toml_str(&text).unwrap_err();
        assert!(
            err.to_string().contains("stream_subscriptions[0].target"),
            "{err}"
        );
        let text = STREAM_SUBSCRIPTION.replace(
            "type = \"webhook\"",
            "type = \"webhook\", format = \"envelope\"",
        );
        let err = Config::from_toml_str(&text).unwrap_err();
        assert_eq!(
            err.key(),
            Some("stream_subscriptions[0].target.format"),
            "{err}"
        );
    }

    #[test]
    fn a_stream_subscription_name_reads_each_stream_name_once() {
        let other_tenant = STREAM_SUBSCRIPTION.replace("\"acme\"", "\"globex\"");
        let text = format!("{STREAM_SUBSCRIPTION}{other_tenant}");
        let err = Config::from_toml_str(&text).unwrap_err();
        assert_eq!(err.key(), Some("stream_subscriptions[1].name"), "{err}");
        let other_stream = STREAM_SUBSCRIPTION.replace("\"orders\"", "\"refunds\"");
        let config =
            Config::from_toml_str(&format!("{STREAM_SUBSCRIPTION}{other_stream}")).unwrap();
        assert_eq!(config.stream_subscriptions.len(), 2);
        let other_name = STREAM_SUBSCRIPTION.replace("\"billing\"", "\"audit\"");
        assert!(Config::from_toml_str(&format!("{STREAM_SUBSCRIPTION}{other_name}")).is_ok());
    }

    #[test]
    fn the_example_file_parses_and_validates() {
        let text = include_str!("../courier.example.toml");
        let config = Config::from_toml_str(text).unwrap();
        assert!(!config.tokens.is_empty());
        assert!(!config.subscriptions.is_empty());
    }
}
