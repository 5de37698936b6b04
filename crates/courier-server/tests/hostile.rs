//! The daemon against hostile clients, over real sockets
//! (`courier_server::bind` on port 0, SQLite in a temp file): metrics on
//! their own listener, browsers' requests refused, slow clients cut off.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use courier_server::config::{Config, Role, TokenConfig};
use sha2::{Digest, Sha256};

fn token(name: &str, roles: &[Role]) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        sha256: hex::encode(Sha256::digest(name.as_bytes())),
        tenants: vec!["*".into()],
        roles: roles.to_vec(),
    }
}

struct Daemon {
    address: SocketAddr,
    metrics_address: Option<SocketAddr>,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), courier_server::ServeError>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// A daemon on 127.0.0.1:0 with `configure` applied to its config.
    async fn start(configure: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            database_url: dir.path().join("courier.db").to_str().unwrap().to_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            shutdown_timeout_ms: 2_000,
            ..Config::default()
        };
        configure(&mut config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        Self {
            address: running.local_addr(),
            metrics_address: running.metrics_addr(),
            stop,
            done: tokio::spawn(running.finished()),
            _dir: dir,
        }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_an_admin_token_or_the_metrics_listener() {
    let daemon = Daemon::start(|config| {
        config.tokens = vec![
            token("reader", &[Role::Read]),
            token("ops", &[Role::Admin, Role::Publish]),
        ];
        config.server.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let client = reqwest::Client::new();
    let scrape = |address: SocketAddr, token: Option<&'static str>| {
        let client = client.clone();
        async move {
            let mut request = client.get(format!("http://{address}/metrics"));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let published = client
        .post(format!("http://{}/v1/messages", daemon.address))
        .bearer_auth("ops")
        .header("content-type", "application/json")
        .body(r#"{"tenant": "acme", "topic": "t", "payload": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(published.status().as_u16(), 201);
    assert_eq!(scrape(daemon.address, None).await.0, 401);
    assert_eq!(scrape(daemon.address, Some("reader")).await.0, 403);
    let (status, text) = scrape(daemon.address, Some("ops")).await;
    assert_eq!(status, 200, "{text}");
    let metrics_address = daemon.metrics_address.expect("a metrics listener");
    assert_ne!(metrics_address, daemon.address);
    let (status, text) = scrape(metrics_address, None).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("courier_messages_published_total"), "{text}");
    // The metrics listener serves nothing else.
    let other = client
        .get(format!("http://{metrics_address}/v1/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 404);
    daemon.shutdown().await;
}

/// One request to `address` with these headers (and a body, if any).
async fn send(
    address: SocketAddr,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, format!("http://{address}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_cannot_drive_an_open_daemon() {
    use reqwest::Method;
    let daemon = Daemon::start(|config| {
        config.server.allowed_hosts = vec!["courier.internal".into()];
        config.server.allowed_origins = vec!["https://ops.example.com".into()];
    })
    .await;
    let address = daemon.address;
    let port = address.port();
    let message = r#"{"tenant": "acme", "topic": "t", "payload": 1}"#;
    let json = ("content-type", "application/json");

    // A cross-site form post or fetch without preflight: text/plain or no type.
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let (status, body) = send(
            address,
            Method::POST,
            "/v1/messages",
            &[("content-type", content_type)],
            Some(message),
        )
        .await;
        assert_eq!(status, 415, "{content_type}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    for (method, path) in [
        (Method::POST, "/v1/messages"),
        (Method::POST, "/v1/subscriptions/demo/pause"),
        (Method::POST, "/v1/dead-letters/discard"),
        (
            Method::DELETE,
            "/v1/streams/acme/orders/groups/g/consumers/c",
        ),
        (Method::PUT, "/v1/streams/acme/orders/groups/g"),
    ] {
        let (status, body) = send(address, method.clone(), path, &[], None).await;
        assert_eq!(status, 415, "{method} {path} without a type: {body}");
        assert_eq!(body["error"]["field"], "content-type", "{body}");
    }

    // DNS rebinding: the browser sends the attacker's name as Host.
    for host in [format!("evil.example:{port}"), "localhost".into()] {
        let (status, body) = send(
            address,
            Method::GET,
            "/v1/messages",
            &[("host", host.as_str())],
            None,
        )
        .await;
        assert_eq!(status, 421, "{host}: {body}");
        assert_eq!(body["error"]["code"], "misdirected_request", "{body}");
    }
    let rebound = format!("evil.example:{port}");
    let (status, _) = send(
        address,
        Method::GET,
        "/healthz",
        &[("host", &rebound)],
        None,
    )
    .await;
    assert_eq!(status, 200, "probes may use any host");
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "courier.internal".to_owned(),
        format!("courier.internal:{port}"),
    ] {
        let (status, body) = send(
            address,
            Method::GET,
            "/v1/messages",
            &[("host", host.as_str())],
            None,
        )
        .await;
        assert_eq!(status, 200, "{host}: {body}");
    }

    // A page of another origin, even with a JSON body.
    let (status, body) = send(
        address,
        Method::POST,
        "/v1/messages",
        &[json, ("origin", "http://evil.example")],
        Some(message),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["field"], "origin", "{body}");
    let (status, body) = send(
        address,
        Method::GET,
        "/v1/messages",
        &[("origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = send(
        address,
        Method::POST,
        "/v1/messages",
        &[json, ("origin", "https://ops.example.com")],
        Some(message),
    )
    .await;
    assert_eq!(status, 201, "an allowed origin: {body}");

    // Only the allowed origin's message was stored.
    let (_, listed) = send(address, Method::GET, "/v1/messages", &[], None).await;
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    daemon.shutdown().await;
}

/// Reads from `stream` until it closes, an error, or `limit`; what was read
/// and whether the server closed the connection within `limit`.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return (String::from_utf8_lossy(&received).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&received).into_owned(), true)
            }
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_in_its_headers_is_disconnected() {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::start(|config| config.server.header_read_timeout_ms = 500).await;
    let mut stream = tokio::net::TcpStream::connect(daemon.address)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // Half a header line, then nothing.
    stream
        .write_all(
            format!(
                "GET /healthz HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
                daemon.address
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    let elapsed = started.elapsed();
    assert!(closed, "the connection was still open after {elapsed:?}");
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(5),
        "closed after {elapsed:?}, the header read timeout is 500 ms"
    );
    // Other clients are served meanwhile and after.
    let (status, _) = send(daemon.address, reqwest::Method::GET, "/healthz", &[], None).await;
    assert_eq!(status, 200);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_trickles_in_is_answered_408() {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::start(|config| config.server.request_timeout_ms = 500).await;
    let mut stream = tokio::net::TcpStream::connect(daemon.address)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // A whole head announcing 100 bytes, then only 10 of them.
    stream
        .write_all(
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{\"tenant\":",
                daemon.address
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    let elapsed = started.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "after {elapsed:?}: {answer:?}"
    );
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(
        elapsed < Duration::from_secs(4),
        "answered after {elapsed:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_wait_until_one_closes() {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::start(|config| config.server.max_connections = 1).await;
    // The one connection the daemon serves, idle.
    let holder = tokio::net::TcpStream::connect(daemon.address)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiting = tokio::net::TcpStream::connect(daemon.address)
        .await
        .unwrap();
    waiting
        .write_all(
            format!(
                "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                daemon.address
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut waiting, Duration::from_millis(500)).await;
    assert_eq!(answer, "", "served past the connection limit");
    drop(holder);
    let (answer, closed) = read_until_closed(&mut waiting, Duration::from_secs(5)).await;
    assert!(closed && answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    daemon.shutdown().await;
}

/// One request to `address` with `extra` headers; the status, the
/// `Content-Type` and the body as JSON (`null` if it is not JSON).
async fn send_with_type(
    address: SocketAddr,
    method: reqwest::Method,
    path: &str,
    extra: &[(String, String)],
) -> (u16, String, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, format!("http://{address}{path}"));
    for (name, value) in extra {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = response.text().await.unwrap();
    (
        status,
        content_type,
        serde_json::from_str(&text).unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_large_heads_and_undecodable_paths_get_the_json_error_shape() {
    use reqwest::Method;
    let daemon = Daemon::start(|_| {}).await;
    let address = daemon.address;
    let many_headers: Vec<(String, String)> = (0..150)
        .map(|i| (format!("x-filler-{i}"), "v".to_owned()))
        .collect();
    let one_large_header = vec![("x-large".to_owned(), "v".repeat(100 * 1024))];
    // Method, path, extra headers, status, code, field.
    type Case = (
        Method,
        &'static str,
        Vec<(String, String)>,
        u16,
        &'static str,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        // A known path, a method it does not serve.
        (
            Method::GET,
            "/v1/dead-letters/retry",
            vec![],
            405,
            "method_not_allowed",
            None,
        ),
        (
            Method::PUT,
            "/v1/messages",
            vec![("content-type".into(), "application/json".into())],
            405,
            "method_not_allowed",
            None,
        ),
        // More headers, or larger, than the daemon reads.
        (
            Method::GET,
            "/v1/subscriptions",
            many_headers,
            431,
            "headers_too_large",
            None,
        ),
        (
            Method::GET,
            "/v1/subscriptions",
            one_large_header,
            431,
            "headers_too_large",
            None,
        ),
        // Percent-encoded bytes that are not UTF-8.
        (
            Method::GET,
            "/v1/messages/%FF",
            vec![],
            422,
            "invalid_field",
            Some("id"),
        ),
        (
            Method::GET,
            "/v1/dead-letters/%C3%28",
            vec![],
            422,
            "invalid_field",
            Some("id"),
        ),
    ];
    for (method, path, extra, status, code, field) in cases {
        let (got, content_type, body) = send_with_type(address, method.clone(), path, &extra).await;
        let case = format!("{method} {path} with {} extra headers", extra.len());
        assert_eq!(got, status, "{case}: {body}");
        assert!(
            content_type.starts_with("application/json"),
            "{case}: {content_type:?}"
        );
        assert_eq!(body["error"]["code"], code, "{case}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{case}: {body}"
        );
        if let Some(field) = field {
            assert_eq!(body["error"]["field"], field, "{case}: {body}");
        }
    }
    // The daemon still serves after each refusal.
    let (status, _) = send(address, Method::GET, "/v1/subscriptions", &[], None).await;
    assert_eq!(status, 200);
    daemon.shutdown().await;
}

/// A response's `Retry-After`, in seconds.
fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn tenant_token(name: &str, tenants: &[&str], roles: &[Role]) -> TokenConfig {
    TokenConfig {
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
        ..token(name, roles)
    }
}

/// A tenant over its request rate gets 429 with `Retry-After`, and its
/// other tokens share the limit; another tenant is not touched, and the
/// tenant is served again once the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_request_rate_gets_429_with_retry_after_and_others_do_not() {
    let daemon = Daemon::start(|config| {
        config.tokens = vec![
            tenant_token("acme-1", &["acme"], &[Role::Read]),
            tenant_token("acme-2", &["acme"], &[Role::Read]),
            tenant_token("globex", &["globex"], &[Role::Read]),
        ];
        config.server.tenant_requests_per_second = 2;
        config.server.tenant_request_burst = 5;
    })
    .await;
    let client = reqwest::Client::new();
    let list = |token: &'static str| {
        let request = client
            .get(format!("http://{}/v1/messages", daemon.address))
            .bearer_auth(token);
        async move { request.send().await.unwrap() }
    };
    // The burst of 5, shared by the tenant's two tokens, plus what refilled
    // (2 a second) while the requests ran: a slow machine may take longer
    // than 0.5 s for them.
    let started = std::time::Instant::now();
    let mut served = 0_usize;
    let refused = loop {
        let response = list(if served.is_multiple_of(2) {
            "acme-1"
        } else {
            "acme-2"
        })
        .await;
        if response.status() == 429 {
            break response;
        }
        assert_eq!(response.status(), 200, "request {served}");
        served += 1;
        assert!(served <= 100, "never refused");
    };
    let refilled = (started.elapsed().as_secs_f64() * 2.0).floor() as usize;
    assert!(
        (5..=5 + refilled).contains(&served),
        "{served} requests served before the first 429 ({refilled} refilled meanwhile)"
    );
    let wait = retry_after(&refused);
    assert_eq!(wait, 1, "one request comes back every 0.5 s");
    let body: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_requests");
    assert_eq!(
        list("globex").await.status(),
        200,
        "another tenant is not limited"
    );
    tokio::time::sleep(Duration::from_secs(wait)).await;
    assert_eq!(
        list("acme-2").await.status(),
        200,
        "served again after the wait"
    );
    daemon.shutdown().await;
}

/// An address that keeps sending unknown tokens is refused with 429 after
/// `server.auth_failures_per_minute` of them, even with a valid token, and
/// the refusals are counted in `courier_http_rate_limited_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_guessing_tokens_is_refused_after_its_failures_even_with_a_valid_token() {
    let daemon = Daemon::start(|config| {
        config.tokens = vec![token("ops", &[Role::Admin, Role::Read])];
        config.server.auth_failures_per_minute = 5;
        config.server.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let client = reqwest::Client::new();
    let stats = |token: String| {
        let request = client
            .get(format!("http://{}/v1/stats", daemon.address))
            .bearer_auth(token);
        async move { request.send().await.unwrap() }
    };
    assert_eq!(stats("ops".into()).await.status(), 200);
    for guess in 0..5 {
        assert_eq!(stats(format!("guess-{guess}")).await.status(), 401);
    }
    let refused = stats("guess-5".into()).await;
    assert_eq!(refused.status(), 429);
    let wait = retry_after(&refused);
    assert!((55..=60).contains(&wait), "Retry-After {wait}");
    let valid = stats("ops".into()).await;
    assert_eq!(
        valid.status(),
        429,
        "a guess that finally matches is refused too"
    );
    let metrics = client
        .get(format!("http://{}/metrics", daemon.address))
        .bearer_auth("ops")
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 429, "the address is refused everywhere");
    let scraped = client
        .get(format!(
            "http://{}/metrics",
            daemon.metrics_address.expect("a metrics listener")
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        scraped.contains("courier_http_rate_limited_total{limit=\"auth_failures\"} 3"),
        "{scraped}"
    );
    daemon.shutdown().await;
}
