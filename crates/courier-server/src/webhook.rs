//! The webhook target: a [`Handler`] that POSTs each payload as JSON, signed
//! per the Standard Webhooks convention.
//!
//! Each request carries `webhook-id` (the message id: the same on every
//! retry, so receivers deduplicate on it), `webhook-timestamp` (unix seconds)
//! and `webhook-signature` = `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`,
//! plus `courier-tenant`, `courier-topic`, `courier-schema-version` and
//! `courier-attempt` for routing.
//!
//! Outcomes: 2xx completes the delivery. 5xx, 408, 429, a connection error or
//! a timeout is retried — after `Retry-After` seconds when the endpoint sends
//! it, else by the subscription's backoff. Any other status (redirects are
//! not followed) is permanent: the message is dead-lettered at once. The
//! status and the first 1 KiB of the response body go into the error history.
//! Messages of tenants outside the subscription's `tenants` are completed
//! without a request.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use courier::{truncate_chars, Handler, HandlerError, Message};
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use sha2::Sha256;

use crate::config::{SubscriptionConfig, TargetConfig};
use crate::metrics::{WEBHOOK_REQUESTS, WEBHOOK_SECONDS};

/// How much of a failed response's body is kept in the error history.
pub const ERROR_BODY_BYTES: usize = 1024;
/// The longest `Retry-After` honoured; longer requests are capped to it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

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

/// Delivers a subscription's messages to one HTTP endpoint.
#[derive(Clone)]
pub struct WebhookHandler {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    tenants: Option<BTreeSet<String>>,
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
/// its client, URL, secret and timeout.
pub(crate) struct Endpoint {
    subscription: String,
    client: reqwest::Client,
    url: reqwest::Url,
    secret: Vec<u8>,
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
    /// An endpoint POSTing to `url`, signing with `secret`, giving each
    /// request `timeout`; redirects are not followed.
    pub(crate) fn new(
        subscription: &str,
        url: reqwest::Url,
        secret: Vec<u8>,
        timeout: Duration,
    ) -> Result<Self, WebhookError> {
        if secret.is_empty() {
            return Err(WebhookError::Invalid {
                subscription: subscription.to_owned(),
                reason: "the secret is empty".into(),
            });
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
            secret,
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
    /// signature, and `extra` headers; `Ok` on a 2xx answer.
    pub(crate) async fn post(
        &self,
        id: &str,
        extra: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Result<(), Refusal>, HandlerError> {
        let timestamp = chrono::Utc::now().timestamp();
        let signature = sign(&self.secret, id, timestamp, &body)
            .ok_or_else(|| HandlerError::permanent("the signing secret is unusable"))?;
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
            return Ok(Ok(()));
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
        let secret = webhook.secret_bytes().map_err(invalid)?;
        Self::new(
            &subscription.name,
            url,
            secret,
            Duration::from_millis(webhook.timeout_ms),
            subscription
                .tenants
                .as_ref()
                .map(|t| t.iter().cloned().collect()),
        )
    }

    /// A handler POSTing to `url`, signing with `secret`, giving each request
    /// `timeout`; with `tenants`, only those tenants' messages are sent.
    pub fn new(
        subscription: &str,
        url: reqwest::Url,
        secret: Vec<u8>,
        timeout: Duration,
        tenants: Option<BTreeSet<String>>,
    ) -> Result<Self, WebhookError> {
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint: Endpoint::new(subscription, url, secret, timeout)?,
                tenants,
            }),
        })
    }

    fn count(&self, outcome: &'static str, started: Instant) {
        self.inner.endpoint.count(outcome, started);
    }
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

/// Whether `signature_header` (space-separated `v1,<sig>` entries) holds a
/// valid signature of this request, compared in constant time. For receivers
/// written in Rust and for tests.
pub fn verify(
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
    type Payload = serde_json::Value;

    async fn handle(&self, message: Message<serde_json::Value>) -> Result<(), HandlerError> {
        let inner = &self.inner;
        let started = Instant::now();
        if let Some(tenants) = &inner.tenants {
            if !tenants.contains(&message.tenant) {
                self.count("skipped", started);
                return Ok(());
            }
        }
        let body = serde_json::to_vec(&message.payload).map_err(|e| {
            HandlerError::permanent(format!("the payload cannot be encoded as JSON: {e}"))
        })?;
        let mut headers = HeaderMap::new();
        headers.insert("courier-tenant", header(&message.tenant)?);
        headers.insert("courier-topic", header(&message.topic)?);
        headers.insert(
            "courier-schema-version",
            header(&message.schema_version.to_string())?,
        );
        headers.insert("courier-attempt", header(&message.attempt.to_string())?);
        let refusal = match inner
            .endpoint
            .post(&message.id.to_string(), headers, body)
            .await?
        {
            Ok(()) => {
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
        self.count("retry", started);
        Err(match refusal.retry_after {
            Some(delay) => HandlerError::retry_after(delay, refusal.reason),
            None => HandlerError::retry(refusal.reason),
        })
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
        assert!(verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
            &format!("v1,bogus {signature}"),
        ));
        assert!(!verify(&secret, "other", 1_614_265_330, b"{}", &signature));
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
