//! The webhook target of a stream subscription: a [`StreamHandler`] that
//! POSTs each entry's payload as JSON, signed as outbox webhooks are (see
//! [`crate::webhook`]).
//!
//! `webhook-id` is the entry's correlation id `{subscription}:{stream}:{entry
//! id}` — the same on every redelivery, so receivers deduplicate on it —
//! beside `webhook-timestamp` and `webhook-signature`, and
//! `courier-tenant`, `courier-stream`, `courier-entry-id` and
//! `courier-delivery` (deliveries so far, this one included). `traceparent`
//! (and `tracestate`) is the handler span's (`courier.stream_deliver`, the
//! appender's child) when the daemon traces, else the entry's own, so the
//! endpoint's span continues the appender's trace.
//!
//! Outcomes: 2xx succeeds (receipt, then ack). 429, and 503 with
//! `Retry-After`, is the endpoint asking to wait: a deferral
//! ([`HandlerError::snooze`]), which spends no delivery and pauses the
//! subscription for `max(Retry-After, its deferral backoff)`. Other 5xx, 408,
//! a connection error or a timeout is a failed delivery: the entry stays
//! pending and is claimed again once idle for `min_idle_ms`, and is
//! dead-lettered at `max_deliveries`. Any other status is permanent: the
//! entry goes to `{stream}.dead` at once. The status and the first 1 KiB of
//! the body go into the entry's errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{HandlerError, StreamHandler, StreamMessage};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::config::{StreamSubscriptionSettings, StreamTargetConfig};
use crate::webhook::{header, Endpoint, WebhookError};

/// Delivers a stream subscription's entries to one HTTP endpoint.
#[derive(Clone)]
pub struct StreamWebhookHandler {
    endpoint: Arc<Endpoint>,
}

impl std::fmt::Debug for StreamWebhookHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWebhookHandler")
            .field("subscription", &self.endpoint.subscription())
            .finish_non_exhaustive()
    }
}

impl StreamWebhookHandler {
    /// The handler for a configured stream subscription's webhook target.
    pub fn from_config(settings: &StreamSubscriptionSettings) -> Result<Self, WebhookError> {
        let StreamTargetConfig::Webhook(webhook) = &settings.target;
        let invalid = |reason: String| WebhookError::Invalid {
            subscription: settings.name.clone(),
            reason,
        };
        let url = reqwest::Url::parse(&webhook.url).map_err(|e| invalid(e.to_string()))?;
        let secrets = webhook.signing_keys().map_err(|e| invalid(e.to_string()))?;
        let endpoint = Endpoint::new(
            &settings.name,
            url,
            secrets,
            Duration::from_millis(webhook.timeout_ms),
        )?;
        Ok(Self {
            endpoint: Arc::new(endpoint),
        })
    }
}

/// What an endpoint's refusal means for a stream entry.
fn classify(
    status: Option<StatusCode>,
    retry_after: Option<Duration>,
    retryable: bool,
    reason: String,
) -> (HandlerError, &'static str) {
    let asks_to_wait = match status {
        Some(StatusCode::TOO_MANY_REQUESTS) => true,
        Some(StatusCode::SERVICE_UNAVAILABLE) => retry_after.is_some(),
        _ => false,
    };
    if asks_to_wait {
        // Zero leaves the pause to the subscription's deferral backoff.
        let delay = retry_after.unwrap_or(Duration::ZERO);
        return (HandlerError::snooze(delay, reason), "deferred");
    }
    if retryable {
        (HandlerError::retry(reason), "retry")
    } else {
        (HandlerError::permanent(reason), "permanent")
    }
}

impl StreamHandler for StreamWebhookHandler {
    type Payload = serde_json::Value;

    async fn handle(&self, message: StreamMessage<serde_json::Value>) -> Result<(), HandlerError> {
        let started = Instant::now();
        let body = serde_json::to_vec(&message.payload).map_err(|e| {
            HandlerError::permanent(format!("the payload cannot be encoded as JSON: {e}"))
        })?;
        let mut headers = HeaderMap::new();
        headers.insert("courier-tenant", header(message.key.tenant())?);
        headers.insert("courier-stream", header(message.key.stream())?);
        headers.insert("courier-entry-id", header(&message.id.to_string())?);
        headers.insert("courier-delivery", header(&message.deliveries.to_string())?);
        let trace = courier::trace_context::current_trace_headers()
            .or_else(|| courier::trace_context::trace_headers_of(&message.headers));
        if let Some(trace) = trace {
            headers.insert(courier::TRACEPARENT, header(&trace.traceparent)?);
            // A tracestate no header can carry is left out, as for outbox
            // webhooks: the traceparent alone continues the trace.
            if let Some(state) = trace.tracestate.and_then(|s| header(&s).ok()) {
                headers.insert(courier::TRACESTATE, state);
            }
        }
        match self
            .endpoint
            .post(&message.correlation_id, headers, body)
            .await?
        {
            Ok(_) => {
                self.endpoint.count("delivered", started);
                Ok(())
            }
            Err(refusal) => {
                let (error, outcome) = classify(
                    refusal.status,
                    refusal.retry_after,
                    refusal.retryable,
                    refusal.reason,
                );
                self.endpoint.count(outcome, started);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: u16, retry_after: Option<u64>) -> &'static str {
        let status = StatusCode::from_u16(status).ok();
        let retryable = status.is_some_and(|s| {
            s.is_server_error()
                || s == StatusCode::REQUEST_TIMEOUT
                || s == StatusCode::TOO_MANY_REQUESTS
        });
        classify(
            status,
            retry_after.map(Duration::from_secs),
            retryable,
            String::new(),
        )
        .1
    }

    #[test]
    fn asking_to_wait_defers_server_errors_retry_and_other_refusals_are_permanent() {
        assert_eq!(outcome(429, Some(2)), "deferred");
        assert_eq!(outcome(429, None), "deferred");
        assert_eq!(outcome(503, Some(1)), "deferred");
        assert_eq!(outcome(503, None), "retry");
        assert_eq!(outcome(500, Some(1)), "retry");
        assert_eq!(outcome(408, None), "retry");
        assert_eq!(outcome(400, None), "permanent");
        assert_eq!(outcome(404, Some(1)), "permanent");
        assert_eq!(outcome(302, None), "permanent");
    }
}
