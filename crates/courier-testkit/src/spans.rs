//! Spans as an OpenTelemetry exporter receives them, for tests of traces:
//! a global subscriber with a `tracing-opentelemetry` layer over the SDK's
//! in-memory exporter, installed once per test binary (so each traces test
//! binary must install no other global subscriber) and read per trace.

use std::sync::OnceLock;

use opentelemetry::trace::{TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

/// The exporter behind this binary's global subscriber, installed on first
/// use. The simple processor exports each span as it ends: nothing to flush.
///
/// # Panics
///
/// When another global subscriber was installed first.
pub fn exporter() -> &'static InMemorySpanExporter {
    static INSTALLED: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    let (exporter, _provider) = INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("courier-tests")));
        if tracing::subscriber::set_global_default(subscriber).is_err() {
            panic!("another global subscriber was installed in this traces test binary");
        }
        (exporter, provider)
    });
    exporter
}

/// The finished spans of `trace`.
pub fn spans_of(trace: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap_or_default()
        .into_iter()
        .filter(|span| span.span_context.trace_id() == trace)
        .collect()
}
