//! W3C trace context carried in a message's headers.
//!
//! A producer's trace continues in the delivery of its message when the
//! message carries the producer's [`TRACEPARENT`] (and, if it has one,
//! [`TRACESTATE`]) header, in the format of the W3C Trace Context
//! recommendation (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`).
//! The library adds them at enqueue from the current span, the daemon from
//! the publish request's `traceparent` header, and a plain-SQL producer may
//! write them into the `headers` JSON object itself.
//!
//! Tracing never makes a publish fail: a context that does not fit (the
//! message already carries [`MAX_HEADERS`] headers, a `tracestate` longer
//! than a header value may be) is left out, and one the caller set is never
//! replaced. Reading the current span's context ([`current_trace_headers`])
//! needs the `otel` feature and a `tracing-opentelemetry` layer in the
//! application's subscriber; without either there is no context and nothing
//! is added.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::message::{NewMessage, MAX_HEADERS};
use crate::stream::NewStreamEntry;

/// The header key of the W3C `traceparent`: the producer's trace id and span.
pub const TRACEPARENT: &str = "traceparent";
/// The header key of the W3C `tracestate`: vendor data that travels with
/// [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// The longest header value a message may carry (see [`crate::NewMessage::validate`]).
const MAX_HEADER_VALUE_BYTES: usize = 4096;

/// Whether `value` is a W3C `traceparent` a receiver may continue: version
/// `00` exactly (`00-{trace id}-{parent id}-{flags}`, 55 characters), or a
/// later version (not `ff`) with those four fields first; lowercase hex; the
/// trace id and the parent id not all zeros.
pub fn valid_traceparent(value: &str) -> bool {
    let mut fields = value.split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return false;
    };
    let hex = |field: &str, len: usize| {
        field.len() == len
            && field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let not_zero = |field: &str| field.bytes().any(|b| b != b'0');
    if !hex(version, 2) || version == "ff" {
        return false;
    }
    if version == "00" && (value.len() != 55 || fields.next().is_some()) {
        return false;
    }
    hex(trace_id, 32)
        && not_zero(trace_id)
        && hex(parent_id, 16)
        && not_zero(parent_id)
        && hex(flags, 2)
}

/// The trace id of a valid `traceparent` (its 32 hex digits), else `None`.
pub fn traceparent_trace_id(value: &str) -> Option<&str> {
    if !valid_traceparent(value) {
        return None;
    }
    value.get(3..35)
}

/// Whether `headers` already carry a trace context: a `traceparent` or a
/// `tracestate` under any capitalisation (a caller's own, which Courier
/// never replaces or mixes with another).
pub fn has_trace_context(headers: &BTreeMap<String, String>) -> bool {
    headers
        .keys()
        .any(|name| name.eq_ignore_ascii_case(TRACEPARENT) || name.eq_ignore_ascii_case(TRACESTATE))
}

/// Adds a trace context to `headers` unless they carry one already
/// ([`has_trace_context`]), `traceparent` is not valid
/// ([`valid_traceparent`]) or it would not fit under [`MAX_HEADERS`].
/// A `tracestate` that is empty or longer than a header value may be is left
/// out (the `traceparent` alone is still a usable context). Returns whether
/// anything was added.
pub fn insert_trace_context(
    headers: &mut BTreeMap<String, String>,
    traceparent: &str,
    tracestate: Option<&str>,
) -> bool {
    if has_trace_context(headers) || !valid_traceparent(traceparent) {
        return false;
    }
    let tracestate = tracestate.filter(|state| {
        !state.is_empty() && state.len() <= MAX_HEADER_VALUE_BYTES && !state.contains('\0')
    });
    let needed = 1 + usize::from(tracestate.is_some());
    if headers.len() + needed > MAX_HEADERS {
        return false;
    }
    headers.insert(TRACEPARENT.to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        headers.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    true
}

/// A W3C trace context as message headers would carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The `traceparent` value (`00-{trace id}-{span id}-{flags}`).
    pub traceparent: String,
    /// The `tracestate` value, when the context has vendor data.
    pub tracestate: Option<String>,
}

/// The current `tracing` span's OpenTelemetry context as W3C headers, when
/// it has a valid one (the `otel` feature and a `tracing-opentelemetry`
/// layer in the subscriber); `None` otherwise.
pub fn current_trace_headers() -> Option<TraceHeaders> {
    #[cfg(feature = "otel")]
    {
        otel::current()
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// `messages`, with the current span's trace context
/// ([`current_trace_headers`]) added to each that carries none of its own
/// (see [`insert_trace_context`]); borrowed unchanged when there is no
/// context or nothing to add. The library's enqueue and publish apply it.
pub fn messages_with_current_context(messages: &[NewMessage]) -> Cow<'_, [NewMessage]> {
    with_current_context(messages)
}

/// `entries`, as [`messages_with_current_context`] does for messages. Every
/// backend's `append` applies it, so a stream subscription's handler span
/// continues the appender's trace.
pub fn entries_with_current_context(entries: &[NewStreamEntry]) -> Cow<'_, [NewStreamEntry]> {
    with_current_context(entries)
}

/// What carries headers a trace context can go into.
trait Headers: Clone {
    fn headers(&self) -> &BTreeMap<String, String>;
    fn headers_mut(&mut self) -> &mut BTreeMap<String, String>;
}

impl Headers for NewMessage {
    fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }
    fn headers_mut(&mut self) -> &mut BTreeMap<String, String> {
        &mut self.headers
    }
}

impl Headers for NewStreamEntry {
    fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }
    fn headers_mut(&mut self) -> &mut BTreeMap<String, String> {
        &mut self.headers
    }
}

fn with_current_context<T: Headers>(items: &[T]) -> Cow<'_, [T]> {
    if items.iter().all(|item| has_trace_context(item.headers())) {
        return Cow::Borrowed(items);
    }
    let Some(context) = current_trace_headers() else {
        return Cow::Borrowed(items);
    };
    let mut owned = items.to_vec();
    for item in &mut owned {
        insert_trace_context(
            item.headers_mut(),
            &context.traceparent,
            context.tracestate.as_deref(),
        );
    }
    Cow::Owned(owned)
}

/// Replaces the trace context in `headers` (a `traceparent` or `tracestate`
/// under any capitalisation) with `context`, for a hop that continues the
/// trace from a span of its own (a relay's delivery). The old context is
/// dropped even when the new one does not fit ([`insert_trace_context`]).
pub fn replace_trace_context(headers: &mut BTreeMap<String, String>, context: &TraceHeaders) {
    headers.retain(|name, _| {
        !(name.eq_ignore_ascii_case(TRACEPARENT) || name.eq_ignore_ascii_case(TRACESTATE))
    });
    insert_trace_context(headers, &context.traceparent, context.tracestate.as_deref());
}

#[cfg(feature = "otel")]
mod otel {
    use std::collections::HashMap;

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{TraceHeaders, TRACEPARENT, TRACESTATE};

    pub(super) fn current() -> Option<TraceHeaders> {
        let context = tracing::Span::current().context();
        if !context.span().span_context().is_valid() {
            return None;
        }
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        Some(TraceHeaders {
            traceparent: carrier.remove(TRACEPARENT)?,
            tracestate: carrier.remove(TRACESTATE).filter(|state| !state.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparents_follow_the_w3c_format() {
        assert!(valid_traceparent(PARENT));
        assert!(valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later-fields"
        ));
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(!valid_traceparent(bad), "{bad:?} passed");
        }
        assert_eq!(
            traceparent_trace_id(PARENT),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(traceparent_trace_id("garbage"), None);
    }

    #[test]
    fn a_trace_context_the_caller_set_is_never_replaced() {
        let mut headers = BTreeMap::new();
        headers.insert("Traceparent".to_owned(), "theirs".to_owned());
        assert!(!insert_trace_context(&mut headers, PARENT, Some("a=1")));
        assert_eq!(headers.len(), 1);

        let mut headers = BTreeMap::new();
        assert!(insert_trace_context(&mut headers, PARENT, Some("a=1")));
        assert_eq!(headers[TRACEPARENT], PARENT);
        assert_eq!(headers[TRACESTATE], "a=1");
    }

    #[test]
    fn a_trace_context_that_does_not_fit_is_left_out() {
        let mut full: BTreeMap<String, String> = (0..MAX_HEADERS)
            .map(|i| (format!("h{i}"), String::new()))
            .collect();
        assert!(!insert_trace_context(&mut full, PARENT, None));
        assert_eq!(full.len(), MAX_HEADERS);

        let mut one_left: BTreeMap<String, String> = (0..MAX_HEADERS - 1)
            .map(|i| (format!("h{i}"), String::new()))
            .collect();
        assert!(!insert_trace_context(&mut one_left, PARENT, Some("a=1")));
        assert!(insert_trace_context(&mut one_left, PARENT, None));

        let mut headers = BTreeMap::new();
        assert!(!insert_trace_context(
            &mut headers,
            "not-a-traceparent",
            None
        ));
        let long_state = "a".repeat(MAX_HEADER_VALUE_BYTES + 1);
        assert!(insert_trace_context(
            &mut headers,
            PARENT,
            Some(&long_state)
        ));
        assert!(!headers.contains_key(TRACESTATE));
    }

    #[test]
    fn a_relayed_context_replaces_the_old_one_under_any_capitalisation() {
        let mut headers = BTreeMap::new();
        headers.insert("Traceparent".to_owned(), "theirs".to_owned());
        headers.insert("TRACESTATE".to_owned(), "a=1".to_owned());
        headers.insert("other".to_owned(), "kept".to_owned());
        let ours = TraceHeaders {
            traceparent: PARENT.to_owned(),
            tracestate: None,
        };
        replace_trace_context(&mut headers, &ours);
        assert_eq!(headers.len(), 2, "{headers:?}");
        assert_eq!(headers[TRACEPARENT], PARENT);
        assert_eq!(headers["other"], "kept");
    }

    #[test]
    fn without_a_current_context_entries_are_borrowed_unchanged() {
        let entries = vec![NewStreamEntry::new(serde_json::json!({"n": 1}))];
        assert!(matches!(
            entries_with_current_context(&entries),
            Cow::Borrowed(_)
        ));
    }
}
