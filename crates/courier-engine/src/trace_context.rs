//! Traces that cross the outbox and streams: the producer's span context
//! travels in the message's (or stream entry's) `traceparent` /
//! `tracestate` headers ([`courier_core::TRACEPARENT`]), and each
//! delivery's `courier.deliver` span (each stream entry handler's
//! `courier.stream_deliver`) continues it.
//!
//! With the `otel` feature, [`with_current_context`] adds the current
//! `tracing` span's OpenTelemetry context to messages being enqueued, and
//! each delivery span takes the context in its message's headers as its
//! OpenTelemetry parent. Both need a `tracing-opentelemetry` layer in the
//! application's subscriber: without one the current span has no valid
//! context, so nothing is added and spans keep their `tracing` parents.
//! Without the feature every function here is a no-op, so callers need no
//! `cfg` of their own.
//!
//! Failure: a context that is missing, malformed or does not fit is left
//! out; tracing never fails an enqueue or a delivery.

use std::borrow::Cow;
use std::collections::BTreeMap;

use courier_core::{ClaimedDelivery, DeliveredEntry, NewMessage, StreamKey};

pub use courier_core::{current_trace_headers, TraceHeaders};

/// `messages`, with the current span's trace context
/// ([`current_trace_headers`]) added to each that carries none of its own
/// (see [`courier_core::insert_trace_context`]); borrowed unchanged when
/// there is no context or nothing to add.
pub fn with_current_context(messages: &[NewMessage]) -> Cow<'_, [NewMessage]> {
    courier_core::messages_with_current_context(messages)
}

/// What one delivery's `courier.deliver` span is made of: borrowed from its
/// claim to open the span at once, or owned ([`DeliverySpan::into_owned`],
/// without the payload) so that a transactional group can open each
/// delivery's span when its handler starts.
#[derive(Debug, Clone)]
pub(crate) struct DeliverySpan<'a> {
    subscription: Cow<'a, str>,
    message_id: uuid::Uuid,
    tenant: Cow<'a, str>,
    topic: Cow<'a, str>,
    version: i32,
    attempt: i32,
    /// The producer's `traceparent` and `tracestate` headers, which only
    /// OpenTelemetry spans continue.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    producer: (Option<Cow<'a, str>>, Option<Cow<'a, str>>),
}

impl<'a> DeliverySpan<'a> {
    /// The span fields of `delivery`, a delivery of `subscription`.
    pub(crate) fn of(subscription: &'a str, delivery: &'a ClaimedDelivery) -> Self {
        let header = |name: &str| {
            delivery
                .headers
                .get(name)
                .map(|v| Cow::Borrowed(v.as_str()))
        };
        Self {
            subscription: Cow::Borrowed(subscription),
            message_id: delivery.message_id,
            tenant: Cow::Borrowed(&delivery.tenant),
            topic: Cow::Borrowed(&delivery.topic),
            version: delivery.schema_version,
            attempt: delivery.attempt,
            producer: (
                header(courier_core::TRACEPARENT),
                header(courier_core::TRACESTATE),
            ),
        }
    }

    /// The same fields, owned.
    pub(crate) fn into_owned(self) -> DeliverySpan<'static> {
        let owned = |text: Cow<'a, str>| Cow::Owned(text.into_owned());
        DeliverySpan {
            subscription: owned(self.subscription),
            message_id: self.message_id,
            tenant: owned(self.tenant),
            topic: owned(self.topic),
            version: self.version,
            attempt: self.attempt,
            producer: (self.producer.0.map(owned), self.producer.1.map(owned)),
        }
    }

    /// Opens the span one delivery's handler runs in: `courier.deliver`,
    /// with the subscription, message id, tenant, topic, schema version and
    /// attempt as fields. With the `otel` feature it is a consumer span
    /// carrying OpenTelemetry's messaging attributes (`messaging.system =
    /// "courier"`, `messaging.operation = "process"`,
    /// `messaging.destination.name` = the topic, `messaging.message.id`),
    /// whose OpenTelemetry parent is the producer's context from the
    /// message's headers when it has a valid one (else its `tracing` parent).
    pub(crate) fn open(&self) -> tracing::Span {
        #[cfg(feature = "otel")]
        let span = tracing::info_span!(
            "courier.deliver",
            otel.kind = "consumer",
            subscription = %self.subscription,
            message_id = %self.message_id,
            tenant = %self.tenant,
            topic = %self.topic,
            version = self.version,
            attempt = self.attempt,
        );
        #[cfg(not(feature = "otel"))]
        let span = tracing::info_span!(
            "courier.deliver",
            subscription = %self.subscription,
            message_id = %self.message_id,
            tenant = %self.tenant,
            topic = %self.topic,
            version = self.version,
            attempt = self.attempt,
        );
        #[cfg(feature = "otel")]
        otel::continue_producer(&span, self);
        span
    }
}

/// Opens the span a stream subscription's handler runs in for one entry:
/// `courier.stream_deliver`, with the subscription, tenant, stream, entry id
/// and delivery (counted as the subscription counts it) as fields. With the
/// `otel` feature it is a consumer span carrying OpenTelemetry's messaging
/// attributes (`messaging.system = "courier"`, `messaging.operation =
/// "process"`, `messaging.destination.name` = the stream,
/// `messaging.consumer.group.name` = the subscription,
/// `messaging.message.id` = the entry id), whose OpenTelemetry parent is the
/// appender's context from the entry's headers when it has a valid one
/// (else its `tracing` parent).
pub(crate) fn stream_entry_span(
    subscription: &str,
    key: &StreamKey,
    entry: &DeliveredEntry,
    delivery: u64,
) -> tracing::Span {
    #[cfg(feature = "otel")]
    let span = tracing::info_span!(
        "courier.stream_deliver",
        otel.kind = "consumer",
        subscription = %subscription,
        tenant = %key.tenant(),
        stream = %key.stream(),
        entry_id = %entry.entry.id,
        delivery,
    );
    #[cfg(not(feature = "otel"))]
    let span = tracing::info_span!(
        "courier.stream_deliver",
        subscription = %subscription,
        tenant = %key.tenant(),
        stream = %key.stream(),
        entry_id = %entry.entry.id,
        delivery,
    );
    #[cfg(feature = "otel")]
    otel::continue_appender(&span, subscription, key, entry);
    span
}

/// Links `span` (a transactional group's) to the producer context of each
/// of `deliveries` that has one (with the `otel` feature; else nothing).
pub(crate) fn link_producers(span: &tracing::Span, deliveries: &[ClaimedDelivery]) {
    #[cfg(feature = "otel")]
    for delivery in deliveries {
        if let Some(producer) = trace_headers_of(&delivery.headers) {
            otel::link(span, &producer);
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, deliveries);
}

/// The trace context in `headers`, as [`TraceHeaders`], if its
/// `traceparent` is valid.
pub fn trace_headers_of(headers: &BTreeMap<String, String>) -> Option<TraceHeaders> {
    let traceparent = headers.get(courier_core::TRACEPARENT)?;
    if !courier_core::valid_traceparent(traceparent) {
        return None;
    }
    Some(TraceHeaders {
        traceparent: traceparent.clone(),
        tracestate: headers.get(courier_core::TRACESTATE).cloned(),
    })
}

#[cfg(feature = "otel")]
mod otel {
    use std::collections::HashMap;

    use courier_core::{TRACEPARENT, TRACESTATE};
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{SpanContext, TraceContextExt};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{DeliverySpan, TraceHeaders};

    /// The span context of `producer`'s headers, if valid.
    fn producer_context(producer: &TraceHeaders) -> Option<opentelemetry::Context> {
        let mut carrier: HashMap<String, String> = HashMap::new();
        carrier.insert(TRACEPARENT.to_owned(), producer.traceparent.clone());
        if let Some(state) = &producer.tracestate {
            carrier.insert(TRACESTATE.to_owned(), state.clone());
        }
        let context = TraceContextPropagator::new().extract(&carrier);
        context.span().span_context().is_valid().then_some(context)
    }

    pub(super) fn continue_producer(span: &tracing::Span, delivery: &DeliverySpan<'_>) {
        span.set_attribute("messaging.system", "courier");
        span.set_attribute("messaging.operation", "process");
        span.set_attribute("messaging.destination.name", delivery.topic.to_string());
        span.set_attribute("messaging.message.id", delivery.message_id.to_string());
        let producer = match &delivery.producer {
            (Some(traceparent), tracestate) if courier_core::valid_traceparent(traceparent) => {
                Some(TraceHeaders {
                    traceparent: traceparent.to_string(),
                    tracestate: tracestate.as_deref().map(str::to_owned),
                })
            }
            _ => None,
        };
        if let Some(parent) = producer.as_ref().and_then(producer_context) {
            // Fails only when no OpenTelemetry layer is installed (or the
            // span is disabled): then there is nothing to continue.
            let _ = span.set_parent(parent);
        }
    }

    pub(super) fn continue_appender(
        span: &tracing::Span,
        subscription: &str,
        key: &courier_core::StreamKey,
        entry: &courier_core::DeliveredEntry,
    ) {
        span.set_attribute("messaging.system", "courier");
        span.set_attribute("messaging.operation", "process");
        span.set_attribute("messaging.destination.name", key.stream().to_owned());
        span.set_attribute("messaging.consumer.group.name", subscription.to_owned());
        span.set_attribute("messaging.message.id", entry.entry.id.to_string());
        if let Some(parent) = super::trace_headers_of(&entry.entry.headers)
            .as_ref()
            .and_then(producer_context)
        {
            // As in `continue_producer`: fails only without a layer.
            let _ = span.set_parent(parent);
        }
    }

    pub(super) fn link(span: &tracing::Span, producer: &TraceHeaders) {
        if let Some(context) = producer_context(producer) {
            let linked: SpanContext = context.span().span_context().clone();
            span.add_link(linked);
        }
    }
}
