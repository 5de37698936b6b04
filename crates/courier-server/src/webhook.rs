//! The webhook target: a [`Handler`] that POSTs each message as JSON, signed
//! per the Standard Webhooks convention.
//!
//! The body is the payload (`format = "raw"`, the default) or the Standard
//! Webhooks envelope `{"type": <topic>, "timestamp": <occurred_at, RFC 3339>,
//! "data": <payload>}` (`format = "envelope"`).
//!
//! Each request carries `webhook-id` = `{subscription}:{message id}` (the
//! same on every retry of one message to one subscription, so receivers
//! deduplicate on it; two subscriptions of one message send two ids, so a
//! receiver serving both keeps both), `webhook-timestamp` (unix seconds)
//! and `webhook-signature` = `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`
//! — one such entry per configured secret, space-separated, so a receiver
//! moving from one secret to the next accepts the request with either
//! ([`verify`] checks a request as a receiver should) — plus the message's
//! metadata: `courier-tenant`, `courier-topic`, `courier-schema-version`,
//! `courier-ordering-key` (when it has one), `courier-message-id` and
//! `courier-attempt`.
//!
//! The message's own headers (a W3C `traceparent` and `tracestate`, say) are
//! forwarded as HTTP headers, one value per name (names compare without
//! case), except where forwarding could change what the request means: the
//! hop-by-hop and framing headers and those Courier sets itself (see
//! [`RESERVED_HEADERS`]), credentials (`authorization`, `cookie`), and any
//! name starting with `webhook-` (the signature's), `courier-` (Courier's
//! metadata, which a message must not be able to forge) or `proxy-`. A
//! header whose name is not an HTTP token or whose value holds a control
//! character is not forwarded either; the delivery goes ahead without it.
//! When the delivery's span has an OpenTelemetry context (the `otel`
//! feature and a `tracing-opentelemetry` layer, as `[otel] endpoint` sets
//! up), `traceparent` (and `tracestate`) are that span's instead, so the
//! endpoint's span is a child of `courier.deliver` in the producer's trace.
//!
//! Outcomes: 2xx completes the delivery. A 429 or 503 with `Retry-After`
//! (seconds) is the endpoint asking to wait: the subscription is throttled
//! for that long, capped at its retry policy's backoff cap (at least its
//! base): the message snoozes ([`HandlerError::snooze`]: no attempt spent;
//! the engine bounds snoozes by [`courier::MAX_SNOOZES`]), and until the
//! throttle ends no other delivery of the subscription calls the endpoint —
//! each snoozes until then instead, without a request and without spending
//! an attempt. The throttle lives in this process: other daemons serving the
//! subscription learn of it from their own 429. Other 5xx, 408, a 429
//! without `Retry-After`, a connection error or a timeout is a failed attempt
//! retried by the subscription's backoff (after `Retry-After`, capped the
//! same way, when the endpoint sends one). Any other status (redirects are
//! not followed) is permanent: the message is dead-lettered at once. The
//! status and the first 1 KiB of the response body go into the error history.
//! Messages of tenants outside the subscription's `tenants` are completed
//! without a request, throttled or not.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use courier::{truncate_chars, Handler, HandlerError, Message, RetryPolicy};
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use sha2::Sha256;

use crate::config::{
    SubscriptionConfig, TargetConfig, WebhookFormat, DEFAULT_WEBHOOK_TIMEOUT_MS,
    MIN_WEBHOOK_SECRET_BYTES,
};
use crate::metrics::{WEBHOOK_REQUESTS, WEBHOOK_SECONDS};

/// How much of a failed response's body is kept in the error history.
pub const ERROR_BODY_BYTES: usize = 1024;
/// The longest `Retry-After` read from a response; an outbox subscription
/// honours at most its backoff cap (see the module's documentation).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Message header names never forwarded to the endpoint (besides the
/// prefixes `webhook-`, `courier-` and `proxy-`): hop-by-hop and framing
/// headers, those Courier sets itself, and credentials.
pub const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "cookie",
    "expect",
    "host",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
];

/// Header name prefixes never forwarded: the signature's, Courier's own
/// metadata, and proxies'.
const RESERVED_PREFIXES: &[&str] = &["webhook-", "courier-", "proxy-"];

/// Why a webhook handler could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The URL or secret is unusable.
    #[error("webhook of subscription {subscription}: {reason}")]
    Invalid {
        /// The subscription.
        subscription: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built (TLS initialisation).
    #[error("webhook client of subscription {subscription}: {source}")]
    Client {
        /// The subscription.
        subscription: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
}

/// How a [`WebhookHandler`] sends, beside its URL and secrets. The default:
/// [`DEFAULT_WEBHOOK_TIMEOUT_MS`] per request, every tenant, the `raw`
/// format, the default retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WebhookOptions {
    /// How long one request may take.
    pub timeout: Duration,
    /// Only these tenants' messages are sent (the others complete without a
    /// request); `None`: every tenant.
    pub tenants: Option<BTreeSet<String>>,
    /// What the body holds.
    pub format: WebhookFormat,
    /// The subscription's retry policy (give the worker the same one): a
    /// `Retry-After` is honoured up to its cap, and at least its base.
    pub retry: RetryPolicy,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(DEFAULT_WEBHOOK_TIMEOUT_MS),
            tenants: None,
            format: WebhookFormat::Raw,
            retry: RetryPolicy::default(),
        }
    }
}

/// Delivers a subscription's messages to one HTTP endpoint.
#[derive(Clone)]
pub struct WebhookHandler {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    tenants: Option<BTreeSet<String>>,
    format: WebhookFormat,
    retry: RetryPolicy,
    /// Until when the endpoint asked not to be called (429 or 503 with
    /// `Retry-After`); `None` or a past instant: not throttled.
    not_before: Mutex<Option<Instant>>,
}

impl Inner {
    /// How long the endpoint still asks not to be called, if it does.
    fn throttled_for(&self, now: Instant) -> Option<Duration> {
        let not_before = *self
            .not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        not_before
            .and_then(|until| until.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// Throttles the endpoint until `until`, unless it already is for longer.
    fn throttle_until(&self, until: Instant) {
        let mut not_before = self
            .not_before
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if not_before.is_none_or(|current| current < until) {
            *not_before = Some(until);
        }
    }

    /// The `Retry-After` delay honoured: at most the backoff cap, at least
    /// the backoff base (a `Retry-After: 0` must not make a busy loop).
    fn honoured(&self, retry_after: Duration) -> Duration {
        retry_after
            .min(self.retry.cap)
            .max(self.retry.base.min(self.retry.cap))
    }
}

impl std::fmt::Debug for WebhookHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookHandler")
            .field("subscription", &self.inner.endpoint.subscription)
            .field("host", &self.inner.endpoint.url.host_str())
            .field("timeout", &self.inner.endpoint.timeout)
            .finish_non_exhaustive()
    }
}

/// One signed HTTP endpoint, as outbox and stream subscriptions share it:
/// its client, URL, secrets and timeout.
pub(crate) struct Endpoint {
    subscription: String,
    client: reqwest::Client,
    url: reqwest::Url,
    secrets: Vec<Vec<u8>>,
    timeout: Duration,
}

/// Why an endpoint did not take a delivery.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The status it answered, if it answered.
    pub(crate) status: Option<StatusCode>,
    /// Its `Retry-After`, in seconds, if it sent one.
    pub(crate) retry_after: Option<Duration>,
    /// Whether a later delivery may succeed (5xx, 408, 429, a connection
    /// error or a timeout); any other status is permanent.
    pub(crate) retryable: bool,
    /// The status and the start of the body, or the transport error.
    pub(crate) reason: String,
}

impl Refusal {
    /// What happened, without the endpoint's URL or answer body (for
    /// [`crate::outcomes`], which every reader sees).
    pub(crate) fn summary(&self) -> String {
        match self.status {
            Some(status) => format!("the endpoint answered {status}"),
            None => "the endpoint timed out or could not be reached".to_owned(),
        }
    }
}

impl Endpoint {
    /// An endpoint POSTing to `url`, signing with each of `secrets` (at
    /// least one, each at least [`MIN_WEBHOOK_SECRET_BYTES`]), giving each
    /// request `timeout`; redirects are not followed.
    pub(crate) fn new(
        subscription: &str,
        url: reqwest::Url,
        secrets: Vec<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Self, WebhookError> {
        let invalid = |reason: String| WebhookError::Invalid {
            subscription: subscription.to_owned(),
            reason,
        };
        if secrets.is_empty() {
            return Err(invalid("no signing secret".into()));
        }
        if let Some((i, short)) = secrets
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() < MIN_WEBHOOK_SECRET_BYTES)
        {
            return Err(invalid(format!(
                "signing secret {i} is {} bytes; at least {MIN_WEBHOOK_SECRET_BYTES} are required",
                short.len()
            )));
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .user_agent(concat!("courier/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| WebhookError::Client {
                subscription: subscription.to_owned(),
                source,
            })?;
        Ok(Self {
            subscription: subscription.to_owned(),
            client,
            url,
            secrets,
            timeout,
        })
    }

    /// The subscription the endpoint serves.
    pub(crate) fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Counts one request by `outcome` and its duration since `started`.
    pub(crate) fn count(&self, outcome: &'static str, started: Instant) {
        let subscription = self.subscription.clone();
        metrics::counter!(WEBHOOK_REQUESTS, "subscription" => subscription.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(WEBHOOK_SECONDS, "subscription" => subscription)
            .record(started.elapsed().as_secs_f64());
    }

    /// POSTs `body` as JSON with `webhook-id: id`, its timestamp and
    /// signature, and `extra` headers; `Ok` with the status of a 2xx answer.
    pub(crate) async fn post(
        &self,
        id: &str,
        extra: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Result<StatusCode, Refusal>, HandlerError> {
        let timestamp = chrono::Utc::now().timestamp();
        let signature = self
            .secrets
            .iter()
            .map(|secret| sign(secret, id, timestamp, &body))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| HandlerError::permanent("a signing secret is unusable"))?
            .join(" ");
        let mut headers = extra;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("webhook-id", header(id)?);
        headers.insert("webhook-timestamp", header(&timestamp.to_string())?);
        headers.insert("webhook-signature", header(&signature)?);
        let sent = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .headers(headers)
            .body(body)
            .send()
            .await;
        let transport = |reason: String| Refusal {
            status: None,
            retry_after: None,
            retryable: true,
            reason,
        };
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_timeout() => {
                return Ok(Err(transport(format!(
                    "webhook of subscription {} timed out after {} ms",
                    self.subscription,
                    self.timeout.as_millis()
                ))));
            }
            Err(error) => {
                return Ok(Err(transport(format!(
                    "webhook of subscription {} unreachable: {}",
                    self.subscription,
                    transport_reason(error)
                ))));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Ok(status));
        }
        let wait = retry_after(response.headers());
        let text = body_start(response).await;
        Ok(Err(Refusal {
            status: Some(status),
            retry_after: wait,
            retryable: status.is_server_error()
                || status == StatusCode::REQUEST_TIMEOUT
                || status == StatusCode::TOO_MANY_REQUESTS,
            reason: format!(
                "webhook of subscription {} answered {status}: {text}",
                self.subscription
            ),
        }))
    }
}

impl WebhookHandler {
    /// The handler for a configured subscription's webhook target.
    pub fn from_config(subscription: &SubscriptionConfig) -> Result<Self, WebhookError> {
        let invalid = |reason: String| WebhookError::Invalid {
            subscription: subscription.name.clone(),
            reason,
        };
        let TargetConfig::Webhook(webhook) = &subscription.target else {
            return Err(invalid(format!(
                "the target is a {}, not a webhook",
                subscription.target.kind()
            )));
        };
        let url = reqwest::Url::parse(&webhook.url).map_err(|e| invalid(e.to_string()))?;
        let secrets = webhook.signing_keys().map_err(|e| invalid(e.to_string()))?;
        let options = WebhookOptions {
            timeout: Duration::from_millis(webhook.timeout_ms),
            tenants: subscription
                .tenants
                .as_ref()
                .map(|t| t.iter().cloned().collect()),
            format: webhook.format,
            retry: subscription.retry.policy(),
        };
        Self::new(&subscription.name, url, secrets, options)
    }

    /// A handler POSTing to `url`, signing with each of `secrets` (at least
    /// one, each at least [`MIN_WEBHOOK_SECRET_BYTES`] bytes), sending as
    /// `options` say.
    pub fn new(
        subscription: &str,
        url: reqwest::Url,
        secrets: Vec<Vec<u8>>,
        options: WebhookOptions,
    ) -> Result<Self, WebhookError> {
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint: Endpoint::new(subscription, url, secrets, options.timeout)?,
                tenants: options.tenants,
                format: options.format,
                retry: options.retry,
                not_before: Mutex::new(None),
            }),
        })
    }

    fn count(&self, outcome: &'static str, started: Instant) {
        self.inner.endpoint.count(outcome, started);
    }

    /// Sends one signed test request to the endpoint, as a delivery would
    /// be sent but of no message: the body is the envelope `{"type":
    /// "courier.ping", "timestamp", "data": {"subscription"}}` whatever the
    /// format, `webhook-id` is `{subscription}:ping-{uuid}` and
    /// `courier-topic` is `courier.ping`. Nothing is stored, no attempt or
    /// throttle changes, and the endpoint's answer (or why there was none)
    /// is reported, never raised.
    pub async fn ping(&self) -> PingOutcome {
        let endpoint = &self.inner.endpoint;
        let started = Instant::now();
        let body = serde_json::json!({
            "type": PING_TOPIC,
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            "data": {"subscription": endpoint.subscription()},
        })
        .to_string()
        .into_bytes();
        let mut headers = HeaderMap::new();
        headers.insert("courier-topic", HeaderValue::from_static(PING_TOPIC));
        let id = format!("{}:ping-{}", endpoint.subscription(), uuid::Uuid::now_v7());
        let sent = endpoint.post(&id, headers, body).await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match sent {
            Ok(Ok(status)) => PingOutcome {
                webhook_id: id,
                delivered: true,
                status: Some(status.as_u16()),
                duration_ms,
                error: None,
            },
            Ok(Err(refusal)) => PingOutcome {
                webhook_id: id,
                delivered: false,
                status: refusal.status.map(|s| s.as_u16()),
                duration_ms,
                error: Some(refusal.reason),
            },
            Err(error) => PingOutcome {
                webhook_id: id,
                delivered: false,
                status: None,
                duration_ms,
                error: Some(error.to_string()),
            },
        }
    }
}

/// The `courier-topic` (and envelope `type`) of a test ping.
pub const PING_TOPIC: &str = "courier.ping";

/// What a webhook endpoint made of a test ping ([`WebhookHandler::ping`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PingOutcome {
    /// The request's `webhook-id`.
    pub webhook_id: String,
    /// Whether the endpoint answered 2xx.
    pub delivered: bool,
    /// The status it answered, if it answered.
    pub status: Option<u16>,
    /// How long the request took, in milliseconds.
    pub duration_ms: u64,
    /// Why it was not delivered: the status and the start of the body, or
    /// the transport error (naming the subscription, never the URL).
    pub error: Option<String>,
}

/// The `webhook-signature` value for a message: `v1,<base64 HMAC-SHA256>` over
/// `"{id}.{timestamp}.{body}"`.
pub fn sign(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    Some(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    ))
}

/// How far a request's `webhook-timestamp` may be from the receiver's clock,
/// by default, before [`verify`] refuses it (a replayed request): five
/// minutes, as Standard Webhooks libraries use.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Whether a request is authentic and fresh, as a receiver should check it:
/// its `webhook-timestamp` (`timestamp`) lies within `tolerance` of this
/// machine's clock ([`DEFAULT_TOLERANCE`] unless you have reason), and one
/// of the space-separated `v1,<sig>` entries of `signature_header` is the
/// signature of `"{id}.{timestamp}.{body}"` by `secret`, compared in
/// constant time (several entries: the sender signs with each secret it
/// has while secrets rotate). For receivers written in Rust and for tests.
pub fn verify(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
    tolerance: Duration,
) -> bool {
    is_fresh(timestamp, chrono::Utc::now().timestamp(), tolerance)
        && signature_matches(secret, id, timestamp, body, signature_header)
}

/// Whether `timestamp` lies within `tolerance` of `now` (unix seconds), on
/// either side.
fn is_fresh(timestamp: i64, now: i64, tolerance: Duration) -> bool {
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    now.abs_diff(timestamp) <= tolerance.unsigned_abs()
}

/// Whether one entry of `signature_header` is the signature of this
/// request by `secret`.
fn signature_matches(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
) -> bool {
    let Some(expected) = sign(secret, id, timestamp, body) else {
        return false;
    };
    signature_header.split(' ').any(|candidate| {
        use subtle::ConstantTimeEq;
        candidate.len() == expected.len()
            && bool::from(candidate.as_bytes().ct_eq(expected.as_bytes()))
    })
}

/// A transport error's text with its causes, without the URL: reqwest puts
/// the whole URL (credentials, query tokens) in its message, and that text
/// goes to the error history, which every reader of the tenant sees, and to
/// the log. The causes (connect, TLS, I/O errors) name no URL; any URL-shaped
/// text left in them is redacted all the same.
fn transport_reason(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    crate::redact::redact_urls(&reason)
}

pub(crate) fn header(value: &str) -> Result<HeaderValue, HandlerError> {
    HeaderValue::from_str(value)
        .map_err(|e| HandlerError::permanent(format!("cannot send {value:?} as a header: {e}")))
}

/// `Retry-After` in seconds (an HTTP date is not honoured; the backoff applies).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The `webhook-id` of `message`: `{subscription}:{message id}`, as a stream
/// entry's is `{subscription}:{stream}:{entry id}` (`:` never occurs in a
/// name, so no two pairs share an id).
fn webhook_id(message: &Message<crate::RawPayload>) -> String {
    format!("{}:{}", message.subscription, message.id)
}

/// The request body for `message` in `format`: the payload's stored JSON
/// text unchanged, alone or as the envelope's `data`.
fn encode_body(
    format: WebhookFormat,
    message: &Message<crate::RawPayload>,
) -> Result<Vec<u8>, HandlerError> {
    match format {
        WebhookFormat::Raw => Ok(message.payload.get().as_bytes().to_vec()),
        WebhookFormat::Envelope => {
            /// The Standard Webhooks envelope, `data` being the payload's text.
            #[derive(serde::Serialize)]
            struct Envelope<'a> {
                #[serde(rename = "type")]
                kind: &'a str,
                timestamp: String,
                data: &'a serde_json::value::RawValue,
            }
            serde_json::to_vec(&Envelope {
                kind: &message.topic,
                timestamp: message
                    .occurred_at
                    .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                data: &message.payload,
            })
            .map_err(|e| {
                HandlerError::permanent(format!("the payload cannot be encoded as JSON: {e}"))
            })
        }
    }
}

/// The metadata headers of `message`, and those of its own headers that may
/// be forwarded (see the module's documentation).
fn message_headers(message: &Message<crate::RawPayload>) -> Result<HeaderMap, HandlerError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &message.headers {
        let Some((name, value)) = forwardable(name, value) else {
            tracing::debug!(
                subscription = %message.subscription,
                header = %name,
                "message header not forwarded to the webhook"
            );
            continue;
        };
        headers.insert(name, value);
    }
    // With an OpenTelemetry context on the delivery's span (`courier.deliver`,
    // itself the producer's child), the endpoint's span continues from it;
    // otherwise the message's own context, forwarded above, is its parent.
    if let Some(trace) = courier::trace_context::current_trace_headers() {
        headers.insert(courier::TRACEPARENT, header(&trace.traceparent)?);
        match trace
            .tracestate
            .and_then(|state| HeaderValue::from_str(&state).ok())
        {
            Some(state) => headers.insert(courier::TRACESTATE, state),
            None => headers.remove(courier::TRACESTATE),
        };
    }
    headers.insert("courier-tenant", header(&message.tenant)?);
    headers.insert("courier-topic", header(&message.topic)?);
    headers.insert(
        "courier-schema-version",
        header(&message.schema_version.to_string())?,
    );
    if let Some(key) = &message.ordering_key {
        // Validation refused control characters; other UTF-8 goes as bytes.
        let value = HeaderValue::from_bytes(key.as_bytes()).map_err(|e| {
            HandlerError::permanent(format!("cannot send the ordering key as a header: {e}"))
        })?;
        headers.insert("courier-ordering-key", value);
    }
    headers.insert("courier-message-id", header(&message.id.to_string())?);
    headers.insert("courier-attempt", header(&message.attempt.to_string())?);
    Ok(headers)
}

/// A message header as an HTTP header, unless its name is reserved or it
/// cannot be sent as it is.
fn forwardable(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
    let lower = name.as_str();
    if RESERVED_HEADERS.contains(&lower) || RESERVED_PREFIXES.iter().any(|p| lower.starts_with(p)) {
        return None;
    }
    let value = HeaderValue::from_bytes(value.as_bytes()).ok()?;
    Some((name, value))
}

/// The first [`ERROR_BODY_BYTES`] of a response's body, as text.
async fn body_start(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::with_capacity(ERROR_BODY_BYTES);
    while bytes.len() < ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(ERROR_BODY_BYTES);
    let text = String::from_utf8_lossy(&bytes);
    // A cut may split a character; lossy decoding marks it instead of failing.
    truncate_chars(&text, ERROR_BODY_BYTES).to_owned()
}

impl Handler for WebhookHandler {
    type Payload = crate::RawPayload;

    async fn handle(&self, message: Message<crate::RawPayload>) -> Result<(), HandlerError> {
        let inner = &self.inner;
        let started = Instant::now();
        if let Some(tenants) = &inner.tenants {
            if !tenants.contains(&message.tenant) {
                self.count("skipped", started);
                return Ok(());
            }
        }
        if let Some(left) = inner.throttled_for(started) {
            self.count("throttled", started);
            return Err(HandlerError::snooze(
                left,
                format!(
                    "webhook of subscription {} not called: the endpoint asked to wait \
                     (Retry-After) {} ms more",
                    inner.endpoint.subscription,
                    left.as_millis()
                ),
            ));
        }
        let body = encode_body(inner.format, &message)?;
        let headers = message_headers(&message)?;
        let refusal = match inner
            .endpoint
            .post(&webhook_id(&message), headers, body)
            .await?
        {
            Ok(_) => {
                self.count("delivered", started);
                crate::outcomes::global().succeeded(inner.endpoint.subscription());
                return Ok(());
            }
            Err(refusal) => refusal,
        };
        crate::outcomes::global().failed(inner.endpoint.subscription(), refusal.summary());
        if !refusal.retryable {
            self.count("permanent", started);
            return Err(HandlerError::permanent(refusal.reason));
        }
        let asks_to_wait = matches!(
            refusal.status,
            Some(StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)
        );
        match refusal.retry_after.map(|delay| inner.honoured(delay)) {
            Some(delay) if asks_to_wait => {
                inner.throttle_until(Instant::now() + delay);
                self.count("deferred", started);
                Err(HandlerError::snooze(delay, refusal.reason))
            }
            Some(delay) => {
                self.count("retry", started);
                Err(HandlerError::retry_after(delay, refusal.reason))
            }
            None => {
                self.count("retry", started);
                Err(HandlerError::retry(refusal.reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The example of the Standard Webhooks specification's reference libraries.
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let signature = sign(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(signature_matches(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
            &format!("v1,bogus {signature}"),
        ));
        assert!(!signature_matches(
            &secret,
            "other",
            1_614_265_330,
            b"{}",
            &signature
        ));
        // The specification's example is from 2021: long past any tolerance.
        assert!(!verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
            &signature,
            DEFAULT_TOLERANCE,
        ));
    }

    #[test]
    fn timestamps_are_fresh_within_the_tolerance_either_way() {
        let tolerance = DEFAULT_TOLERANCE;
        assert!(is_fresh(1_000, 1_000, tolerance));
        assert!(is_fresh(1_000 - 300, 1_000, tolerance));
        assert!(is_fresh(1_000 + 300, 1_000, tolerance));
        assert!(!is_fresh(1_000 - 301, 1_000, tolerance));
        assert!(!is_fresh(1_000 + 301, 1_000, tolerance));
        assert!(!is_fresh(i64::MIN, i64::MAX, Duration::MAX));
        assert!(is_fresh(5, 5, Duration::ZERO));
    }

    #[test]
    fn only_safe_message_headers_are_forwarded() {
        for (name, value) in [
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("TraceState", "congo=t61rcWkgMzE"),
            ("x-request-id", "r-1"),
            ("x-name", "Zoë"),
        ] {
            assert!(forwardable(name, value).is_some(), "{name}");
        }
        for (name, value) in [
            ("Webhook-Signature", "v1,forged"),
            ("courier-tenant", "other"),
            ("Proxy-Authorization", "Basic x"),
            ("Transfer-Encoding", "chunked"),
            ("content-length", "0"),
            ("Host", "evil.example"),
            ("authorization", "Bearer x"),
            ("cookie", "session=1"),
            ("two words", "x"),
            ("x-split", "a\r\nx-injected: 1"),
        ] {
            assert!(forwardable(name, value).is_none(), "{name}: {value:?}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_only() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("999999999"));
        assert_eq!(retry_after(&headers), Some(MAX_RETRY_AFTER));
    }
}
