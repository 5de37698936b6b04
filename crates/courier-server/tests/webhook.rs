//! Webhook delivery end to end: the daemon (`courier_server::bind` on port 0)
//! delivers to a real in-test axum receiver on 127.0.0.1:0, on SQLite and
//! PostgreSQL.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use courier_server::config::{
    Config, RetryConfig, Secret, SubscriptionConfig, TargetConfig, WebhookConfig, WebhookFormat,
};
use courier_server::webhook::{verify, DEFAULT_TOLERANCE};
use serde_json::{json, Value};
use tokio::sync::oneshot;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// A second secret, raw text (its bytes are the key).
const NEXT_SECRET: &str = "the next secret, 24 bytes or more";

/// What the receiver answers, per path, in order; 200 once a script runs out.
#[derive(Clone)]
enum Answer {
    Status(u16, Option<&'static str>, &'static str),
    Hang,
}

#[derive(Debug, Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

#[derive(Clone, Default)]
struct Receiver {
    log: Arc<Mutex<Vec<Received>>>,
    scripts: Arc<Mutex<HashMap<String, VecDeque<Answer>>>>,
}

impl Receiver {
    fn script(&self, path: &str, answers: &[Answer]) {
        self.scripts
            .lock()
            .unwrap()
            .insert(path.to_owned(), answers.iter().cloned().collect());
    }

    fn requests(&self, path: &str) -> Vec<Received> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    receiver.log.lock().unwrap().push(Received {
        path: path.clone(),
        headers,
        body,
        at: Instant::now(),
    });
    let answer = receiver
        .scripts
        .lock()
        .unwrap()
        .get_mut(&path)
        .and_then(VecDeque::pop_front);
    match answer {
        None => StatusCode::OK.into_response(),
        Some(Answer::Hang) => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::OK.into_response()
        }
        Some(Answer::Status(code, retry_after, text)) => {
            let status = StatusCode::from_u16(code).unwrap();
            match retry_after {
                Some(seconds) => (status, [("retry-after", seconds)], text).into_response(),
                None => (status, text).into_response(),
            }
        }
    }
}

async fn start_receiver() -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let app = axum::Router::new()
        .fallback(receive)
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, address)
}

fn webhook(name: &str, topics: &[&str], url: String) -> SubscriptionConfig {
    SubscriptionConfig {
        name: name.into(),
        topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        tenants: None,
        versions: None,
        topic_retry: Default::default(),
        retry: RetryConfig {
            max_attempts: 10,
            base_ms: 20,
            cap_ms: 50,
        },
        concurrency: 4,
        replay: None,
        target: TargetConfig::Webhook(WebhookConfig::new(url, Secret(SECRET.into()))),
    }
}

/// Two subscriptions of every topic to `address`: `raw` (format raw, path
/// `/raw`) and `enveloped` (format envelope, path `/envelope`).
fn raw_and_enveloped(address: SocketAddr) -> Vec<SubscriptionConfig> {
    let raw = webhook("raw", &["*"], format!("http://{address}/raw"));
    let mut enveloped = webhook("enveloped", &["*"], format!("http://{address}/envelope"));
    let TargetConfig::Webhook(target) = &mut enveloped.target else {
        panic!("not a webhook");
    };
    target.format = WebhookFormat::Envelope;
    vec![raw, enveloped]
}

/// Where the daemon stores: a database URL and schema, and what keeps it alive.
struct Database {
    url: String,
    schema: String,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn sqlite() -> Database {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("courier.db").to_str().unwrap().to_owned();
    Database {
        url,
        schema: "courier".into(),
        _keep: Box::new(dir),
    }
}

async fn postgres() -> Database {
    let fixture = courier_testkit::PgFixture::new().await.unwrap();
    Database {
        url: courier_testkit::database_url(),
        schema: fixture.schema.clone(),
        _keep: Box::new(fixture),
    }
}

struct Daemon {
    address: SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), courier_server::ServeError>>,
    client: reqwest::Client,
}

impl Daemon {
    async fn start(
        database: &Database,
        subscriptions: Vec<SubscriptionConfig>,
        shutdown_ms: u64,
    ) -> Self {
        let config = Config {
            database_url: database.url.clone(),
            schema: database.schema.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            shutdown_timeout_ms: shutdown_ms,
            subscriptions,
            ..Config::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let running = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let address = running.local_addr();
        let done = tokio::spawn(running.finished());
        Self {
            address,
            stop,
            done,
            client: reqwest::Client::new(),
        }
    }

    async fn publish(&self, tenant: &str, topic: &str, payload: Value) -> String {
        self.publish_request(json!({"tenant": tenant, "topic": topic, "payload": payload}))
            .await
    }

    /// POSTs `request` as a `POST /v1/messages` body; the new message's id.
    async fn publish_request(&self, request: Value) -> String {
        self.publish_text(&request.to_string()).await
    }

    /// POSTs `text` as a `POST /v1/messages` body exactly; the new message's id.
    async fn publish_text(&self, text: &str) -> String {
        let response = self
            .client
            .post(format!("http://{}/v1/messages", self.address))
            .header("content-type", "application/json")
            .body(text.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        body["id"].as_str().unwrap().to_owned()
    }

    /// POSTs an empty JSON object to `path`: its status and body.
    async fn post_empty(&self, path: &str) -> (u16, Value) {
        let response = self
            .client
            .post(format!("http://{}{path}", self.address))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or(Value::Null);
        (status, body)
    }

    async fn get(&self, path: &str) -> Value {
        let response = self
            .client
            .get(format!("http://{}{path}", self.address))
            .send()
            .await
            .unwrap();
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
    }

    async fn text(&self, path: &str) -> String {
        let response = self
            .client
            .get(format!("http://{}{path}", self.address))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    }

    /// The state of `id` in `subscription`, if it is owed to it.
    async fn state(&self, id: &str, subscription: &str) -> Option<String> {
        let message = self.get(&format!("/v1/messages/{id}")).await;
        message["deliveries"]
            .as_array()?
            .iter()
            .find(|d| d["subscription"] == json!(subscription))
            .and_then(|d| d["state"].as_str().map(str::to_owned))
    }

    async fn wait_for_state(&self, id: &str, subscription: &str, state: &str) {
        let reached = courier_testkit::eventually(Duration::from_secs(30), || async {
            self.state(id, subscription).await.as_deref() == Some(state)
        })
        .await;
        assert!(
            reached,
            "{id} never reached {state} in {subscription}: {:?}",
            self.state(id, subscription).await
        );
    }

    async fn shutdown(self) {
        let _ = self.stop.send(());
        let result = tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("the daemon did not stop within 30 s")
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
}

async fn signed_deliveries_reach_the_receiver(database: Database) {
    let (receiver, address) = start_receiver().await;
    let mut hooks = webhook("hooks", &["invoice.*"], format!("http://{address}/hooks"));
    hooks.tenants = Some(vec!["acme".into()]);
    let daemon = Daemon::start(&database, vec![hooks], 5_000).await;

    let paid = daemon
        .publish("acme", "invoice.paid", json!({"n": 1, "why": "paid"}))
        .await;
    let other_tenant = daemon
        .publish("globex", "invoice.paid", json!({"n": 2}))
        .await;
    let other_topic = daemon
        .publish("acme", "customer.created", json!({"n": 3}))
        .await;
    daemon.wait_for_state(&paid, "hooks", "completed").await;
    daemon
        .wait_for_state(&other_tenant, "hooks", "completed")
        .await;
    assert_eq!(daemon.state(&other_topic, "hooks").await, None);

    let requests = receiver.requests("/hooks");
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    let header = |name: &str| request.headers[name].to_str().unwrap().to_owned();
    assert_eq!(header("webhook-id"), format!("hooks:{paid}"));
    assert_eq!(header("courier-message-id"), paid);
    assert_eq!(header("content-type"), "application/json");
    assert_eq!(header("courier-tenant"), "acme");
    assert_eq!(header("courier-topic"), "invoice.paid");
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - timestamp).abs() < 60);
    let secret = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        SECRET.trim_start_matches("whsec_"),
    )
    .unwrap();
    assert!(verify(
        &secret,
        &format!("hooks:{paid}"),
        timestamp,
        &request.body,
        &header("webhook-signature"),
        DEFAULT_TOLERANCE,
    ));
    assert!(!verify(
        b"another secret of 24 bytes or more",
        &format!("hooks:{paid}"),
        timestamp,
        &request.body,
        &header("webhook-signature"),
        DEFAULT_TOLERANCE,
    ));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({"n": 1, "why": "paid"}));
    daemon.shutdown().await;
}

async fn deliveries_carry_the_message_s_metadata_and_headers_raw_or_enveloped(database: Database) {
    let (receiver, address) = start_receiver().await;
    let daemon = Daemon::start(&database, raw_and_enveloped(address), 5_000).await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = daemon
        .publish_request(json!({
            "tenant": "acme",
            "topic": "invoice.paid",
            "schema_version": 2,
            "ordering_key": "customer-7",
            "payload": {"n": 1},
            "headers": {
                "traceparent": traceparent,
                "tracestate": "congo=t61rcWkgMzE",
                "X-Request-Id": "r-1",
                // Never forwarded: signing, Courier's own, hop-by-hop,
                // credentials, not a header name, not a header value.
                "webhook-id": "forged",
                "courier-tenant": "forged",
                "connection": "close",
                "authorization": "Bearer stolen",
                "not a name": "x",
                "x-two-lines": "a\r\nx-injected: 1",
            },
        }))
        .await;
    daemon.wait_for_state(&id, "raw", "completed").await;
    daemon.wait_for_state(&id, "enveloped", "completed").await;
    let message = daemon.get(&format!("/v1/messages/{id}")).await;

    for path in ["/raw", "/envelope"] {
        let requests = receiver.requests(path);
        assert_eq!(requests.len(), 1, "{path}: {requests:?}");
        let headers = &requests[0].headers;
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_else(|| panic!("{path} got no {name}: {headers:?}"))
        };
        assert_eq!(header("courier-tenant"), "acme", "{path}");
        assert_eq!(header("courier-topic"), "invoice.paid", "{path}");
        assert_eq!(header("courier-schema-version"), "2", "{path}");
        assert_eq!(header("courier-ordering-key"), "customer-7", "{path}");
        assert_eq!(header("courier-message-id"), id, "{path}");
        assert_eq!(header("courier-attempt"), "1", "{path}");
        assert_eq!(header("traceparent"), traceparent, "{path}");
        assert_eq!(header("tracestate"), "congo=t61rcWkgMzE", "{path}");
        assert_eq!(header("x-request-id"), "r-1", "{path}");
        assert_eq!(header("content-type"), "application/json", "{path}");
        assert_ne!(header("webhook-id"), "forged", "{path}");
        for absent in ["connection", "authorization", "x-two-lines", "x-injected"] {
            assert!(headers.get(absent).is_none(), "{path} got {absent}");
        }
        assert_eq!(headers.get_all("courier-tenant").iter().count(), 1);
    }
    let raw: Value = serde_json::from_slice(&receiver.requests("/raw")[0].body).unwrap();
    assert_eq!(raw, json!({"n": 1}));
    let envelope: Value = serde_json::from_slice(&receiver.requests("/envelope")[0].body).unwrap();
    assert_eq!(envelope["type"], json!("invoice.paid"), "{envelope}");
    assert_eq!(envelope["data"], json!({"n": 1}), "{envelope}");
    let timestamp =
        chrono::DateTime::parse_from_rfc3339(envelope["timestamp"].as_str().unwrap()).unwrap();
    let occurred: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(message["occurred_at"].clone()).unwrap();
    assert_eq!(timestamp, occurred, "{envelope} vs {message}");
    assert_eq!(envelope.as_object().unwrap().len(), 3, "{envelope}");
    daemon.shutdown().await;
}

async fn every_secret_signs_and_verify_checks_signature_and_timestamp(database: Database) {
    let (receiver, address) = start_receiver().await;
    let mut rotating = webhook("rotating", &["*"], format!("http://{address}/rotating"));
    let TargetConfig::Webhook(target) = &mut rotating.target else {
        panic!("not a webhook");
    };
    target.secrets = vec![Secret(NEXT_SECRET.into())];
    let daemon = Daemon::start(&database, vec![rotating], 5_000).await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "rotating", "completed").await;
    let requests = receiver.requests("/rotating");
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    let header = |name: &str| request.headers[name].to_str().unwrap().to_owned();
    let webhook_id = header("webhook-id");
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
    let signatures = header("webhook-signature");
    let entries: Vec<&str> = signatures.split(' ').collect();
    assert_eq!(entries.len(), 2, "one per secret: {signatures}");
    assert!(entries.iter().all(|e| e.starts_with("v1,")), "{signatures}");
    let first = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        SECRET.trim_start_matches("whsec_"),
    )
    .unwrap();
    let check = |secret: &[u8], body: &[u8], tolerance: Duration| {
        verify(secret, &webhook_id, timestamp, body, &signatures, tolerance)
    };
    // A receiver holding either secret accepts the request.
    assert!(check(&first, &request.body, DEFAULT_TOLERANCE));
    assert!(check(
        NEXT_SECRET.as_bytes(),
        &request.body,
        DEFAULT_TOLERANCE
    ));
    assert!(!check(
        b"a third secret, 24 bytes or more",
        &request.body,
        DEFAULT_TOLERANCE
    ));
    assert!(!check(&first, br#"{"n": 2}"#, DEFAULT_TOLERANCE));
    // Past the tolerance the same request is a replay.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!check(&first, &request.body, Duration::ZERO));
    assert!(check(&first, &request.body, Duration::from_secs(60)));
    daemon.shutdown().await;
}

async fn a_short_secret_stops_the_daemon_naming_the_subscription_and_the_field(database: Database) {
    for (secret, secrets, field) in [
        (Some("too short"), vec![], "subscriptions[0].target.secret"),
        (
            Some(SECRET),
            vec![NEXT_SECRET, "whsec_c2hvcnQ="],
            "subscriptions[0].target.secrets[1]",
        ),
        (None, vec![], "subscriptions[0].target.secret"),
    ] {
        let mut hook = webhook("billing-hook", &["*"], "http://127.0.0.1:1/".into());
        let TargetConfig::Webhook(target) = &mut hook.target else {
            panic!("not a webhook");
        };
        target.secret = secret.map(|s| Secret(s.into()));
        target.secrets = secrets.into_iter().map(|s| Secret(s.into())).collect();
        let config = Config {
            database_url: database.url.clone(),
            schema: database.schema.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            subscriptions: vec![hook],
            ..Config::default()
        };
        let error = courier_server::bind(config, async {}).await.unwrap_err();
        let courier_server::ServeError::Config(config_error) = &error else {
            panic!("not a config error: {error}");
        };
        assert_eq!(config_error.key(), Some(field), "{error}");
        let shown = error.to_string();
        assert!(shown.contains("subscription billing-hook"), "{shown}");
        assert!(!shown.contains("too short"), "the secret is shown: {shown}");
    }
}

async fn server_errors_are_retried_until_delivered_once(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script(
        "/flaky",
        &[
            Answer::Status(503, None, "down for maintenance"),
            Answer::Status(503, None, "still down"),
        ],
    );
    let daemon = Daemon::start(
        &database,
        vec![webhook("flaky", &["*"], format!("http://{address}/flaky"))],
        5_000,
    )
    .await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "flaky", "completed").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let requests = receiver.requests("/flaky");
    assert_eq!(requests.len(), 3, "two 503s then one 200");
    assert!(requests
        .iter()
        .all(|r| r.headers["webhook-id"] == format!("flaky:{id}").as_str()));
    let attempts: Vec<_> = requests
        .iter()
        .map(|r| r.headers["courier-attempt"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    // The daemon shows what it saw delivering them (kept in its memory).
    let shown = daemon.get("/v1/subscriptions/flaky").await;
    assert_eq!(shown["target"]["type"], json!("webhook"), "{shown}");
    assert!(shown["last_success_at"].is_string(), "{shown}");
    assert_eq!(
        shown["last_error"]["message"],
        json!("the endpoint answered 503 Service Unavailable"),
        "{shown}"
    );
    assert!(
        shown["deliveries_5m"].as_u64().unwrap_or_default() >= 3,
        "{shown}"
    );
    assert!(
        shown["failure_rate_5m"].as_f64().unwrap_or_default() > 0.0,
        "{shown}"
    );
    assert!(!shown.to_string().contains("still down"), "{shown}");
    daemon.shutdown().await;
}

async fn the_webhook_id_is_one_per_message_and_subscription_across_retries(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script(
        "/flaky",
        &[
            Answer::Status(503, None, "down"),
            Answer::Status(500, None, "still down"),
        ],
    );
    let daemon = Daemon::start(
        &database,
        vec![
            webhook("flaky", &["*"], format!("http://{address}/flaky")),
            webhook("steady", &["*"], format!("http://{address}/steady")),
        ],
        5_000,
    )
    .await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "flaky", "completed").await;
    daemon.wait_for_state(&id, "steady", "completed").await;
    let webhook_ids = |path: &str| -> Vec<String> {
        receiver
            .requests(path)
            .iter()
            .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
            .collect()
    };
    let flaky = webhook_ids("/flaky");
    assert_eq!(flaky.len(), 3, "two failures then a success: {flaky:?}");
    assert!(flaky.iter().all(|i| *i == flaky[0]), "{flaky:?}");
    let steady = webhook_ids("/steady");
    assert_eq!(steady.len(), 1, "{steady:?}");
    // A receiver serving both subscriptions must not drop one as a duplicate.
    assert_ne!(steady[0], flaky[0]);
    assert_eq!(flaky[0], format!("flaky:{id}"));
    assert_eq!(steady[0], format!("steady:{id}"));
    for request in receiver.log.lock().unwrap().iter() {
        assert_eq!(request.headers["courier-message-id"], id.as_str());
    }
    daemon.shutdown().await;
}

async fn client_errors_dead_letter_with_the_status(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script(
        "/reject",
        &[Answer::Status(400, None, "missing field customer_id")],
    );
    let daemon = Daemon::start(
        &database,
        vec![webhook(
            "strict",
            &["invoice.*"],
            format!("http://{address}/reject"),
        )],
        5_000,
    )
    .await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "strict", "dead").await;
    assert_eq!(
        receiver.requests("/reject").len(),
        1,
        "a 400 is not retried"
    );
    let dead = daemon.get("/v1/dead-letters?subscription=strict").await;
    assert_eq!(dead["items"][0]["message_id"], json!(id), "{dead}");
    let error = dead["items"][0]["errors"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("400"), "{error}");
    assert!(error.contains("missing field customer_id"), "{error}");
    daemon.shutdown().await;
}

async fn retry_after_is_honoured(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script("/busy", &[Answer::Status(429, Some("2"), "slow down")]);
    let mut busy = webhook("busy", &["*"], format!("http://{address}/busy"));
    busy.retry.cap_ms = 5_000;
    let daemon = Daemon::start(&database, vec![busy], 5_000).await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "busy", "completed").await;
    let requests = receiver.requests("/busy");
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at - requests[0].at;
    // The policy's backoff is 20 ms to 5 s; the endpoint asked for 2 s.
    assert!(gap >= Duration::from_millis(1900), "retried after {gap:?}");
    // Asked to wait, the message snoozed: its attempt was given back.
    assert_eq!(requests[1].headers["courier-attempt"], "1");
    daemon.shutdown().await;
}

async fn retry_after_is_capped_at_the_backoff_cap(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script(
        "/capped",
        &[Answer::Status(503, Some("3600"), "back in an hour")],
    );
    let mut capped = webhook("capped", &["*"], format!("http://{address}/capped"));
    capped.retry.cap_ms = 300;
    let daemon = Daemon::start(&database, vec![capped], 5_000).await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "capped", "completed").await;
    let requests = receiver.requests("/capped");
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at - requests[0].at;
    // The endpoint asked for an hour; the subscription waits at most 300 ms.
    assert!(gap >= Duration::from_millis(290), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(5), "retried after {gap:?}");
    assert_eq!(requests[1].headers["courier-attempt"], "1");
    daemon.shutdown().await;
}

async fn a_429_throttles_the_whole_subscription_without_spending_attempts(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script("/limited", &[Answer::Status(429, Some("1"), "slow down")]);
    let mut limited = webhook("limited", &["*"], format!("http://{address}/limited"));
    limited.retry.cap_ms = 5_000;
    limited.concurrency = 4;
    let daemon = Daemon::start(&database, vec![limited], 5_000).await;
    let mut ids = vec![daemon.publish("acme", "t", json!({"n": 0})).await];
    let throttled = courier_testkit::eventually(Duration::from_secs(10), || async {
        !receiver.requests("/limited").is_empty()
    })
    .await;
    assert!(throttled, "the first message never reached the endpoint");
    // Published while the endpoint's 1 s lasts: all claimed, none sent.
    for n in 1..6 {
        ids.push(daemon.publish("acme", "t", json!({"n": n})).await);
    }
    for id in &ids {
        daemon.wait_for_state(id, "limited", "completed").await;
    }
    let requests = receiver.requests("/limited");
    let first = requests[0].at;
    let window: Vec<_> = requests
        .iter()
        .filter(|r| r.at - first < Duration::from_secs(1))
        .collect();
    assert_eq!(window.len(), 1, "calls in the throttle window: {window:?}");
    assert_eq!(
        requests.len(),
        7,
        "the 429, then each of the six messages once"
    );
    for request in &requests {
        assert_eq!(request.headers["courier-attempt"], "1", "{request:?}");
    }
    // The five were claimed in the window and held back without a request.
    let metrics = daemon.text("/metrics").await;
    let throttled = metrics
        .lines()
        .find(|l| {
            l.starts_with("courier_webhook_requests_total")
                && l.contains("outcome=\"throttled\"")
                && l.contains("subscription=\"limited\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or_default();
    assert!(throttled >= 5.0, "{metrics}");
    daemon.shutdown().await;
}

async fn a_down_endpoint_does_not_delay_a_healthy_subscription(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script("/hang", &vec![Answer::Hang; 100]);
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let mut stuck = webhook("stuck", &["t"], format!("http://{address}/hang"));
    stuck.concurrency = 2;
    let daemon = Daemon::start(
        &database,
        vec![
            stuck,
            webhook("down", &["t"], format!("http://{closed}/gone")),
            webhook("healthy", &["t"], format!("http://{address}/ok")),
        ],
        500,
    )
    .await;
    let started = Instant::now();
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(daemon.publish("acme", "t", json!({"n": n})).await);
    }
    for id in &ids {
        daemon.wait_for_state(id, "healthy", "completed").await;
    }
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(8), "healthy took {elapsed:?}");
    assert_eq!(receiver.requests("/ok").len(), 10);
    assert_ne!(
        daemon.state(&ids[0], "down").await.as_deref(),
        Some("completed")
    );
    assert_ne!(
        daemon.state(&ids[0], "stuck").await.as_deref(),
        Some("completed")
    );
    // Shutdown does not wait for the hanging endpoint past shutdown_timeout_ms.
    let stopping = Instant::now();
    daemon.shutdown().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
}

async fn timeouts_are_retried_then_dead_lettered(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script("/slow", &[Answer::Hang, Answer::Hang]);
    let mut slow = webhook("slow", &["*"], format!("http://{address}/slow"));
    slow.retry.max_attempts = 2;
    let TargetConfig::Webhook(target) = &mut slow.target else {
        panic!("not a webhook");
    };
    target.timeout_ms = 200;
    let daemon = Daemon::start(&database, vec![slow], 1_000).await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "slow", "dead").await;
    assert_eq!(receiver.requests("/slow").len(), 2, "a timeout is retried");
    let dead = daemon.get("/v1/dead-letters").await;
    let errors = dead["items"][0]["errors"].to_string();
    assert!(errors.contains("timed out after 200 ms"), "{errors}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_daemon_refuses_an_open_non_loopback_listener() {
    let database = sqlite().await;
    let config = Config {
        database_url: database.url.clone(),
        listen: "0.0.0.0:0".parse().unwrap(),
        ..Config::default()
    };
    let error = courier_server::bind(config, async {}).await.unwrap_err();
    assert!(
        matches!(error, courier_server::ServeError::Config(_)),
        "{error}"
    );
    assert!(error.to_string().contains("listen"), "{error}");
}

/// Numbers no `f64` holds, float digits a re-encoding changes, and (on
/// SQLite, which stores the text) spacing and a duplicate key.
const EXACT_PAYLOAD: &str = r#"{"big": 123456789012345678901234567890, "f": 0.1000000000000000055511151231257827, "dup": 1, "dup": 2}"#;

async fn payloads_reach_the_webhook_as_they_were_published(database: Database) {
    let on_sqlite = !database.url.starts_with("postgres");
    let (receiver, address) = start_receiver().await;
    let daemon = Daemon::start(&database, raw_and_enveloped(address), 5_000).await;
    let id = daemon
        .publish_text(&format!(
            r#"{{"tenant": "acme", "topic": "exact", "payload": {EXACT_PAYLOAD}}}"#
        ))
        .await;
    daemon.wait_for_state(&id, "raw", "completed").await;
    daemon.wait_for_state(&id, "enveloped", "completed").await;

    let raw = String::from_utf8(receiver.requests("/raw")[0].body.to_vec()).unwrap();
    let envelope = String::from_utf8(receiver.requests("/envelope")[0].body.to_vec()).unwrap();
    let shown = daemon.text(&format!("/v1/messages/{id}")).await;
    if on_sqlite {
        // The text itself, byte for byte.
        assert_eq!(raw, EXACT_PAYLOAD);
        assert!(
            envelope.contains(&format!(r#""data":{EXACT_PAYLOAD}"#)),
            "{envelope}"
        );
        assert!(
            shown.contains(&format!(r#""payload":{EXACT_PAYLOAD}"#)),
            "{shown}"
        );
    } else {
        // jsonb keeps every number's digits, and normalises spacing, key
        // order and duplicate keys (the last one wins).
        for text in [&raw, &envelope, &shown] {
            for digits in [
                "123456789012345678901234567890",
                "0.1000000000000000055511151231257827",
                r#""dup": 2"#,
            ] {
                assert!(text.contains(digits), "{digits} lost in {text}");
            }
            assert!(!text.contains(r#""dup": 1"#), "{text}");
        }
    }
    // Never through an f64: no float form of the big integer anywhere.
    for text in [&raw, &envelope, &shown] {
        assert!(!text.contains("1.2345678901234568e"), "{text}");
    }
    daemon.shutdown().await;
}

async fn a_test_ping_reaches_the_endpoint_signed_and_stores_nothing(database: Database) {
    let (receiver, address) = start_receiver().await;
    receiver.script("/down", &[Answer::Status(503, None, "maintenance")]);
    let hooks = webhook(
        "hooks",
        &["*"],
        format!("http://{address}/hooks?token=hidden"),
    );
    let down = webhook("down", &["*"], format!("http://{address}/down"));
    let mut relay = webhook("relay", &["*"], String::new());
    relay.target = TargetConfig::Stream(courier_server::config::NativeStreamTargetConfig {
        stream: "{topic}".into(),
    });
    let daemon = Daemon::start(&database, vec![hooks, down, relay], 5_000).await;

    let (status, ping) = daemon.post_empty("/v1/subscriptions/hooks/ping").await;
    assert_eq!(status, 200, "{ping}");
    assert_eq!(ping["delivered"], json!(true), "{ping}");
    assert_eq!(ping["status"], json!(200), "{ping}");
    assert_eq!(ping["error"], Value::Null, "{ping}");
    let requests = receiver.requests("/hooks");
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    let header = |name: &str| request.headers[name].to_str().unwrap().to_owned();
    let webhook_id = header("webhook-id");
    assert_eq!(json!(webhook_id), ping["webhook_id"]);
    assert!(webhook_id.starts_with("hooks:ping-"), "{webhook_id}");
    assert_eq!(header("courier-topic"), "courier.ping");
    let secret = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        SECRET.trim_start_matches("whsec_"),
    )
    .unwrap();
    assert!(verify(
        &secret,
        &webhook_id,
        header("webhook-timestamp").parse().unwrap(),
        &request.body,
        &header("webhook-signature"),
        DEFAULT_TOLERANCE,
    ));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["type"], json!("courier.ping"));
    assert_eq!(body["data"], json!({"subscription": "hooks"}));

    // The endpoint's refusal is reported, not raised, and names no URL.
    let (status, ping) = daemon.post_empty("/v1/subscriptions/down/ping").await;
    assert_eq!(status, 200, "{ping}");
    assert_eq!(
        (ping["delivered"].clone(), ping["status"].clone()),
        (json!(false), json!(503))
    );
    let error = ping["error"].as_str().unwrap();
    assert!(
        error.contains("503") && error.contains("maintenance"),
        "{error}"
    );
    assert!(!error.contains("127.0.0.1"), "{error}");

    let (status, refused) = daemon.post_empty("/v1/subscriptions/relay/ping").await;
    assert_eq!(
        (status, refused["error"]["code"].clone()),
        (409, json!("not_a_webhook")),
        "{refused}"
    );
    let (status, refused) = daemon.post_empty("/v1/subscriptions/nobody/ping").await;
    assert_eq!(status, 404, "{refused}");

    // Nothing was stored: no message, no delivery, no dead letter.
    assert_eq!(daemon.get("/v1/messages").await["items"], json!([]));
    assert_eq!(daemon.get("/v1/dead-letters").await["items"], json!([]));
    daemon.shutdown().await;
}

async fn a_scheduled_message_is_cancelled_before_any_delivery(database: Database) {
    let (receiver, address) = start_receiver().await;
    let hooks = webhook("hooks", &["*"], format!("http://{address}/hooks"));
    let daemon = Daemon::start(&database, vec![hooks], 5_000).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let scheduled = daemon
        .publish_request(
            json!({"tenant": "acme", "topic": "t", "payload": {"n": 1}, "available_at": later}),
        )
        .await;
    let now = daemon.publish("acme", "t", json!({"n": 2})).await;
    daemon.wait_for_state(&now, "hooks", "completed").await;

    let (status, cancelled) = daemon
        .post_empty(&format!("/v1/messages/{scheduled}/cancel"))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(
        cancelled,
        json!({"id": scheduled, "cancelled": true, "deliveries": 1})
    );
    let (status, gone) = daemon
        .post_empty(&format!("/v1/messages/{scheduled}/cancel"))
        .await;
    assert_eq!(status, 404, "{gone}");
    let (status, _) = daemon
        .post_empty(&format!("/v1/messages/{scheduled}"))
        .await;
    assert_eq!(status, 405);
    assert_eq!(
        daemon.get(&format!("/v1/messages/{scheduled}")).await["error"]["code"],
        json!("not_found")
    );

    // A delivered message is not cancellable, and stays as it was.
    let (status, refused) = daemon
        .post_empty(&format!("/v1/messages/{now}/cancel"))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], json!("already_started"));
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("hooks"),
        "{refused}"
    );
    assert_eq!(
        daemon.state(&now, "hooks").await.as_deref(),
        Some("completed")
    );
    assert_eq!(receiver.requests("/hooks").len(), 1);
    daemon.shutdown().await;
}

/// A subscription that declares the schema versions it accepts receives
/// only those; a message of another version waits, spending no attempt, and
/// is delivered once a daemon accepting it runs.
async fn a_subscription_receives_only_the_versions_it_accepts(database: Database) {
    let (receiver, address) = start_receiver().await;
    let mut hooks = webhook("hooks", &["invoice.*"], format!("http://{address}/hooks"));
    hooks.versions = Some(vec![2]);
    let daemon = Daemon::start(&database, vec![hooks.clone()], 5_000).await;
    let old = daemon
        .publish_request(json!({"tenant": "acme", "topic": "invoice.paid", "schema_version": 1, "payload": {"n": 1}}))
        .await;
    let new = daemon
        .publish_request(json!({"tenant": "acme", "topic": "invoice.paid", "schema_version": 2, "payload": {"n": 2}}))
        .await;
    daemon.wait_for_state(&new, "hooks", "completed").await;
    // The v1 message came first: a claim that could take it took it by now.
    assert_eq!(
        daemon.state(&old, "hooks").await.as_deref(),
        Some("available")
    );
    let requests = receiver.requests("/hooks");
    assert_eq!(requests.len(), 1, "only the v2 message was sent");
    let message = daemon.get(&format!("/v1/messages/{old}")).await;
    assert_eq!(message["deliveries"][0]["attempts"], json!(0), "{message}");
    daemon.shutdown().await;

    // After the deploy the endpoint takes v1 too.
    hooks.versions = Some(vec![1, 2]);
    let daemon = Daemon::start(&database, vec![hooks], 5_000).await;
    daemon.wait_for_state(&old, "hooks", "completed").await;
    assert_eq!(receiver.requests("/hooks").len(), 2);
    daemon.shutdown().await;
}

/// A topic's own retry policy (`topic_retry`) gives its messages their own
/// attempts under a subscription of a pattern; the pattern's other topics
/// keep the subscription's, and the subscription's topics are unchanged.
async fn a_topic_s_own_retry_policy_applies_to_it_alone(database: Database) {
    let (receiver, address) = start_receiver().await;
    let down: Vec<Answer> = (0..20).map(|_| Answer::Status(500, None, "down")).collect();
    receiver.script("/down", &down);
    let mut hooks = webhook("hooks", &["invoice.*"], format!("http://{address}/down"));
    hooks.topic_retry.insert(
        "invoice.void".into(),
        courier_server::config::TopicRetryConfig {
            max_attempts: Some(2),
            ..Default::default()
        },
    );
    let daemon = Daemon::start(&database, vec![hooks], 5_000).await;
    let void = daemon
        .publish("acme", "invoice.void", json!({"n": 1}))
        .await;
    let paid = daemon
        .publish("acme", "invoice.paid", json!({"n": 2}))
        .await;
    daemon.wait_for_state(&void, "hooks", "dead").await;
    daemon.wait_for_state(&paid, "hooks", "dead").await;
    let attempts = |id: &str, dead: &Value| {
        dead["items"]
            .as_array()
            .and_then(|items| items.iter().find(|d| d["message_id"] == json!(id)))
            .map(|d| d["attempts"].clone())
    };
    let dead = daemon.get("/v1/dead-letters?subscription=hooks").await;
    assert_eq!(attempts(&void, &dead), Some(json!(2)), "{dead}");
    assert_eq!(attempts(&paid, &dead), Some(json!(10)), "{dead}");
    assert_eq!(receiver.requests("/down").len(), 12);
    let shown = daemon.get("/v1/subscriptions/hooks").await;
    assert_eq!(shown["topics"], json!(["invoice.*"]), "{shown}");
    daemon.shutdown().await;
}

macro_rules! webhook_tests {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::sqlite().await).await
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::postgres().await).await
                }
            )*
        }
    };
}

webhook_tests!(
    signed_deliveries_reach_the_receiver,
    deliveries_carry_the_message_s_metadata_and_headers_raw_or_enveloped,
    server_errors_are_retried_until_delivered_once,
    the_webhook_id_is_one_per_message_and_subscription_across_retries,
    every_secret_signs_and_verify_checks_signature_and_timestamp,
    a_short_secret_stops_the_daemon_naming_the_subscription_and_the_field,
    client_errors_dead_letter_with_the_status,
    retry_after_is_honoured,
    retry_after_is_capped_at_the_backoff_cap,
    a_429_throttles_the_whole_subscription_without_spending_attempts,
    a_down_endpoint_does_not_delay_a_healthy_subscription,
    timeouts_are_retried_then_dead_lettered,
    payloads_reach_the_webhook_as_they_were_published,
    a_test_ping_reaches_the_endpoint_signed_and_stores_nothing,
    a_scheduled_message_is_cancelled_before_any_delivery,
    a_subscription_receives_only_the_versions_it_accepts,
    a_topic_s_own_retry_policy_applies_to_it_alone,
);
