//! Traces through streams, on every stream backend (PostgreSQL and SQLite
//! native streams, Redis with its receipts in SQLite): an entry appended
//! inside a span carries the span's W3C context in its headers, and a
//! stream subscription runs its handler — plain or transactional — in a
//! `courier.stream_deliver` span whose parent is the appender's span, so
//! the handler's own spans are in the appender's trace. A context the
//! caller set is kept, and without a current context nothing is added.
//!
//! The spans go through `tracing-opentelemetry` to the OpenTelemetry SDK's
//! in-memory exporter, installed once as this binary's global subscriber;
//! each test reads only the spans of its own trace.

use std::time::Duration;

use courier::{
    stream_handler_fn, GroupStart, HandlerError, NewStreamEntry, StreamKey, StreamMessage,
    StreamReceipts, StreamStore, StreamSubscription, StreamSubscriptionConfig,
    TransactionalStreamHandler, TRACEPARENT,
};
use courier_testkit::spans::{exporter, spans_of};
use courier_testkit::{Backend, PgFixture, RedisStreamFixture, SqliteFixture, StreamFixture};
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId};
use opentelemetry::Value;
use opentelemetry_sdk::trace::SpanData;
use serde_json::json;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A case's streams and the database its receipts are in.
struct Setup<S, R> {
    streams: S,
    receipts: R,
    /// The fixtures, kept for the case's length.
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

async fn postgres() -> anyhow::Result<Setup<courier::postgres::PgStore, courier::postgres::PgStore>>
{
    let fixture = PgFixture::new().await?;
    let store = fixture.courier().store().clone();
    Ok(Setup {
        streams: store.clone(),
        receipts: store,
        _keep: vec![Box::new(fixture)],
    })
}

async fn sqlite(
) -> anyhow::Result<Setup<courier::sqlite::SqliteStore, courier::sqlite::SqliteStore>> {
    let fixture = SqliteFixture::new().await?;
    let store = fixture.courier().store().clone();
    Ok(Setup {
        streams: store.clone(),
        receipts: store,
        _keep: vec![Box::new(fixture)],
    })
}

async fn redis(
) -> anyhow::Result<Setup<courier::redis::RedisStreamStore, courier::sqlite::SqliteStore>> {
    let redis = RedisStreamFixture::fresh().await?;
    let db = SqliteFixture::new().await?;
    Ok(Setup {
        streams: redis.store().clone(),
        receipts: db.courier().store().clone(),
        _keep: vec![Box::new(redis), Box::new(db)],
    })
}

fn config(name: &str, key: &StreamKey) -> anyhow::Result<StreamSubscriptionConfig> {
    let mut config = StreamSubscriptionConfig::new(name, key.clone())?;
    config.consumer = format!("{name}-test");
    config.start = GroupStart::Beginning;
    Ok(config)
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

/// Steps `subscription` until `trace` has a finished span named `name`.
async fn step_until_span<S: StreamStore, R: StreamReceipts>(
    subscription: &StreamSubscription<S, R>,
    trace: TraceId,
    name: &str,
) -> anyhow::Result<SpanData> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        subscription.step().await?;
        if let Some(span) = spans_of(trace).into_iter().find(|span| span.name == name) {
            return Ok(span);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no {name} span in trace {trace} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stream's first entry, once it is readable.
async fn first_entry<S: StreamStore>(
    store: &S,
    key: &StreamKey,
) -> anyhow::Result<courier::StreamEntry> {
    courier_testkit::readable_entries(store, key, 1)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the appended entry of {key} is not readable within 30 s"))
}

/// The handler's own span: what the handler's work records.
fn handler_work() {
    let _work = tracing::info_span!("handler.work").entered();
}

/// Runs [`handler_work`] inside the receipt's transaction.
struct TracedEffect;

impl<C: Send> TransactionalStreamHandler<C> for TracedEffect {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        _message: &StreamMessage<serde_json::Value>,
        _conn: &mut C,
    ) -> Result<(), HandlerError> {
        handler_work();
        Ok(())
    }
}

/// Appends one entry inside a span of its own; the handler (plain or
/// transactional) runs in `courier.stream_deliver`, the appender's child,
/// and the handler's own span is that span's child.
async fn a_stream_handler_continues_the_appenders_trace<S, R>(
    setup: Setup<S, R>,
    transactional: bool,
) -> anyhow::Result<()>
where
    S: StreamStore + Clone,
    R: StreamReceipts + Clone,
{
    exporter();
    let key = StreamKey::new("acme", format!("events-{}", fastrand::u32(..)))?;
    let config = config("billing", &key)?;
    let subscription = if transactional {
        StreamSubscription::transactional(
            setup.streams.clone(),
            setup.receipts.clone(),
            config,
            TracedEffect,
        )?
    } else {
        StreamSubscription::new(
            setup.streams.clone(),
            setup.receipts.clone(),
            config,
            stream_handler_fn(|_: StreamMessage<serde_json::Value>| async {
                handler_work();
                Ok::<(), HandlerError>(())
            }),
        )?
    };
    subscription.ensure_group().await?;

    let appender = tracing::info_span!("appender");
    let appender_context = appender.context().span().span_context().clone();
    assert!(
        appender_context.is_valid(),
        "the appender span has a context"
    );
    let ids = setup
        .streams
        .append(&key, &[NewStreamEntry::new(json!({ "n": 1 }))])
        .instrument(appender.clone())
        .await?;
    drop(appender);
    let trace = appender_context.trace_id();

    let stored = first_entry(&setup.streams, &key).await?;
    assert_eq!(
        stored.headers.get(TRACEPARENT).map(String::as_str),
        Some(format!("00-{trace}-{}-01", appender_context.span_id()).as_str()),
        "the entry carries the appender span's context"
    );

    let work = step_until_span(&subscription, trace, "handler.work").await?;
    // Its parent ends after it, and once (CI, under load) was not yet
    // exported when the handler's span was; the cause was not found.
    let deliver = step_until_span(&subscription, trace, "courier.stream_deliver").await?;
    assert_eq!(
        deliver.parent_span_id,
        appender_context.span_id(),
        "the handler's span is the appender's child"
    );
    assert_eq!(
        work.parent_span_id,
        deliver.span_context.span_id(),
        "the handler's own spans are children of courier.stream_deliver"
    );
    assert_eq!(deliver.span_kind, SpanKind::Consumer);
    let stream = key.stream().to_owned();
    let entry_id = ids[0].to_string();
    for (name, value) in [
        ("messaging.system", "courier"),
        ("messaging.operation", "process"),
        ("messaging.destination.name", stream.as_str()),
        ("messaging.consumer.group.name", "billing"),
        ("messaging.message.id", entry_id.as_str()),
        ("subscription", "billing"),
        ("tenant", "acme"),
        ("stream", stream.as_str()),
        ("entry_id", entry_id.as_str()),
        ("delivery", "1"),
    ] {
        assert_eq!(
            attribute(&deliver, name).as_deref(),
            Some(value),
            "attribute {name}"
        );
    }
    Ok(())
}

/// An entry appended with a `traceparent` of its own keeps it, and its
/// handler continues that trace rather than the appender's span.
async fn a_traceparent_the_appender_set_is_kept<S, R>(setup: Setup<S, R>) -> anyhow::Result<()>
where
    S: StreamStore + Clone,
    R: StreamReceipts + Clone,
{
    exporter();
    let key = StreamKey::new("acme", format!("events-{}", fastrand::u32(..)))?;
    let subscription = StreamSubscription::new(
        setup.streams.clone(),
        setup.receipts.clone(),
        config("billing", &key)?,
        stream_handler_fn(|_: StreamMessage<serde_json::Value>| async {
            handler_work();
            Ok::<(), HandlerError>(())
        }),
    )?;
    subscription.ensure_group().await?;
    let their_trace = uuid::Uuid::new_v4().simple().to_string();
    let theirs = format!("00-{their_trace}-b7ad6b7169203331-01");
    let mut entry = NewStreamEntry::new(json!({ "n": 1 }));
    entry.headers.insert(TRACEPARENT.to_owned(), theirs.clone());
    setup
        .streams
        .append(&key, &[entry])
        .instrument(tracing::info_span!("appender"))
        .await?;
    let stored = first_entry(&setup.streams, &key).await?;
    assert_eq!(
        stored.headers.get(TRACEPARENT),
        Some(&theirs),
        "the appender's own context is never replaced"
    );
    step_until_span(
        &subscription,
        TraceId::from_hex(&their_trace)?,
        "handler.work",
    )
    .await?;
    let deliver = step_until_span(
        &subscription,
        TraceId::from_hex(&their_trace)?,
        "courier.stream_deliver",
    )
    .await?;
    assert_eq!(
        deliver.parent_span_id,
        SpanId::from_hex("b7ad6b7169203331")?
    );
    Ok(())
}

/// Outside any span an entry gets no trace context.
async fn without_a_current_span_no_trace_context_is_added<S, R>(
    setup: Setup<S, R>,
) -> anyhow::Result<()>
where
    S: StreamStore + Clone,
    R: StreamReceipts + Clone,
{
    exporter();
    let key = StreamKey::new("acme", format!("events-{}", fastrand::u32(..)))?;
    setup
        .streams
        .append(&key, &[NewStreamEntry::new(json!({ "n": 1 }))])
        .await?;
    let stored = first_entry(&setup.streams, &key).await?;
    assert!(stored.headers.is_empty(), "{:?}", stored.headers);
    Ok(())
}

macro_rules! on_every_stream_backend {
    ($($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_plain_stream_handler_continues_the_appenders_trace() -> anyhow::Result<()> {
                    super::a_stream_handler_continues_the_appenders_trace(super::$backend().await?, false).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_transactional_stream_handler_continues_the_appenders_trace() -> anyhow::Result<()> {
                    super::a_stream_handler_continues_the_appenders_trace(super::$backend().await?, true).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_traceparent_the_appender_set_is_kept() -> anyhow::Result<()> {
                    super::a_traceparent_the_appender_set_is_kept(super::$backend().await?).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn without_a_current_span_no_trace_context_is_added() -> anyhow::Result<()> {
                    super::without_a_current_span_no_trace_context_is_added(super::$backend().await?).await
                }
            }
        )*
    };
}

on_every_stream_backend!(postgres, sqlite, redis);
