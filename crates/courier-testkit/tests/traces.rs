//! Traces that cross the outbox, on PostgreSQL and SQLite: a message enqueued
//! inside a producer's span carries the span's W3C context in its headers,
//! and its delivery runs in a `courier.deliver` span of the same trace whose
//! parent is the producer's span; a context the caller set is kept; without
//! a current OpenTelemetry context nothing is added.
//!
//! The spans go through `tracing-opentelemetry` to the OpenTelemetry SDK's
//! in-memory exporter. The worker runs on a multi-threaded runtime, so the
//! subscriber is this test binary's global one, installed once; each test
//! reads only the spans of its own trace, so tests running at once in one
//! process (plain `cargo test`) do not see each other's.

use std::time::Duration;

use courier::{handler_fn, AdminStore, HandlerError, Message, NewMessage, TRACEPARENT};
use courier_testkit::{backend_tests, eventually, Backend, Event, RecordEffect};
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId};
use opentelemetry::Value;
use opentelemetry_sdk::trace::SpanData;
use tokio::sync::mpsc;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TOPIC: &str = "invoice.paid";

use courier_testkit::spans::{exporter, spans_of};

/// Finished spans named `name` (of any trace).
fn spans_named(name: &str) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap_or_default()
        .into_iter()
        .filter(|span| span.name == name)
        .collect()
}

/// A span's attribute `key`, as text.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(text) => text.to_string(),
            other => other.to_string(),
        })
}

/// A span as JSON: what the report shows of a trace.
fn span_json(span: &SpanData) -> serde_json::Value {
    let nanos = |time: std::time::SystemTime| {
        time.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos().to_string())
            .unwrap_or_default()
    };
    serde_json::json!({
        "name": span.name,
        "kind": format!("{:?}", span.span_kind),
        "trace_id": span.span_context.trace_id().to_string(),
        "span_id": span.span_context.span_id().to_string(),
        "parent_span_id": span.parent_span_id.to_string(),
        "start_time_unix_nano": nanos(span.start_time),
        "end_time_unix_nano": nanos(span.end_time),
        "attributes": span.attributes.iter()
            .map(|kv| (kv.key.to_string(), serde_json::Value::String(kv.value.to_string())))
            .collect::<serde_json::Map<_, _>>(),
        "links": span.links.iter()
            .map(|link| serde_json::json!({
                "trace_id": link.span_context.trace_id().to_string(),
                "span_id": link.span_context.span_id().to_string(),
            }))
            .collect::<Vec<_>>(),
    })
}

/// A plain handler that reports each message id it handled.
fn reporting(handled: mpsc::UnboundedSender<uuid::Uuid>) -> impl courier::Handler<Payload = Event> {
    handler_fn(move |message: Message<Event>| {
        let handled = handled.clone();
        async move {
            let _ = handled.send(message.id);
            Ok::<(), HandlerError>(())
        }
    })
}

/// The stored header `traceparent` of message `id`.
async fn stored_traceparent<B: Backend>(
    backend: &B,
    id: uuid::Uuid,
) -> anyhow::Result<Option<String>> {
    let (message, _) = backend
        .courier()
        .store()
        .get_message(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("message {id} is not stored"))?;
    Ok(message.headers.get(TRACEPARENT).cloned())
}

/// Waits for `count` finished `courier.deliver` spans in `trace`.
async fn deliver_spans(trace: TraceId, count: usize) -> Vec<SpanData> {
    let finished = || {
        spans_of(trace)
            .into_iter()
            .filter(|span| span.name == "courier.deliver")
            .collect::<Vec<_>>()
    };
    eventually(Duration::from_secs(10), || async {
        finished().len() >= count
    })
    .await;
    finished()
}

async fn a_delivery_span_continues_the_producers_trace<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    exporter();
    let (handled, mut seen) = mpsc::unbounded_channel();
    let worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 1, reporting(handled))
        .maintenance(None)
        .build()
        .await?
        .start();

    let producer = tracing::info_span!("producer");
    let producer_context = producer.context().span().span_context().clone();
    assert!(
        producer_context.is_valid(),
        "the producer span has an OpenTelemetry context"
    );
    let message = NewMessage::new("acme", TOPIC, &Event { n: 7 })?;
    let outcomes = backend
        .enqueue_committed(std::slice::from_ref(&message))
        .instrument(producer.clone())
        .await?;
    drop(producer);
    let id = outcomes[0].id;

    let stored = stored_traceparent(&backend, id).await?;
    assert_eq!(
        stored.as_deref(),
        Some(
            format!(
                "00-{}-{}-01",
                producer_context.trace_id(),
                producer_context.span_id()
            )
            .as_str()
        ),
        "the message carries the producer span's context"
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), seen.recv()).await?,
        Some(id)
    );
    let delivered = deliver_spans(producer_context.trace_id(), 1).await;
    worker.shutdown().await;

    let spans = spans_of(producer_context.trace_id());
    let producer = spans
        .iter()
        .find(|span| span.name == "producer")
        .ok_or_else(|| anyhow::anyhow!("no producer span exported"))?;
    let [deliver] = delivered.as_slice() else {
        anyhow::bail!("expected one courier.deliver span in the trace, got {delivered:?}");
    };
    assert_eq!(
        deliver.span_context.trace_id(),
        producer.span_context.trace_id()
    );
    assert_eq!(
        deliver.parent_span_id,
        producer.span_context.span_id(),
        "the delivery's parent is the producer's span"
    );
    assert_eq!(deliver.span_kind, SpanKind::Consumer);
    let expected = [
        ("messaging.system", "courier".to_owned()),
        ("messaging.operation", "process".to_owned()),
        ("messaging.destination.name", TOPIC.to_owned()),
        ("messaging.message.id", id.to_string()),
        ("subscription", "billing".to_owned()),
        ("tenant", "acme".to_owned()),
        ("topic", TOPIC.to_owned()),
        ("version", "1".to_owned()),
        ("attempt", "1".to_owned()),
    ];
    for (key, value) in expected {
        assert_eq!(
            attribute(deliver, key).as_deref(),
            Some(value.as_str()),
            "attribute {key}"
        );
    }
    println!(
        "{} trace:\n{}",
        B::KIND,
        serde_json::to_string_pretty(&[span_json(producer), span_json(deliver)])?
    );
    Ok(())
}

async fn each_delivery_of_a_transactional_group_continues_its_producers_trace<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    exporter();
    backend.create_effects_table().await?;
    let effects = RecordEffect::default();
    // Built (so registered: owed what is published next) but started only
    // after the publish, so one claim takes all three and runs them as one group.
    let worker = backend
        .courier()
        .worker("ledger")
        .handle_transactional(TOPIC, 1, effects.clone())
        .maintenance(None)
        .build()
        .await?;
    let producer = tracing::info_span!("producer");
    let producer_context = producer.context().span().span_context().clone();
    let messages = courier_testkit::events("acme", TOPIC, 3)?;
    // In Courier's own transaction: the `publish` path.
    backend
        .courier()
        .publish(&messages)
        .instrument(producer.clone())
        .await?;
    drop(producer);
    let worker = worker.start();
    let delivered = deliver_spans(producer_context.trace_id(), 3).await;
    worker.shutdown().await;
    assert_eq!(effects.counter.distinct(), 3);
    assert_eq!(delivered.len(), 3, "one courier.deliver span per delivery");
    for deliver in &delivered {
        assert_eq!(deliver.parent_span_id, producer_context.span_id());
        assert_eq!(
            attribute(deliver, "subscription").as_deref(),
            Some("ledger")
        );
    }
    let linked = spans_named("courier.deliver_batch")
        .into_iter()
        .any(|batch| {
            batch
                .links
                .iter()
                .filter(|link| {
                    link.span_context.trace_id() == producer_context.trace_id()
                        && link.span_context.span_id() == producer_context.span_id()
                })
                .count()
                == 3
        });
    assert!(linked, "the group's span links to each delivery's producer");
    Ok(())
}

async fn a_traceparent_the_caller_set_is_kept<B: Backend>(backend: B) -> anyhow::Result<()> {
    exporter();
    // A trace id of this test's own: the other backend's run of it may
    // share the process (and the exporter).
    let their_trace = uuid::Uuid::new_v4().simple().to_string();
    let theirs = format!("00-{their_trace}-b7ad6b7169203331-01");
    let (handled, mut seen) = mpsc::unbounded_channel();
    let worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 1, reporting(handled))
        .maintenance(None)
        .build()
        .await?
        .start();
    let message = NewMessage::new("acme", TOPIC, &Event { n: 1 })?
        .with_header(TRACEPARENT, &theirs)
        .with_header("tracestate", "vendor=theirs");
    let outcomes = backend
        .enqueue_committed(&[message])
        .instrument(tracing::info_span!("producer"))
        .await?;
    let id = outcomes[0].id;
    assert_eq!(
        stored_traceparent(&backend, id).await?.as_deref(),
        Some(theirs.as_str())
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), seen.recv()).await?,
        Some(id)
    );
    let trace = TraceId::from_hex(&their_trace)?;
    let delivered = deliver_spans(trace, 1).await;
    worker.shutdown().await;
    let [deliver] = delivered.as_slice() else {
        anyhow::bail!("expected one courier.deliver span in the caller's trace, got {delivered:?}");
    };
    assert_eq!(
        deliver.parent_span_id,
        SpanId::from_hex("b7ad6b7169203331")?
    );
    assert_eq!(
        deliver.span_context.trace_state().header(),
        "vendor=theirs",
        "the caller's tracestate travels with it"
    );
    Ok(())
}

async fn without_a_current_span_no_trace_context_is_added<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    exporter();
    let message = NewMessage::new("acme", TOPIC, &Event { n: 1 })?;
    let outcomes = backend.enqueue_committed(&[message]).await?;
    assert_eq!(stored_traceparent(&backend, outcomes[0].id).await?, None);
    Ok(())
}

backend_tests!(
    a_delivery_span_continues_the_producers_trace,
    each_delivery_of_a_transactional_group_continues_its_producers_trace,
    a_traceparent_the_caller_set_is_kept,
    without_a_current_span_no_trace_context_is_added,
);
