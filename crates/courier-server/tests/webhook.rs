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
    Config, RetryConfig, Secret, SubscriptionConfig, TargetConfig, WebhookConfig,
};
use courier_server::webhook::verify;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

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
        retry: RetryConfig {
            max_attempts: 10,
            base_ms: 20,
            cap_ms: 50,
        },
        concurrency: 4,
        replay: None,
        target: TargetConfig::Webhook(WebhookConfig {
            url,
            secret: Secret(SECRET.into()),
            timeout_ms: 10_000,
        }),
    }
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
        let response = self
            .client
            .post(format!("http://{}/v1/messages", self.address))
            .header("content-type", "application/json")
            .body(json!({"tenant": tenant, "topic": topic, "payload": payload}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        body["id"].as_str().unwrap().to_owned()
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
    assert_eq!(header("webhook-id"), paid);
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
        &paid,
        timestamp,
        &request.body,
        &header("webhook-signature")
    ));
    assert!(!verify(
        b"another secret",
        &paid,
        timestamp,
        &request.body,
        &header("webhook-signature")
    ));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({"n": 1, "why": "paid"}));
    daemon.shutdown().await;
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
        .all(|r| r.headers["webhook-id"] == id.as_str()));
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
    let daemon = Daemon::start(
        &database,
        vec![webhook("busy", &["*"], format!("http://{address}/busy"))],
        5_000,
    )
    .await;
    let id = daemon
        .publish("acme", "invoice.paid", json!({"n": 1}))
        .await;
    daemon.wait_for_state(&id, "busy", "completed").await;
    let requests = receiver.requests("/busy");
    assert_eq!(requests.len(), 2);
    let gap = requests[1].at - requests[0].at;
    // The policy's backoff is 10-50 ms; the endpoint asked for 2 s.
    assert!(gap >= Duration::from_millis(1900), "retried after {gap:?}");
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
    server_errors_are_retried_until_delivered_once,
    client_errors_dead_letter_with_the_status,
    retry_after_is_honoured,
    a_down_endpoint_does_not_delay_a_healthy_subscription,
    timeouts_are_retried_then_dead_lettered,
);
