//! Secrets stay out of what the daemon prints and stores: a webhook URL's
//! `user:pass@` and query token never reach a delivery's error history (which
//! every reader of the tenant sees) or the log, and start-up errors print no
//! database or webhook password. The daemon runs for real
//! (`courier_server::bind` on port 0) and this binary's log is captured.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use courier_server::config::{
    Config, RetryConfig, Secret, SubscriptionConfig, TargetConfig, WebhookConfig,
};
use serde_json::{json, Value};

const USER: &str = "hook-user-5a1";
const PASSWORD: &str = "hook-pass-9c3";
const QUERY_TOKEN: &str = "query-token-7e2";

/// Everything this test binary logs.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .init();
        log
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [USER, PASSWORD, QUERY_TOKEN] {
        assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_webhook_s_credentials_reach_neither_the_error_history_nor_the_log() {
    let log = captured_log();
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        database_url: dir.path().join("courier.db").to_str().unwrap().to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_timeout_ms: 2_000,
        subscriptions: vec![SubscriptionConfig {
            name: "billing-hook".into(),
            topics: vec!["invoice.*".into()],
            tenants: None,
            versions: None,
            topic_retry: Default::default(),
            retry: RetryConfig {
                max_attempts: 2,
                base_ms: 20,
                cap_ms: 50,
            },
            concurrency: 1,
            replay: None,
            target: TargetConfig::Webhook(WebhookConfig {
                timeout_ms: 2_000,
                ..WebhookConfig::new(
                    format!("http://{USER}:{PASSWORD}@{closed}/hooks?token={QUERY_TOKEN}"),
                    Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
                )
            }),
        }],
        ..Config::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = courier_server::bind(config, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let base = format!("http://{}", running.local_addr());
    let done = tokio::spawn(running.finished());
    let client = reqwest::Client::new();
    let created = client
        .post(format!("{base}/v1/messages"))
        .header("content-type", "application/json")
        .body(json!({"tenant": "acme", "topic": "invoice.paid", "payload": {"n": 1}}).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let created: Value = serde_json::from_str(&created).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let get = |path: String| {
        let client = client.clone();
        async move { client.get(path).send().await.unwrap().text().await.unwrap() }
    };
    let dead = courier_testkit::eventually(Duration::from_secs(30), || async {
        let text = get(format!("{base}/v1/messages/{id}")).await;
        let message: Value = serde_json::from_str(&text).unwrap();
        message["deliveries"][0]["state"] == json!("dead")
    })
    .await;
    let message = get(format!("{base}/v1/messages/{id}")).await;
    assert!(dead, "the delivery never died: {message}");
    let dead_letters = get(format!("{base}/v1/dead-letters")).await;

    assert_no_secret("GET /v1/messages/{id}", &message);
    assert_no_secret("GET /v1/dead-letters", &dead_letters);
    let history: Value = serde_json::from_str(&message).unwrap();
    let errors = history["deliveries"][0]["errors"].to_string();
    assert!(
        errors.contains("webhook of subscription billing-hook unreachable"),
        "the error names the subscription: {errors}"
    );
    assert!(dead_letters.contains("billing-hook"), "{dead_letters}");

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), done)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let log = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        log.contains("billing-hook unreachable"),
        "the failure was logged: {log}"
    );
    assert_no_secret("the log", &log);
}

#[tokio::test]
async fn start_up_errors_print_no_password_or_query_token() {
    // Refused by the configuration: the value is shown, its secrets are not.
    for (text, key) in [
        (
            format!("database_url = \"mysql://app:{PASSWORD}@db/courier\""),
            "database_url",
        ),
        (
            format!(
                "[[subscriptions]]\nname = \"s\"\ntopics = [\"a\"]\n\
                 target = {{ type = \"webhook\", url = \"ftp://{USER}:{PASSWORD}@h/x?token={QUERY_TOKEN}\", secret = \"s\" }}\n"
            ),
            "subscriptions[0].target.url",
        ),
        (
            format!("[redis]\nurl = \"http://:{PASSWORD}@cache:6379\""),
            "redis.url",
        ),
        (
            format!("[nats]\nurl = \"http://{USER}:{PASSWORD}@nats:4222\""),
            "nats.url",
        ),
    ] {
        let error = Config::from_toml_str(&text).unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(shown.contains(key), "{shown}");
        assert_no_secret(key, &shown);
    }
    // Refused when the database is opened.
    let config = Config {
        database_url: format!("postgres://postgres:{PASSWORD}@127.0.0.1:99999/test"),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    };
    let error = courier_server::bind(config, async {}).await.unwrap_err();
    assert_no_secret("the start-up error", &format!("{error} {error:?}"));
}

#[tokio::test]
async fn an_unreachable_relay_server_s_password_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("courier.db");
    for (section, target) in [
        (
            format!("[redis]\nurl = \"redis://{USER}:{PASSWORD}@127.0.0.1:1\""),
            "{ type = \"redis_stream\", stream = \"orders\" }",
        ),
        (
            format!("[nats]\nurl = \"nats://{USER}:{PASSWORD}@127.0.0.1:1\""),
            "{ type = \"nats\", subject = \"orders\", stream = \"ORDERS\" }",
        ),
    ] {
        let text = format!(
            "database_url = {database:?}\nlisten = \"127.0.0.1:0\"\n\
             [[subscriptions]]\nname = \"relay\"\ntopics = [\"*\"]\ntarget = {target}\n{section}\n"
        );
        let config = Config::from_toml_str(&text).unwrap();
        let error = courier_server::bind(config, async {}).await.unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(shown.contains("relay"), "{shown}");
        assert_no_secret("a relay's start-up error", &shown);
    }
}
