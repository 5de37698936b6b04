//! The NATS JetStream relay: publish with `Nats-Msg-Id` = the subject and
//! the message id ([`nats_msg_id`]) and wait for the stream's
//! acknowledgement (see the `relay` module).
//!
//! The NATS message's payload is the message's payload, the JSON text as it
//! was published, byte for byte; its headers are the message's
//! own headers (with the relay delivery span's trace context in place of
//! the producer's when the daemon traces: [`super::relayed_headers`]) plus
//! `Courier-Message-Id`, `Courier-Tenant`, `Courier-Topic`
//! and `Courier-Schema-Version`. Message headers named `Nats-…` (which steer
//! JetStream: expected sequences, rollups, TTLs) or `Courier-…` (which would
//! pass for the origin) are refused, permanently, rather than forwarded.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use courier::{Handler, HandlerError, Message};

use super::template::{subject_template, Template};
use super::{RedeliveryHorizon, RelayCommon, RelayError, Relayed};
use crate::config::{SubscriptionConfig, TargetConfig};

/// How long connecting to NATS at start may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest pause between reconnection attempts.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// The header carrying the outbox message's id.
pub const MESSAGE_ID_HEADER: &str = "Courier-Message-Id";
/// The header carrying the message's tenant.
pub const TENANT_HEADER: &str = "Courier-Tenant";
/// The header carrying the message's topic.
pub const TOPIC_HEADER: &str = "Courier-Topic";
/// The header carrying the message's schema version.
pub const SCHEMA_VERSION_HEADER: &str = "Courier-Schema-Version";

/// The `Nats-Msg-Id` a relay publishes `message_id` on `subject` with:
/// `{subject}:{message id}`. JetStream remembers ids per stream, whatever
/// the subject, so a bare message id would make a second subscription's
/// publish of the same message on another subject of that stream a
/// "duplicate", stored nowhere; on one subject, a second publish of the
/// message is one (as the Redis relay dedupes per stream key).
pub fn nats_msg_id(subject: &str, message_id: uuid::Uuid) -> String {
    format!("{subject}:{message_id}")
}

/// Connects to the NATS server at `url` for the daemon's relays: reconnects
/// by itself, forever, with a pause from nothing up to
/// [`MAX_RECONNECT_DELAY`]; disconnections and reconnections are logged.
/// Publishes made while disconnected wait in the client and go out on
/// reconnection (a publish whose acknowledgement does not come within its
/// timeout is retried; JetStream drops the second copy by its message id).
pub async fn connect_nats(url: &str) -> Result<async_nats::Client, RelayError> {
    let options = async_nats::ConnectOptions::new()
        .name("courier")
        .connection_timeout(CONNECT_TIMEOUT)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            let exponent = u32::try_from(attempts.min(12)).unwrap_or(12);
            (Duration::from_millis(25) * 2_u32.pow(exponent)).min(MAX_RECONNECT_DELAY)
        })
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("NATS connection (re)established"),
                async_nats::Event::Disconnected => {
                    tracing::warn!("NATS connection lost; reconnecting")
                }
                other => tracing::warn!(event = %other, "NATS client event"),
            }
        });
    let connect = options.connect(url);
    let unreachable = |reason: String| RelayError::Unreachable {
        subscription: "(any nats relay)".into(),
        target: "[nats] url".into(),
        reason,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT * 2, connect).await {
        Ok(Ok(client)) => Ok(client),
        // The client's errors may quote the server URL, credentials included.
        Ok(Err(error)) => Err(unreachable(crate::redact::redact_urls(&error.to_string()))),
        Err(_) => Err(unreachable(format!(
            "no connection within {} s",
            (CONNECT_TIMEOUT * 2).as_secs()
        ))),
    }
}

/// Publishes a subscription's messages to a JetStream stream, once each.
#[derive(Clone)]
pub struct NatsRelay {
    inner: Arc<Inner>,
}

struct Inner {
    common: RelayCommon,
    jetstream: jetstream::Context,
    template: Template,
    stream: String,
    timeout: Duration,
}

impl std::fmt::Debug for NatsRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsRelay")
            .field("subscription", &self.inner.common.subscription)
            .field("subject", &self.inner.template.source())
            .field("stream", &self.inner.stream)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsRelay {
    /// The relay of `subscription` (a `nats` target) over `client`. Fetches
    /// the JetStream stream's configuration and refuses to start when the
    /// stream is missing or its `duplicate_window` is shorter than the
    /// subscription's [`RedeliveryHorizon`].
    pub async fn start(
        subscription: &SubscriptionConfig,
        client: async_nats::Client,
    ) -> Result<Self, RelayError> {
        let invalid = |reason: String| RelayError::Invalid {
            subscription: subscription.name.clone(),
            reason,
        };
        let TargetConfig::Nats(target) = &subscription.target else {
            return Err(invalid(format!(
                "the target is a {}, not nats",
                subscription.target.kind()
            )));
        };
        let template = subject_template(&target.subject).map_err(invalid)?;
        let timeout = Duration::from_millis(target.timeout_ms);
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(timeout);
        let unreachable = |reason: String| RelayError::Unreachable {
            subscription: subscription.name.clone(),
            target: format!("JetStream stream {}", target.stream),
            reason,
        };
        let stream = tokio::time::timeout(timeout * 2, jetstream.get_stream(&target.stream))
            .await
            .map_err(|_| unreachable(format!("no answer within {} ms", (timeout * 2).as_millis())))?
            .map_err(|error| unreachable(error.to_string()))?;
        let window = stream.cached_info().config.duplicate_window;
        let horizon = RedeliveryHorizon::of(subscription);
        if window < horizon.total() {
            return Err(RelayError::DuplicateWindow {
                subscription: subscription.name.clone(),
                stream: target.stream.clone(),
                window,
                horizon,
            });
        }
        Ok(Self {
            inner: Arc::new(Inner {
                common: RelayCommon::of(subscription),
                jetstream,
                template,
                stream: target.stream.clone(),
                timeout,
            }),
        })
    }

    /// The headers `message` is published with (see the module doc).
    pub fn headers(message: &Message<crate::RawPayload>) -> Result<HeaderMap, HandlerError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &super::relayed_headers(message) {
            let lower = name.to_ascii_lowercase();
            if lower.starts_with("nats-") || lower.starts_with("courier-") {
                return Err(HandlerError::permanent(format!(
                    "header {name:?} is reserved (Nats-* steers JetStream, Courier-* carries the origin) \
                     and is not relayed to NATS"
                )));
            }
            let header_name = HeaderName::from_str(name)
                .ok()
                .filter(|_| !name.is_empty())
                .ok_or_else(|| {
                    HandlerError::permanent(format!(
                        "header name {name:?} cannot be sent to NATS (printable ASCII without spaces or `:`)"
                    ))
                })?;
            let header_value = HeaderValue::from_str(value).map_err(|_| {
                HandlerError::permanent(format!(
                    "header {name:?} has a line break, which NATS headers cannot carry"
                ))
            })?;
            headers.insert(header_name, header_value);
        }
        for (name, value) in [
            (MESSAGE_ID_HEADER, message.id.to_string()),
            (TENANT_HEADER, message.tenant.clone()),
            (TOPIC_HEADER, message.topic.clone()),
            (SCHEMA_VERSION_HEADER, message.schema_version.to_string()),
        ] {
            let value = HeaderValue::from_str(&value)
                .map_err(|_| HandlerError::permanent(format!("header {name} is unusable")))?;
            headers.insert(name, value);
        }
        Ok(headers)
    }

    /// Publishes `message` and waits for its acknowledgement; the downstream
    /// write a delivery waits for before it completes.
    pub async fn publish(
        &self,
        message: &Message<crate::RawPayload>,
    ) -> Result<Relayed, HandlerError> {
        let inner = &self.inner;
        if !inner.common.relays(&message.tenant) {
            return Ok(Relayed::Skipped);
        }
        let subject = inner
            .template
            .subject(&message.tenant, &message.topic)
            .map_err(HandlerError::permanent)?;
        let body = message.payload.get().as_bytes().to_vec();
        let publish = PublishMessage::build()
            .payload(body.into())
            .headers(Self::headers(message)?)
            .message_id(nats_msg_id(&subject, message.id));
        let send = async {
            let acknowledgement = inner
                .jetstream
                .send_publish(subject.clone(), publish)
                .await?;
            acknowledgement.await
        };
        // The context's timeout bounds the send and the wait for the ack
        // each; this bounds both together.
        let ack = match tokio::time::timeout(inner.timeout * 2, send).await {
            Ok(Ok(ack)) => ack,
            Ok(Err(error)) => return Err(classify(&subject, &error)),
            Err(_) => {
                return Err(HandlerError::retry(format!(
                    "NATS publish on {subject} not acknowledged within {} ms",
                    (inner.timeout * 2).as_millis()
                )))
            }
        };
        if ack.stream != inner.stream {
            return Err(HandlerError::permanent(format!(
                "subject {subject} is stored by JetStream stream {}, not the configured {}: \
                 its duplicate window was never checked",
                ack.stream, inner.stream
            )));
        }
        let sequence = ack.sequence.to_string();
        Ok(if ack.duplicate {
            Relayed::Duplicate(sequence)
        } else {
            Relayed::Stored(sequence)
        })
    }
}

/// A message over the server's or the stream's size limit is permanent;
/// everything else (no connection, a timeout, no stream answering while the
/// server restarts) is retried.
fn classify(subject: &str, error: &jetstream::context::PublishError) -> HandlerError {
    let jetstream_code = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => HandlerError::permanent(format!(
            "the message is over the NATS server's max_payload: {error}"
        )),
        _ if jetstream_code == Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
            HandlerError::permanent(format!(
                "the message is over the JetStream stream's max_msg_size: {error}"
            ))
        }
        PublishErrorKind::StreamNotFound => HandlerError::retry(format!(
            "no JetStream stream answered for subject {subject} (missing, or the server is starting)"
        )),
        _ => HandlerError::retry(format!("NATS publish on {subject} failed: {error}")),
    }
}

impl Handler for NatsRelay {
    type Payload = crate::RawPayload;

    async fn handle(&self, message: Message<crate::RawPayload>) -> Result<(), HandlerError> {
        let started = Instant::now();
        let outcome = self.publish(&message).await;
        self.inner.common.record(&outcome, started);
        outcome.map(|_| ())
    }
}
