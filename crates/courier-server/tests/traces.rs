//! Traces through the daemon, on PostgreSQL and SQLite: a publish request's
//! `traceparent` (and `tracestate`) become the message's headers, a malformed
//! one is ignored; a webhook endpoint receives a `traceparent` in the
//! producer's trace whose parent is the delivery's `courier.deliver` span,
//! and so do the entries relays write to native and Redis streams and the
//! messages they publish to JetStream.
//!
//! Spans go through `tracing-opentelemetry` to the OpenTelemetry SDK's
//! in-memory exporter, behind this binary's global subscriber (the daemon's
//! workers run on a multi-threaded runtime); each test reads only its own
//! trace.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod relay_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use common::{app, get, message, post_raw, standard_tokens};
use courier::{AdminStore, Courier, DeadLetterStore, OutboxStore};
use courier_server::config::{Config, Secret, SubscriptionConfig, TargetConfig, WebhookConfig};
use opentelemetry::trace::TraceId;
use serde_json::{json, Value};

const LIMIT: usize = 4096;

use courier_testkit::spans::{exporter, spans_of};

/// A fresh traceparent of a trace of its own: (header, trace id, parent id).
fn fresh_traceparent() -> (String, String, String) {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let parent = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    (format!("00-{trace}-{parent}-01"), trace, parent)
}

/// Publishes an `invoice.paid` message of tenant `acme` through the daemon
/// at `address` with a fresh `traceparent`; returns its (trace id, parent
/// span id).
async fn publish_traced(address: SocketAddr) -> (String, String) {
    let (traceparent, trace, producer_span) = fresh_traceparent();
    let response = reqwest::Client::new()
        .post(format!("http://{address}/v1/messages"))
        .header("content-type", "application/json")
        .header("traceparent", &traceparent)
        .body(json!({"tenant": "acme", "topic": "invoice.paid", "payload": {"n": 1}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    (trace, producer_span)
}

async fn stored_headers(app: &axum::Router, id: &str) -> Value {
    let read = get(app, &format!("/v1/messages/{id}"), Some("all")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);
    read.body["headers"].clone()
}

async fn a_publish_request_s_traceparent_becomes_the_message_s_and_a_malformed_one_is_ignored<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let body = message("a", "invoice.paid").to_string();
    let (traceparent, _, _) = fresh_traceparent();

    let traced = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        body.clone(),
        &[("traceparent", &traceparent), ("tracestate", "vendor=1")],
    )
    .await;
    assert_eq!(traced.status, StatusCode::CREATED, "{}", traced.text);
    assert_eq!(
        stored_headers(&app, traced.body["id"].as_str().unwrap()).await,
        json!({"traceparent": traceparent, "tracestate": "vendor=1"})
    );

    for malformed in [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    ] {
        let ignored = post_raw(
            &app,
            "/v1/messages",
            Some("all"),
            body.clone(),
            &[("traceparent", malformed), ("tracestate", "vendor=1")],
        )
        .await;
        assert_eq!(
            ignored.status,
            StatusCode::CREATED,
            "{malformed}: {}",
            ignored.text
        );
        assert_eq!(
            stored_headers(&app, ignored.body["id"].as_str().unwrap()).await,
            json!({}),
            "{malformed} is ignored, and its tracestate with it"
        );
    }

    // The body's own context wins over the request's.
    let (theirs, _, _) = fresh_traceparent();
    let mut own = message("a", "invoice.paid");
    own["headers"] = json!({"traceparent": theirs});
    let kept = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        own.to_string(),
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(kept.status, StatusCode::CREATED, "{}", kept.text);
    assert_eq!(
        stored_headers(&app, kept.body["id"].as_str().unwrap()).await,
        json!({"traceparent": theirs})
    );

    // A batch: every message without its own context gets the request's.
    let batch = json!({"messages": [message("a", "invoice.paid"), own]});
    let stored = post_raw(
        &app,
        "/v1/messages/batch",
        Some("all"),
        batch.to_string(),
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(stored.status, StatusCode::CREATED, "{}", stored.text);
    let ids: Vec<String> = stored.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        stored_headers(&app, &ids[0]).await,
        json!({"traceparent": traceparent})
    );
    assert_eq!(
        stored_headers(&app, &ids[1]).await,
        json!({"traceparent": theirs})
    );
    Ok(())
}

api_tests!(a_publish_request_s_traceparent_becomes_the_message_s_and_a_malformed_one_is_ignored,);

/// Every request's headers the receiver got.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<HeaderMap>>>);

async fn start_receiver() -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let app =
        axum::Router::new()
            .fallback(
                |axum::extract::State(receiver): axum::extract::State<Receiver>,
                 headers: HeaderMap| async move {
                    receiver.0.lock().unwrap().push(headers);
                    StatusCode::OK
                },
            )
            .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, address)
}

/// A daemon bound for a test, stopped by [`Running::stop`].
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), courier_server::ServeError>>,
}

impl Running {
    /// Binds a daemon with `config`; returns its address.
    async fn start(config: Config) -> (SocketAddr, Self) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let address = running.local_addr();
        let done = tokio::spawn(running.finished());
        (address, Self { stop, done })
    }

    /// Stops the daemon and waits until it has.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.done.await.unwrap().unwrap();
    }
}

/// Publishes with `traceparent` through a daemon on `database_url` (and
/// `schema`) whose webhook subscription posts to a receiver; checks the
/// `traceparent` the receiver got.
async fn the_webhook_endpoint_gets_the_delivery_span_s_traceparent(
    database_url: String,
    schema: String,
) {
    exporter();
    let (receiver, receiver_address) = start_receiver().await;
    let subscription = SubscriptionConfig::new(
        "hook",
        vec!["*".into()],
        TargetConfig::Webhook(WebhookConfig::new(
            format!("http://{receiver_address}/hook"),
            Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
        )),
    );
    let config = Config {
        database_url,
        schema,
        listen: "127.0.0.1:0".parse().unwrap(),
        subscriptions: vec![subscription],
        ..Config::default()
    };
    let (address, daemon) = Running::start(config).await;

    let (trace, producer_span) = publish_traced(address).await;
    let arrived = courier_testkit::eventually(Duration::from_secs(10), || async {
        !receiver.0.lock().unwrap().is_empty()
    })
    .await;
    assert!(arrived, "the webhook was not called");
    daemon.stop().await;

    let sent = receiver.0.lock().unwrap()[0]
        .get("traceparent")
        .expect("the webhook request has a traceparent")
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        courier::traceparent_trace_id(&sent),
        Some(trace.as_str()),
        "the endpoint is in the producer's trace: {sent}"
    );
    let deliver = spans_of(TraceId::from_hex(&trace).unwrap())
        .into_iter()
        .find(|span| span.name == "courier.deliver")
        .expect("a courier.deliver span in the producer's trace");
    assert_eq!(
        deliver.parent_span_id.to_string(),
        producer_span,
        "the delivery's parent is the publisher's span"
    );
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", deliver.span_context.span_id()),
        "the endpoint's parent is the delivery's span, not the publisher's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_webhook_endpoint_gets_the_delivery_span_s_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("courier.db").to_str().unwrap().to_owned();
    the_webhook_endpoint_gets_the_delivery_span_s_traceparent(url, "courier".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_webhook_endpoint_gets_the_delivery_span_s_traceparent() {
    let fixture = courier_testkit::PgFixture::new().await.unwrap();
    the_webhook_endpoint_gets_the_delivery_span_s_traceparent(
        courier_testkit::database_url(),
        fixture.schema.clone(),
    )
    .await;
}

/// Entries of `stream` (tenant `acme`) read through the daemon at `address`.
async fn stream_entries(address: SocketAddr, stream: &str) -> Vec<Value> {
    let text = reqwest::Client::new()
        .get(format!("http://{address}/v1/streams/acme/{stream}/entries"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    body["entries"].as_array().cloned().unwrap_or_default()
}

/// Through a daemon on `database_url` (and `schema`): a message relayed to a
/// native stream carries the relay delivery span's `traceparent` (in the
/// publisher's trace); `POST …/entries` stores the request's `traceparent`
/// in each entry without one of its own, ignoring a malformed one; and a
/// stream subscription's webhook gets the `traceparent` of its
/// `courier.stream_deliver` span, the appender's child.
async fn streams_carry_trace_context_through_relays_appends_and_stream_webhooks(
    database_url: String,
    schema: String,
) {
    exporter();
    let (receiver, receiver_address) = start_receiver().await;
    let subscription = SubscriptionConfig::new(
        "to-stream",
        vec!["invoice.*".into()],
        TargetConfig::Stream(courier_server::config::NativeStreamTargetConfig {
            stream: "relayed".into(),
        }),
    );
    let config = Config {
        database_url,
        schema,
        listen: "127.0.0.1:0".parse().unwrap(),
        subscriptions: vec![subscription],
        stream_subscriptions: Config::from_toml_str(&format!(
            r#"
            [[stream_subscriptions]]
            name = "hook"
            tenant = "acme"
            stream = "appended"
            start = "beginning"
            block_ms = 100
            [stream_subscriptions.target]
            type = "webhook"
            url = "http://{receiver_address}/streams"
            secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            "#
        ))
        .unwrap()
        .stream_subscriptions,
        ..Config::default()
    };
    let (address, daemon) = Running::start(config).await;
    let client = reqwest::Client::new();

    // A relayed message: the entry continues from the relay's delivery span.
    let (trace, producer_span) = publish_traced(address).await;
    let relayed = courier_testkit::eventually(Duration::from_secs(10), || async {
        !stream_entries(address, "relayed").await.is_empty()
    })
    .await;
    assert!(relayed, "the message was not relayed");
    let entries = stream_entries(address, "relayed").await;
    let sent = entries[0]["headers"]["traceparent"]
        .as_str()
        .expect("the relayed entry has a traceparent")
        .to_owned();
    let deliver = spans_of(TraceId::from_hex(&trace).unwrap())
        .into_iter()
        .find(|span| span.name == "courier.deliver")
        .expect("the relay's courier.deliver span in the publisher's trace");
    assert_eq!(deliver.parent_span_id.to_string(), producer_span);
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", deliver.span_context.span_id()),
        "the entry's parent is the relay's delivery span, not the publisher's"
    );

    // An append request: its context goes into entries without their own.
    let (traceparent, trace, appender_span) = fresh_traceparent();
    let (theirs, _, _) = fresh_traceparent();
    let append = |traceparent: String, body: Value| {
        let client = client.clone();
        async move {
            let response = client
                .post(format!("http://{address}/v1/streams/acme/appended/entries"))
                .header("content-type", "application/json")
                .header("traceparent", traceparent)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201);
        }
    };
    append(
        traceparent.clone(),
        json!({"entries": [
            {"payload": {"n": 1}},
            {"payload": {"n": 2}, "headers": {"traceparent": theirs}},
        ]}),
    )
    .await;
    append(
        "00-not-a-traceparent".into(),
        json!({"entries": [{"payload": {"n": 3}}]}),
    )
    .await;
    // On PostgreSQL entries are readable once no older transaction is open.
    courier_testkit::eventually(Duration::from_secs(30), || async {
        stream_entries(address, "appended").await.len() >= 3
    })
    .await;
    let appended = stream_entries(address, "appended").await;
    let headers: Vec<&Value> = appended.iter().map(|e| &e["headers"]).collect();
    assert_eq!(
        headers,
        [
            &json!({"traceparent": traceparent}),
            &json!({"traceparent": theirs}),
            &json!({}),
        ]
    );

    // The stream subscription's webhook continues from its handler's span.
    let delivered = courier_testkit::eventually(Duration::from_secs(10), || async {
        receiver.0.lock().unwrap().len() >= 3
    })
    .await;
    assert!(
        delivered,
        "the stream webhook did not get the three entries"
    );
    daemon.stop().await;
    let first = appended[0]["id"].as_str().unwrap();
    let sent = receiver
        .0
        .lock()
        .unwrap()
        .iter()
        .find(|headers| {
            headers
                .get("courier-entry-id")
                .and_then(|v| v.to_str().ok())
                == Some(first)
        })
        .and_then(|headers| headers.get("traceparent"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .expect("the first entry's webhook request has a traceparent");
    let deliver = spans_of(TraceId::from_hex(&trace).unwrap())
        .into_iter()
        .find(|span| span.name == "courier.stream_deliver")
        .expect("a courier.stream_deliver span in the appender's trace");
    assert_eq!(
        deliver.parent_span_id.to_string(),
        appender_span,
        "the handler's span is the appender's child"
    );
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", deliver.span_context.span_id()),
        "the endpoint's parent is the stream handler's span"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_streams_carry_trace_context_through_relays_appends_and_stream_webhooks() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("courier.db").to_str().unwrap().to_owned();
    streams_carry_trace_context_through_relays_appends_and_stream_webhooks(url, "courier".into())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_streams_carry_trace_context_through_relays_appends_and_stream_webhooks() {
    let fixture = courier_testkit::PgFixture::new().await.unwrap();
    streams_carry_trace_context_through_relays_appends_and_stream_webhooks(
        courier_testkit::database_url(),
        fixture.schema.clone(),
    )
    .await;
}

/// The `courier.deliver` span of `subscription` in `trace`, once exported.
async fn delivery_span_of(trace: &str, subscription: &str) -> opentelemetry_sdk::trace::SpanData {
    let trace = TraceId::from_hex(trace).unwrap();
    let find = || {
        spans_of(trace).into_iter().find(|span| {
            span.name == "courier.deliver"
                && span.attributes.iter().any(|kv| {
                    kv.key.as_str() == "subscription" && kv.value.as_str() == subscription
                })
        })
    };
    courier_testkit::eventually(Duration::from_secs(10), || async { find().is_some() }).await;
    find().unwrap_or_else(|| panic!("no courier.deliver span of {subscription} was exported"))
}

/// A message relayed to a Redis stream and published to a JetStream carries
/// in each the `traceparent` of that relay's own `courier.deliver` span (the
/// publisher's child), not the publisher's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_to_redis_and_nats_send_their_delivery_span_s_traceparent() {
    use relay_support::{
        create_jetstream, delete_jetstream, delete_prefix, jetstream_messages, key, nats_client,
        nats_section, nats_target, nats_url, read_all, redis_section, redis_store, redis_target,
        redis_url, subscription, tag, Daemon, Db,
    };
    exporter();
    let db = Db::sqlite().await;
    let tag = tag();
    let prefix = format!("t_{tag}:");
    let jetstream = format!("T_{tag}");
    let nats = nats_client(&nats_url()).await;
    create_jetstream(
        &nats,
        &jetstream,
        &format!("t_{tag}.>"),
        Duration::from_secs(3600),
    )
    .await;
    let mut config = db.config(vec![
        subscription("to-redis", &["invoice.*"], redis_target("relayed")),
        subscription(
            "to-nats",
            &["invoice.*"],
            nats_target(&format!("t_{tag}.{{tenant}}.{{topic}}"), &jetstream),
        ),
    ]);
    config.redis = redis_section(&redis_url(), &prefix);
    config.nats = nats_section(&nats_url());
    let daemon = Daemon::start(config).await.unwrap();

    let (trace, producer_span) = publish_traced(daemon.address).await;
    db.wait_drained("to-redis", Duration::from_secs(30)).await;
    db.wait_drained("to-nats", Duration::from_secs(30)).await;

    let store = redis_store(&redis_url(), &prefix).await;
    let entries = read_all(&store, &key("acme", "relayed")).await;
    assert_eq!(entries.len(), 1);
    let to_redis = delivery_span_of(&trace, "to-redis").await;
    assert_eq!(to_redis.parent_span_id.to_string(), producer_span);
    assert_eq!(
        entries[0].headers.get("traceparent"),
        Some(&format!(
            "00-{trace}-{}-01",
            to_redis.span_context.span_id()
        )),
        "the Redis entry's parent is the Redis relay's delivery span"
    );

    let published = jetstream_messages(&nats, &jetstream).await;
    assert_eq!(published.len(), 1);
    let to_nats = delivery_span_of(&trace, "to-nats").await;
    assert_eq!(to_nats.parent_span_id.to_string(), producer_span);
    assert_ne!(
        to_nats.span_context.span_id(),
        to_redis.span_context.span_id()
    );
    assert_eq!(
        published[0].headers.get("traceparent"),
        Some(&format!("00-{trace}-{}-01", to_nats.span_context.span_id())),
        "the JetStream message's parent is the NATS relay's delivery span"
    );

    daemon.shutdown().await;
    delete_jetstream(&nats, &jetstream).await;
    delete_prefix(&redis_url(), &prefix).await;
}
