//! `[otel] endpoint` end to end: the real `courier serve` with
//! `COURIER_OTEL__ENDPOINT` pointing at a collector this test runs on
//! 127.0.0.1 delivers a message published with a `traceparent` to a webhook,
//! and exports its spans in OTLP/HTTP protobuf to `{endpoint}/v1/traces`:
//! at the latest when SIGTERM shuts it down, the collector has received a
//! POST holding the publisher's trace id.
#![cfg(feature = "otel")]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use courier_testkit::eventually;

const BINARY: &str = env!("CARGO_BIN_EXE_courier");

/// What one POST brought: its path, content type, `traceparent` and body.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    content_type: String,
    traceparent: Option<String>,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Request>>>);

impl Received {
    fn on(&self, path: &str) -> Vec<Request> {
        self.0
            .lock()
            .map(|all| all.iter().filter(|r| r.path == path).cloned().collect())
            .unwrap_or_default()
    }
}

async fn receive(
    State(received): State<Received>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> &'static str {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if let Ok(mut all) = received.0.lock() {
        all.push(Request {
            path: uri.path().to_owned(),
            content_type: text("content-type").unwrap_or_default(),
            traceparent: text("traceparent"),
            body,
        });
    }
    "ok"
}

/// One server on 127.0.0.1 for both the webhook (`/hook`) and the
/// collector (`/v1/traces`).
async fn start_receiver() -> anyhow::Result<(Received, u16)> {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let app = axum::Router::new()
        .fallback(receive)
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((received, port))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_an_otel_endpoint_exports_the_delivery_in_the_publishers_trace(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (received, receiver_port) = start_receiver().await?;
    std::fs::write(
        dir.path().join("courier.toml"),
        format!(
            r#"
[[subscriptions]]
name = "hook"
topics = ["invoice.*"]
[subscriptions.target]
type = "webhook"
url = "http://127.0.0.1:{receiver_port}/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#
        ),
    )?;
    let port = free_port()?;
    let mut daemon = tokio::process::Command::new(BINARY)
        .arg("serve")
        .arg("--config")
        .arg(dir.path().join("courier.toml"))
        .current_dir(dir.path())
        .env("COURIER_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "COURIER_OTEL__ENDPOINT",
            format!("http://127.0.0.1:{receiver_port}"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let ready = eventually(Duration::from_secs(30), || async move {
        matches!(
            reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await,
            Ok(response) if response.status().is_success()
        )
    })
    .await;
    assert!(ready, "the daemon never became ready");

    let trace = uuid::Uuid::new_v4().simple().to_string();
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .body(r#"{"tenant":"acme","topic":"invoice.paid","payload":{"invoice":7}}"#)
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 201);
    let delivered = eventually(Duration::from_secs(30), || {
        let received = received.clone();
        async move { !received.on("/hook").is_empty() }
    })
    .await;
    assert!(delivered, "the webhook was not called");
    let hook = &received.on("/hook")[0];
    let sent = hook.traceparent.clone().unwrap_or_default();
    assert!(
        sent.starts_with(&format!("00-{trace}-")) && !sent.contains("00f067aa0ba902b7"),
        "the webhook's traceparent is the delivery span's, in the publisher's trace: {sent:?}"
    );

    // SIGTERM: the daemon flushes its spans before it exits.
    let pid = daemon
        .id()
        .ok_or_else(|| anyhow::anyhow!("the daemon has no pid"))?;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    anyhow::ensure!(killed.success(), "kill -TERM failed");
    let status = tokio::time::timeout(Duration::from_secs(30), daemon.wait()).await??;
    assert!(status.success(), "the daemon exited with {status}");

    let exports = received.on("/v1/traces");
    assert!(!exports.is_empty(), "the collector got no POST /v1/traces");
    for export in &exports {
        assert_eq!(export.content_type, "application/x-protobuf");
    }
    // OTLP protobuf carries ids as raw bytes: the publisher's trace id is in
    // the export as its 16 bytes (the delivery span's trace id), and the
    // resource's service.name as text.
    let trace_bytes = hex::decode(&trace)?;
    let holds = |needle: &[u8]| {
        exports
            .iter()
            .any(|export| export.body.windows(needle.len()).any(|w| w == needle))
    };
    assert!(
        holds(&trace_bytes),
        "no exported span is in the publisher's trace"
    );
    assert!(
        holds(b"courier.deliver"),
        "no courier.deliver span exported"
    );
    assert!(holds(b"service.name"), "no service.name resource");
    Ok(())
}
