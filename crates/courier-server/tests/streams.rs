//! The streams API end to end: the daemon (`courier_server::bind` on port 0)
//! over real HTTP, with native streams on SQLite and PostgreSQL and with
//! `[streams] backend = "redis"`; bad input, roles and tenants, blocking
//! reads, a Redis outage, and `[[stream_subscriptions]]` delivering to a
//! real in-test webhook receiver.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use courier_server::config::{Config, Role, TokenConfig};
use courier_testkit::eventually;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const LIMIT: usize = 2048;

// ---------------------------------------------------------------- fixtures

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    /// Streams on Redis (a key prefix per test), the outbox on SQLite.
    Redis,
}

/// Where the daemon stores, and what keeps that alive.
struct Store {
    config: Config,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn store(backend: Backend) -> Store {
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_payload_bytes: LIMIT,
        ..Config::default()
    };
    match backend {
        Backend::Postgres => {
            let fixture = courier_testkit::PgFixture::new().await.unwrap();
            config.database_url = courier_testkit::database_url();
            config.schema = fixture.schema.clone();
            Store {
                config,
                _keep: Box::new(fixture),
            }
        }
        Backend::Sqlite | Backend::Redis => {
            let dir = tempfile::tempdir().unwrap();
            config.database_url = dir.path().join("courier.db").to_str().unwrap().to_owned();
            if backend == Backend::Redis {
                let prefix = format!("t_{}:", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                config = with_redis(config, &courier_testkit::redis_url(), &prefix);
            }
            Store {
                config,
                _keep: Box::new(dir),
            }
        }
    }
}

fn with_redis(mut config: Config, url: &str, prefix: &str) -> Config {
    let text = format!(
        "[streams]\nbackend = \"redis\"\n[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\n"
    );
    let parsed = Config::from_toml_str(&text).unwrap();
    config.streams = parsed.streams;
    config.redis = parsed.redis;
    config
}

fn token(name: &str, tenants: &[&str], roles: &[Role]) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        sha256: hex::encode(Sha256::digest(name.as_bytes())),
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
        roles: roles.to_vec(),
    }
}

/// The clear text of each token is its name.
fn tokens() -> Vec<TokenConfig> {
    vec![
        token(
            "all",
            &["*"],
            &[Role::Admin, Role::Consume, Role::Publish, Role::Read],
        ),
        token("publisher-a", &["a"], &[Role::Publish]),
        token("reader-a", &["a"], &[Role::Read]),
        token("consumer-a", &["a"], &[Role::Consume]),
        token("admin-a", &["a"], &[Role::Admin]),
    ]
}

struct Daemon {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), courier_server::ServeError>>>,
    client: reqwest::Client,
}

/// A reply: status, headers and the body as JSON (`null` when not JSON).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
    text: String,
}

impl Reply {
    fn field(&self) -> Option<&str> {
        self.body["error"]["field"].as_str()
    }
}

impl Daemon {
    async fn start(config: Config) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let running = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let address = running.local_addr();
        Self {
            address,
            stop: Some(stop),
            done: Some(tokio::spawn(running.finished())),
            client: reqwest::Client::new(),
        }
    }

    async fn stopped(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.unwrap().unwrap();
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
        content_type: &str,
    ) -> Reply {
        let mut request = self
            .client
            .request(method, format!("http://{}{path}", self.address));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
            text,
        }
    }

    async fn get(&self, path: &str, token: &str) -> Reply {
        self.send(Method::GET, path, Some(token), None, "").await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> Reply {
        self.send(
            Method::POST,
            path,
            Some(token),
            Some(body.to_string()),
            "application/json",
        )
        .await
    }

    async fn put(&self, path: &str, token: &str, body: Value) -> Reply {
        self.send(
            Method::PUT,
            path,
            Some(token),
            Some(body.to_string()),
            "application/json",
        )
        .await
    }

    async fn delete(&self, path: &str, token: &str) -> Reply {
        self.send(Method::DELETE, path, Some(token), None, "application/json")
            .await
    }

    /// Appends `payloads` to tenant `a`'s `stream`; their ids.
    async fn append(&self, stream: &str, payloads: &[Value]) -> Vec<String> {
        let entries: Vec<Value> = payloads.iter().map(|p| json!({"payload": p})).collect();
        let reply = self
            .post(
                &format!("/v1/streams/a/{stream}/entries"),
                "all",
                json!({ "entries": entries }),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        ids(&reply.body["ids"])
    }

    async fn range(&self, stream: &str) -> Vec<Value> {
        let reply = self
            .get(
                &format!("/v1/streams/a/{stream}/entries?count=10000"),
                "all",
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Reads through `group` as `consumer` until `n` entries came (a read
    /// may return fewer: PostgreSQL hands out an entry once every older
    /// transaction on the server has ended).
    async fn read_n(&self, stream: &str, group: &str, consumer: &str, n: usize) -> Vec<Value> {
        let mut entries = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while entries.len() < n && Instant::now() < deadline {
            let reply = self
                .post(
                    &format!("/v1/streams/a/{stream}/groups/{group}/read"),
                    "all",
                    json!({"consumer": consumer, "count": n - entries.len(), "block_ms": 2000}),
                )
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
            entries.extend(
                reply.body["entries"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        assert_eq!(entries.len(), n, "{entries:?}");
        entries
    }

    async fn pending_count(&self, stream: &str, group: &str) -> u64 {
        let reply = self
            .get(
                &format!("/v1/streams/a/{stream}/groups/{group}/pending"),
                "all",
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body["summary"]["count"].as_u64().unwrap()
    }
}

fn ids(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect()
}

fn entry_ids(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------- every endpoint

async fn every_endpoint_answers_as_documented(backend: Backend) {
    let store = store(backend).await;
    let mut config = store.config.clone();
    config.tokens = tokens();
    let daemon = Daemon::start(config).await;
    let base = "/v1/streams/a/orders";

    let created = daemon
        .put(
            &format!("{base}/groups/g"),
            "all",
            json!({"start": "beginning"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!(created.body, json!({"group": "g", "created": true}));
    let again = daemon
        .put(&format!("{base}/groups/g"), "all", json!({"start": "end"}))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["created"], json!(false));

    let appended = daemon
        .post(
            &format!("{base}/entries"),
            "all",
            json!({"entries": [
                {"payload": {"n": 1}, "headers": {"trace": "t-1"}},
                {"payload": {"n": 2}},
                {"payload": [3, "three"]},
            ]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.text);
    let ids = ids(&appended.body["ids"]);
    assert_eq!(ids.len(), 3);
    let parsed: Vec<courier::StreamEntryId> = ids.iter().map(|id| id.parse().unwrap()).collect();
    assert!(
        parsed.windows(2).all(|w| w[0] < w[1]),
        "ids increase: {ids:?}"
    );

    // Readable once every older writing transaction on a PostgreSQL server
    // has ended (other tests hold some): read until all three are there.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = daemon.range("orders").await;
        if all.len() >= ids.len() || std::time::Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(entry_ids(&all), ids);
    assert_eq!(all[0]["payload"], json!({"n": 1}));
    assert_eq!(all[0]["headers"], json!({"trace": "t-1"}));
    assert_eq!(all[2]["payload"], json!([3, "three"]));
    let page = daemon
        .get(&format!("{base}/entries?after={}&count=1", ids[0]), "all")
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert_eq!(
        entry_ids(page.body["entries"].as_array().unwrap()),
        [ids[1].clone()]
    );

    let read = daemon.read_n("orders", "g", "c1", 2).await;
    assert_eq!(entry_ids(&read), ids[..2]);
    assert_eq!(read[0]["deliveries"], json!(1));
    assert_eq!(read[0]["headers"], json!({"trace": "t-1"}));

    let pending = daemon.get(&format!("{base}/groups/g/pending"), "all").await;
    assert_eq!(pending.status, StatusCode::OK, "{}", pending.text);
    assert_eq!(pending.body["summary"]["count"], json!(2));
    assert_eq!(pending.body["summary"]["consumers"], json!({"c1": 2}));
    assert_eq!(pending.body["summary"]["lowest"], json!(ids[0]));
    assert_eq!(pending.body["summary"]["highest"], json!(ids[1]));
    let detail = pending.body["entries"].as_array().unwrap();
    assert_eq!(entry_ids(detail), ids[..2]);
    assert_eq!(detail[0]["consumer"], json!("c1"));
    assert_eq!(detail[0]["deliveries"], json!(1));
    assert!(detail[0]["idle_ms"].is_u64(), "{detail:?}");
    let filtered = daemon
        .get(
            &format!("{base}/groups/g/pending?consumer=c2&after=0-0&count=5&min_idle_ms=0"),
            "all",
        )
        .await;
    assert_eq!(filtered.status, StatusCode::OK, "{}", filtered.text);
    assert_eq!(filtered.body["entries"], json!([]));
    assert_eq!(filtered.body["summary"]["count"], json!(2));

    let claimed = daemon
        .post(
            &format!("{base}/groups/g/claim"),
            "all",
            json!({"consumer": "c2", "min_idle_ms": 0, "cursor": "0-0", "count": 10}),
        )
        .await;
    assert_eq!(claimed.status, StatusCode::OK, "{}", claimed.text);
    let taken = claimed.body["entries"].as_array().unwrap();
    assert_eq!(entry_ids(taken), ids[..2]);
    assert_eq!(taken[0]["deliveries"], json!(2));
    assert_eq!(claimed.body["deleted"], json!([]));
    assert_eq!(claimed.body["next"], json!("0-0"));

    let consumers = daemon
        .get(&format!("{base}/groups/g/consumers"), "all")
        .await;
    assert_eq!(consumers.status, StatusCode::OK, "{}", consumers.text);
    let list = consumers.body["consumers"].as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["c1", "c2"]);
    assert_eq!(list[0]["pending"], json!(0));
    assert_eq!(list[1]["pending"], json!(2));
    assert!(list[1]["idle_ms"].is_u64());

    let busy = daemon
        .delete(&format!("{base}/groups/g/consumers/c2"), "all")
        .await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{}", busy.text);
    assert_eq!(busy.field(), Some("consumer"));
    assert!(busy.text.contains("(2)"), "{}", busy.text);
    let deleted = daemon
        .delete(&format!("{base}/groups/g/consumers/c1"), "all")
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    let gone = daemon
        .delete(&format!("{base}/groups/g/consumers/c1"), "all")
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.text);
    assert_eq!(gone.field(), Some("consumer"));

    let acked = daemon
        .post(
            &format!("{base}/groups/g/ack"),
            "all",
            json!({"ids": [ids[0], ids[1]]}),
        )
        .await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.text);
    assert_eq!(acked.body, json!({"acked": 2}));
    let twice = daemon
        .post(
            &format!("{base}/groups/g/ack"),
            "all",
            json!({"ids": [ids[0]]}),
        )
        .await;
    assert_eq!(twice.body, json!({"acked": 0}));
    let last = daemon.read_n("orders", "g", "c2", 1).await;
    assert_eq!(entry_ids(&last), [ids[2].clone()]);
    daemon
        .post(
            &format!("{base}/groups/g/ack"),
            "all",
            json!({"ids": [ids[2]]}),
        )
        .await;
    assert_eq!(daemon.pending_count("orders", "g").await, 0);
    let deleted = daemon
        .delete(&format!("{base}/groups/g/consumers/c2"), "all")
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);

    let trimmed = daemon
        .post(&format!("{base}/trim"), "all", json!({"max_len": 1}))
        .await;
    assert_eq!(trimmed.status, StatusCode::OK, "{}", trimmed.text);
    assert_eq!(trimmed.body, json!({"removed": 2}));
    assert_eq!(entry_ids(&daemon.range("orders").await), [ids[2].clone()]);
    let by_id = daemon
        .post(&format!("{base}/trim"), "all", json!({"min_id": ids[2]}))
        .await;
    assert_eq!(by_id.body, json!({"removed": 0}), "{}", by_id.text);

    // A group the stream does not have is 404 on every group route.
    let missing = format!("{base}/groups/nope");
    for reply in [
        daemon
            .post(
                &format!("{missing}/read"),
                "all",
                json!({"consumer": "c", "block_ms": 100}),
            )
            .await,
        daemon
            .post(&format!("{missing}/ack"), "all", json!({"ids": [ids[2]]}))
            .await,
        daemon
            .post(
                &format!("{missing}/claim"),
                "all",
                json!({"consumer": "c", "min_idle_ms": 0}),
            )
            .await,
        daemon.get(&format!("{missing}/pending"), "all").await,
        daemon.get(&format!("{missing}/consumers"), "all").await,
        daemon
            .delete(&format!("{missing}/consumers/c"), "all")
            .await,
    ] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text);
        assert_eq!(reply.field(), Some("group"), "{}", reply.text);
    }

    daemon.stopped().await;
}

// ---------------------------------------------------------------- bad input

async fn bad_input_names_the_field_and_stores_nothing(backend: Backend) {
    let store = store(backend).await;
    let daemon = Daemon::start(store.config.clone()).await;
    let base = "/v1/streams/a/orders";
    daemon
        .put(
            &format!("{base}/groups/g"),
            "all",
            json!({"start": "beginning"}),
        )
        .await;
    let seed = daemon.append("orders", &[json!({"seed": true})]).await;
    daemon.read_n("orders", "g", "c1", 1).await;

    let big = "x".repeat(LIMIT);
    let many: Vec<Value> = (0..10_001).map(|_| json!({"payload": 1})).collect();
    let headers: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("h{i}"), json!("v"))).collect();
    let ack_ids = json!({"ids": [seed[0], "1-0", "2-0", "1-x"]});
    let cases: Vec<(Method, String, Option<String>, StatusCode, &str)> = vec![
        (
            Method::POST,
            "/v1/streams/a:b/orders/entries".into(),
            Some(json!({"entries": [{"payload": 1}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            Method::POST,
            "/v1/streams/a/or%20ders/entries".into(),
            Some(json!({"entries": [{"payload": 1}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "stream",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": []}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": many}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": [{"payload": 1}, {"payload": big}]}).to_string()),
            StatusCode::PAYLOAD_TOO_LARGE,
            "entries[1].payload",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": [{"payload": 1, "headers": {"h": 5}}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries[0].headers.h",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": [{"payload": 1, "headers": headers}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries[0].headers",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": [{"payload": 1}, {"headers": {}}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries[1].payload",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some(json!({"entries": [{"payload": 1, "origin": {}}]}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entries[0].origin",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some("{\"entries\": [{\"payload\": 1}".into()),
            StatusCode::BAD_REQUEST,
            "body",
        ),
        (
            Method::POST,
            format!("{base}/entries"),
            Some("[]".into()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "body",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some(json!({"consumer": "c 1"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "consumer",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some(json!({"consumer": "c", "count": 0}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some(json!({"consumer": "c", "count": 10_001}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some(json!({"consumer": "c", "block_ms": 30_001}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "block_ms",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some(json!({"consumer": "c", "count": -1}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/read"),
            Some("{\"consumer\": ".into()),
            StatusCode::BAD_REQUEST,
            "body",
        ),
        (
            Method::POST,
            format!("{base}/groups/g%3Ax/read"),
            Some(json!({"consumer": "c"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "group",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/ack"),
            Some(ack_ids.to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "ids[3]",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/ack"),
            Some(json!({"ids": []}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "ids",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/claim"),
            Some(json!({"consumer": "c", "min_idle_ms": 0, "count": 0}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/claim"),
            Some(json!({"consumer": "c", "min_idle_ms": 0, "cursor": "next"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cursor",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/claim"),
            Some(json!({"consumer": "c"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "min_idle_ms",
        ),
        (
            Method::POST,
            format!("{base}/groups/g/claim"),
            Some(json!({"consumer": "c", "min_idle_ms": u64::MAX}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "min_idle_ms",
        ),
        (
            Method::GET,
            format!("{base}/groups/g/pending?min_idle_ms=31536000001"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "min_idle_ms",
        ),
        (
            Method::GET,
            format!("{base}/groups/g/pending?count=0"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::GET,
            format!("{base}/groups/g/pending?after=zz"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "after",
        ),
        (
            Method::GET,
            format!("{base}/groups/g/pending?consumer=a:b"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "consumer",
        ),
        (
            Method::GET,
            format!("{base}/groups/g/pending?colour=red"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "colour",
        ),
        (
            Method::GET,
            format!("{base}/entries?count=10001"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "count",
        ),
        (
            Method::GET,
            format!("{base}/entries?after=1"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "after",
        ),
        (
            Method::PUT,
            format!("{base}/groups/g2"),
            Some(json!({"start": "middle"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "start",
        ),
        (
            Method::POST,
            format!("{base}/trim"),
            Some(json!({}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "max_len",
        ),
        (
            Method::POST,
            format!("{base}/trim"),
            Some(json!({"max_len": 0, "min_id": "1-0"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "min_id",
        ),
        (
            Method::POST,
            format!("{base}/trim"),
            Some(json!({"min_id": "x"}).to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "min_id",
        ),
        (
            Method::DELETE,
            format!("{base}/groups/g/consumers/c%3A1"),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "consumer",
        ),
    ];
    for (method, path, body, status, field) in cases {
        let reply = daemon
            .send(method.clone(), &path, None, body, "application/json")
            .await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text);
        assert_eq!(
            reply.field(),
            Some(field),
            "{method} {path}: {}",
            reply.text
        );
        assert!(reply.body["error"]["message"].is_string(), "{}", reply.text);
    }
    let text_plain = daemon
        .send(
            Method::POST,
            &format!("{base}/entries"),
            None,
            Some(json!({"entries": [{"payload": 1}]}).to_string()),
            "text/plain",
        )
        .await;
    assert_eq!(text_plain.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // Nothing was stored: one entry, still pending for c1 alone; no group g2,
    // no consumer c.
    assert_eq!(entry_ids(&daemon.range("orders").await), seed);
    assert_eq!(daemon.pending_count("orders", "g").await, 1);
    let consumers = daemon
        .get(&format!("{base}/groups/g/consumers"), "all")
        .await;
    let names: Vec<&str> = consumers.body["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c1"]);
    let no_group = daemon
        .get(&format!("{base}/groups/g2/pending"), "all")
        .await;
    assert_eq!(no_group.status, StatusCode::NOT_FOUND, "{}", no_group.text);
    assert!(daemon.range("or").await.is_empty());
    daemon.stopped().await;
}

// ---------------------------------------------------------------- roles and tenants

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_who_appends_consumes_and_administers_and_other_tenants_are_hidden() {
    let store = store(Backend::Sqlite).await;
    let mut config = store.config.clone();
    config.tokens = tokens();
    let daemon = Daemon::start(config).await;
    let a = "/v1/streams/a/orders";
    let b = "/v1/streams/b/orders";
    for base in [a, b] {
        let reply = daemon
            .put(
                &format!("{base}/groups/g"),
                "all",
                json!({"start": "beginning"}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    let one = json!({"entries": [{"payload": 1}]});
    let b_entry = daemon
        .post(&format!("{b}/entries"), "all", one.clone())
        .await;
    assert_eq!(b_entry.status, StatusCode::CREATED);

    // publish: appends to its tenant only.
    let appended = daemon
        .post(&format!("{a}/entries"), "publisher-a", one.clone())
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.text);
    let entry = ids(&appended.body["ids"]).remove(0);
    let other = daemon
        .post(&format!("{b}/entries"), "publisher-a", one.clone())
        .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN, "{}", other.text);
    assert_eq!(other.field(), Some("tenant"));
    let read_json = json!({"consumer": "c"});
    for (method, path, body) in [
        (
            Method::POST,
            format!("{a}/groups/g/read"),
            Some(read_json.clone()),
        ),
        (Method::GET, format!("{a}/entries"), None),
    ] {
        let reply = daemon
            .send(
                method,
                &path,
                Some("publisher-a"),
                body.map(|b| b.to_string()),
                "application/json",
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::FORBIDDEN,
            "{path}: {}",
            reply.text
        );
    }

    // consume: reads, acks and claims through a group; nothing else.
    let read = daemon
        .post(
            &format!("{a}/groups/g/read"),
            "consumer-a",
            json!({"consumer": "c", "block_ms": 2000}),
        )
        .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);
    assert_eq!(
        entry_ids(read.body["entries"].as_array().unwrap()),
        std::slice::from_ref(&entry)
    );
    let claimed = daemon
        .post(
            &format!("{a}/groups/g/claim"),
            "consumer-a",
            json!({"consumer": "d", "min_idle_ms": 0}),
        )
        .await;
    assert_eq!(claimed.status, StatusCode::OK, "{}", claimed.text);
    assert_eq!(
        entry_ids(claimed.body["entries"].as_array().unwrap()),
        std::slice::from_ref(&entry)
    );
    let acked = daemon
        .post(
            &format!("{a}/groups/g/ack"),
            "consumer-a",
            json!({"ids": [entry]}),
        )
        .await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.text);
    assert_eq!(acked.body["acked"], json!(1));
    for (method, path, body) in [
        (Method::POST, format!("{a}/entries"), Some(one.clone())),
        (
            Method::POST,
            format!("{a}/trim"),
            Some(json!({"max_len": 0})),
        ),
        (Method::PUT, format!("{a}/groups/h"), Some(json!({}))),
        (Method::DELETE, format!("{a}/groups/g/consumers/c"), None),
        (Method::GET, format!("{a}/entries"), None),
        (Method::GET, format!("{a}/groups/g/pending"), None),
        (Method::GET, format!("{a}/groups/g/consumers"), None),
    ] {
        let reply = daemon
            .send(
                method.clone(),
                &path,
                Some("consumer-a"),
                body.map(|b| b.to_string()),
                "application/json",
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {}",
            reply.text
        );
    }
    // Another tenant's stream does not exist for it.
    for (path, body) in [
        (format!("{b}/groups/g/read"), json!({"consumer": "c"})),
        (format!("{b}/groups/g/ack"), json!({"ids": ["1-0"]})),
        (
            format!("{b}/groups/g/claim"),
            json!({"consumer": "c", "min_idle_ms": 0}),
        ),
    ] {
        let reply = daemon.post(&path, "consumer-a", body).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{path}: {}",
            reply.text
        );
    }

    // read: lists entries, pending entries and consumers of its tenant.
    for path in [
        format!("{a}/entries"),
        format!("{a}/groups/g/pending"),
        format!("{a}/groups/g/consumers"),
    ] {
        assert_eq!(
            daemon.get(&path, "reader-a").await.status,
            StatusCode::OK,
            "{path}"
        );
        let hidden = path.replace("/a/", "/b/");
        let reply = daemon.get(&hidden, "reader-a").await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{hidden}: {}",
            reply.text
        );
    }
    let reply = daemon
        .post(&format!("{a}/groups/g/read"), "reader-a", read_json.clone())
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);

    // admin: groups, trims, consumer deletion (and reading), its tenant only.
    let group = daemon
        .put(&format!("{a}/groups/h"), "admin-a", json!({}))
        .await;
    assert_eq!(group.status, StatusCode::CREATED, "{}", group.text);
    assert_eq!(
        daemon.get(&format!("{a}/entries"), "admin-a").await.status,
        StatusCode::OK
    );
    let deleted = daemon
        .delete(&format!("{a}/groups/g/consumers/c"), "admin-a")
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text);
    for reply in [
        daemon
            .put(&format!("{b}/groups/h"), "admin-a", json!({}))
            .await,
        daemon
            .post(&format!("{b}/trim"), "admin-a", json!({"max_len": 0}))
            .await,
        daemon
            .delete(&format!("{b}/groups/g/consumers/c"), "admin-a")
            .await,
        daemon.get(&format!("{b}/entries"), "admin-a").await,
    ] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text);
    }
    let reply = daemon
        .post(&format!("{a}/groups/g/read"), "admin-a", read_json)
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let trimmed = daemon
        .post(&format!("{a}/trim"), "admin-a", json!({"max_len": 0}))
        .await;
    assert_eq!(trimmed.body, json!({"removed": 1}), "{}", trimmed.text);

    // No token, or an unknown one.
    let anonymous = daemon
        .send(Method::GET, &format!("{a}/entries"), None, None, "")
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let unknown = daemon.get(&format!("{a}/entries"), "nobody").await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);

    // Tenant b's stream was not touched by any of it: its entry, unread.
    let b_entries = daemon.get(&format!("{b}/entries"), "all").await;
    assert_eq!(b_entries.body["entries"].as_array().map(Vec::len), Some(1));
    let b_pending = daemon.get(&format!("{b}/groups/g/pending"), "all").await;
    assert_eq!(b_pending.body["summary"]["count"], json!(0));
    let b_groups = daemon.get(&format!("{b}/groups/h/pending"), "all").await;
    assert_eq!(b_groups.status, StatusCode::NOT_FOUND);
    daemon.stopped().await;
}

// ---------------------------------------------------------------- listing

/// (tenant, stream) of each item of a `GET /v1/streams` page.
fn listed(reply: &Reply) -> Vec<(String, String)> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            (
                item["tenant"].as_str().unwrap().to_owned(),
                item["stream"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Follows `next_cursor` from `query` (which pages by 1 or 2) to the end;
/// every stream of every page, and how many pages.
async fn walk(daemon: &Daemon, query: &str, token: &str) -> (Vec<(String, String)>, usize) {
    let (mut walked, mut pages) = (Vec::new(), 0);
    let mut path = format!("/v1/streams?{query}");
    loop {
        let reply = daemon.get(&path, token).await;
        walked.extend(listed(&reply));
        pages += 1;
        assert!(pages <= 10, "paging does not end: {walked:?}");
        match reply.body["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/streams?{query}&cursor={cursor}"),
            None => return (walked, pages),
        }
    }
}

async fn the_stream_listing_shows_a_token_its_tenants_streams_a_page_at_a_time(backend: Backend) {
    let store = store(backend).await;
    let mut config = store.config.clone();
    config.tokens = tokens();
    let daemon = Daemon::start(config).await;
    let ids = daemon.append("orders", &[json!(1), json!(2)]).await;
    daemon.append("audit", &[json!(3)]).await;
    let group = daemon
        .put(
            "/v1/streams/a/orders/groups/g",
            "all",
            json!({"start": "beginning"}),
        )
        .await;
    assert_eq!(group.status, StatusCode::CREATED, "{}", group.text);
    daemon.read_n("orders", "g", "c", 1).await;
    let empty = daemon
        .put("/v1/streams/a/empty/groups/g", "all", json!({}))
        .await;
    assert_eq!(empty.status, StatusCode::CREATED, "{}", empty.text);
    let other = daemon
        .post(
            "/v1/streams/b/orders/entries",
            "all",
            json!({"entries": [{"payload": 4}]}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.text);
    let pair = |tenant: &str, stream: &str| (tenant.to_owned(), stream.to_owned());
    let of_a = vec![pair("a", "audit"), pair("a", "empty"), pair("a", "orders")];
    let every = [of_a.clone(), vec![pair("b", "orders")]].concat();

    // Everything, in one page, in the documented shape.
    let all = daemon.get("/v1/streams", "all").await;
    assert_eq!(listed(&all), every);
    assert_eq!(all.body["next_cursor"], Value::Null);
    assert_eq!(
        all.body["items"][2],
        json!({
            "tenant": "a",
            "stream": "orders",
            "length": 2,
            "last_id": ids[1],
            "groups": [{
                "name": "g",
                "consumers": 1,
                "pending": 1,
                "lag": 1,
                "last_delivered_id": ids[0],
            }],
        })
    );
    assert_eq!(all.body["items"][1]["last_id"], Value::Null);
    assert_eq!(all.body["items"][1]["length"], json!(0));

    // A token sees its tenants only; asking for another is 403.
    for token in ["reader-a", "admin-a"] {
        assert_eq!(
            listed(&daemon.get("/v1/streams", token).await),
            of_a,
            "{token}"
        );
        let mine = daemon.get("/v1/streams?tenant=a", token).await;
        assert_eq!(listed(&mine), of_a, "{token}");
        let theirs = daemon.get("/v1/streams?tenant=b", token).await;
        assert_eq!(theirs.status, StatusCode::FORBIDDEN, "{}", theirs.text);
        assert_eq!(theirs.field(), Some("tenant"));
    }
    let only_b = daemon.get("/v1/streams?tenant=b", "all").await;
    assert_eq!(listed(&only_b), vec![pair("b", "orders")]);
    for token in ["publisher-a", "consumer-a"] {
        let refused = daemon.get("/v1/streams", token).await;
        assert_eq!(
            refused.status,
            StatusCode::FORBIDDEN,
            "{token}: {}",
            refused.text
        );
    }
    let anonymous = daemon
        .send(Method::GET, "/v1/streams", None, None, "")
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    // Pages walk every stream once, each page continuing the last.
    assert_eq!(walk(&daemon, "limit=1", "all").await, (every.clone(), 4));
    assert_eq!(
        walk(&daemon, "limit=2", "reader-a").await,
        (of_a.clone(), 2)
    );
    assert_eq!(
        walk(&daemon, "limit=1&tenant=b", "all").await.0,
        vec![pair("b", "orders")]
    );
    // A cursor carries no access: reader-a following the full list's stays in a.
    let first = daemon.get("/v1/streams?limit=3", "all").await;
    let cursor = first.body["next_cursor"].as_str().unwrap().to_owned();
    let after = daemon
        .get(&format!("/v1/streams?cursor={cursor}"), "reader-a")
        .await;
    assert_eq!(listed(&after), Vec::<(String, String)>::new());

    // Bad parameters are refused naming them.
    for (query, status, field) in [
        ("limit=0", StatusCode::UNPROCESSABLE_ENTITY, "limit"),
        ("limit=501", StatusCode::UNPROCESSABLE_ENTITY, "limit"),
        ("limit=many", StatusCode::UNPROCESSABLE_ENTITY, "limit"),
        ("tenant=a:b", StatusCode::UNPROCESSABLE_ENTITY, "tenant"),
        ("cursor=nope", StatusCode::BAD_REQUEST, "cursor"),
        ("group=g", StatusCode::UNPROCESSABLE_ENTITY, "group"),
    ] {
        let reply = daemon.get(&format!("/v1/streams?{query}"), "all").await;
        assert_eq!(reply.status, status, "{query}: {}", reply.text);
        assert_eq!(reply.field(), Some(field), "{query}");
    }
    daemon.stopped().await;
}

/// A router built without a stream backend answers the listing 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_listing_is_404_without_a_stream_backend() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("courier.db");
    let store = courier::sqlite::SqliteStore::new(
        courier::sqlite::connect(path.to_str().unwrap(), 1)
            .await
            .unwrap(),
    );
    let auth = courier_server::Authenticator::new(&tokens()).unwrap();
    let router = courier_server::router(courier_server::ApiState::with_authenticator(
        store, auth, LIMIT,
    ));
    let request = axum::http::Request::builder()
        .uri("/v1/streams")
        .header("authorization", "Bearer all")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // The route's own answer, not the fallback's "no such route".
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("no stream backend"), "{text}");
}

// ---------------------------------------------------------------- blocking reads

async fn a_blocking_read_waits_alone_and_returns_on_append(backend: Backend) {
    let store = store(backend).await;
    let daemon = Arc::new(Daemon::start(store.config.clone()).await);
    let base = "/v1/streams/a/orders";
    daemon
        .put(&format!("{base}/groups/g"), "all", json!({}))
        .await;
    let started = Instant::now();
    let reader = {
        let daemon = Arc::clone(&daemon);
        tokio::spawn(async move {
            daemon
                .post(
                    &format!("{base}/groups/g/read"),
                    "all",
                    json!({"consumer": "c", "block_ms": 20_000}),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Other requests go on while the read waits.
    let listed = daemon.get(&format!("{base}/entries"), "all").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert!(!reader.is_finished());
    let appended = daemon.append("orders", &[json!({"n": 1})]).await;
    let reply = reader.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        entry_ids(reply.body["entries"].as_array().unwrap()),
        appended
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the read returned on the append, not at its block: {:?}",
        started.elapsed()
    );
    Arc::into_inner(daemon).unwrap().stopped().await;
}

async fn a_blocking_read_ends_when_its_client_goes_away(backend: Backend) {
    let store = store(backend).await;
    let daemon = Daemon::start(store.config.clone()).await;
    let base = "/v1/streams/a/orders";
    daemon
        .put(&format!("{base}/groups/g"), "all", json!({}))
        .await;
    // A client that gives up after 300 ms on a read that would wait 20 s.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("http://{}{base}/groups/g/read", daemon.address))
        .header("content-type", "application/json")
        .body(json!({"consumer": "gone", "block_ms": 20_000}).to_string())
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    // Time for the daemon to see the connection close (a loaded machine
    // may take a while to).
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // Had the read kept waiting, it would take this entry for `gone`.
    let appended = daemon.append("orders", &[json!({"n": 1})]).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(daemon.pending_count("orders", "g").await, 0);
    let read = daemon.read_n("orders", "g", "present", 1).await;
    assert_eq!(entry_ids(&read), appended);
    daemon.stopped().await;
}

/// A `block_ms` the API accepts (up to 30,000) is answered even where
/// `server.request_timeout_ms` is shorter: the read waits until a second
/// before the request timeout and answers with what arrived (nothing
/// here), rather than being cut off with 408.
async fn a_blocking_read_longer_than_the_request_timeout_is_answered(backend: Backend) {
    let store = store(backend).await;
    let mut config = store.config.clone();
    config.server.request_timeout_ms = 3_000;
    let daemon = Daemon::start(config).await;
    let base = "/v1/streams/a/orders";
    daemon
        .put(&format!("{base}/groups/g"), "all", json!({}))
        .await;
    let read = daemon
        .post(
            &format!("{base}/groups/g/read"),
            "all",
            json!({"consumer": "c", "block_ms": 20_000}),
        )
        .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);
    assert_eq!(read.body, json!({"entries": []}));
    // The read took nothing: an entry appended now goes to the next reader.
    let appended = daemon.append("orders", &[json!({"n": 1})]).await;
    let next = daemon.read_n("orders", "g", "c", 1).await;
    assert_eq!(entry_ids(&next), appended);
    daemon.stopped().await;
}

async fn a_blocking_read_ends_when_the_daemon_shuts_down(backend: Backend) {
    let store = store(backend).await;
    let mut config = store.config.clone();
    config.shutdown_timeout_ms = 60_000;
    let mut daemon = Daemon::start(config).await;
    let base = "/v1/streams/a/orders";
    daemon
        .put(&format!("{base}/groups/g"), "all", json!({}))
        .await;
    let address = daemon.address;
    let reader = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{address}{base}/groups/g/read"))
            .header("content-type", "application/json")
            .body(json!({"consumer": "c", "block_ms": 30_000}).to_string())
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let _ = daemon.stop.take().unwrap().send(());
    let done = daemon.done.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("shutdown is not held up by the blocking read")
        .unwrap()
        .unwrap();
    let response = reader.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body, json!({"entries": []}));
    assert!(started.elapsed() < Duration::from_secs(10));
}

// ---------------------------------------------------------------- Redis outages

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis server of the test's own, on `port`, without persistence.
fn start_redis(port: u16) -> std::process::Child {
    std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)")
}

async fn redis_answers(port: u16) -> bool {
    eventually(Duration::from_secs(10), || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_refuses_to_start_when_redis_is_unreachable() {
    let store = store(Backend::Sqlite).await;
    let port = free_port();
    let config = with_redis(
        store.config.clone(),
        &format!("redis://:hunter2@127.0.0.1:{port}"),
        "x:",
    );
    let error = courier_server::bind(config, async {}).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, courier_server::ServeError::Streams { .. }),
        "{text}"
    );
    assert!(
        text.contains("redis") && text.contains(&format!("127.0.0.1:{port}")),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_503_with_retry_after_and_ends_when_redis_is_back() {
    let store = store(Backend::Sqlite).await;
    let port = free_port();
    let mut redis = start_redis(port);
    assert!(redis_answers(port).await, "redis-server started");
    let config = with_redis(
        store.config.clone(),
        &format!("redis://127.0.0.1:{port}"),
        "t:",
    );
    let daemon = Daemon::start(config).await;
    let base = "/v1/streams/a/orders";
    daemon.append("orders", &[json!({"n": 1})]).await;

    redis.kill().unwrap();
    redis.wait().unwrap();
    let one = json!({"entries": [{"payload": 2}]});
    for reply in [
        daemon
            .post(&format!("{base}/entries"), "all", one.clone())
            .await,
        daemon.get(&format!("{base}/entries"), "all").await,
        daemon
            .put(&format!("{base}/groups/g"), "all", json!({}))
            .await,
        daemon
            .post(
                &format!("{base}/groups/g/read"),
                "all",
                json!({"consumer": "c", "block_ms": 500}),
            )
            .await,
    ] {
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text
        );
        assert_eq!(
            reply
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        assert!(reply.text.contains("redis"), "{}", reply.text);
    }
    // Not ready while Redis is down (public answer: the status only).
    let readiness = daemon.get("/readyz", "all").await;
    assert_eq!(
        readiness.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        readiness.text
    );
    // The outbox is not affected.
    let published = daemon
        .post(
            "/v1/messages",
            "all",
            json!({"tenant": "a", "topic": "t", "payload": 1}),
        )
        .await;
    assert_eq!(published.status, StatusCode::CREATED, "{}", published.text);

    // Back (empty: no persistence): the same requests succeed again.
    let mut redis = start_redis(port);
    assert!(redis_answers(port).await);
    let recovered = eventually(Duration::from_secs(20), || {
        let daemon = &daemon;
        let one = one.clone();
        async move {
            daemon
                .post(&format!("{base}/entries"), "all", one)
                .await
                .status
                == StatusCode::CREATED
        }
    })
    .await;
    assert!(recovered, "appends succeed once Redis is back");
    assert_eq!(daemon.get("/readyz", "all").await.status, StatusCode::OK);
    assert_eq!(daemon.range("orders").await.len(), 1);
    daemon.stopped().await;
    redis.kill().unwrap();
    redis.wait().unwrap();
}

// ---------------------------------------------------------------- stream subscriptions

#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

/// Answers by the payload's `case`: `ok` 200; `flaky` 500 once; `bad` 400;
/// `busy` 429 with `Retry-After: 1` once; 200 after.
#[derive(Clone, Default)]
struct Receiver {
    log: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn by_id(&self) -> HashMap<String, Vec<Received>> {
        let mut map: HashMap<String, Vec<Received>> = HashMap::new();
        for received in self.log.lock().unwrap().iter() {
            let id = received.headers["webhook-id"].to_str().unwrap().to_owned();
            map.entry(id).or_default().push(received.clone());
        }
        map
    }

    fn total(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let case = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["case"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut log = receiver.log.lock().unwrap();
    let id = headers["webhook-id"].to_str().unwrap().to_owned();
    let earlier = log
        .iter()
        .filter(|r| r.headers["webhook-id"] == id.as_str())
        .count();
    log.push(Received {
        headers,
        body,
        at: Instant::now(),
    });
    match (case.as_str(), earlier) {
        ("flaky", 0) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        ("bad", _) => (axum::http::StatusCode::BAD_REQUEST, "no such order").into_response(),
        ("busy", 0) => (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "slow down",
        )
            .into_response(),
        _ => axum::http::StatusCode::OK.into_response(),
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

async fn a_stream_subscription_delivers_each_entry_once_retries_defers_and_dead_letters(
    backend: Backend,
) {
    let (receiver, hook) = start_receiver().await;
    let store = store(backend).await;
    let text = format!(
        r#"
        [[stream_subscriptions]]
        name = "hook"
        tenant = "a"
        stream = "orders"
        consumer = "daemon-1"
        batch = 20
        block_ms = 100
        min_idle_ms = 300
        claim_interval_ms = 100
        max_deliveries = 5
        defer_min_ms = 100
        defer_max_ms = 2000
        [stream_subscriptions.target]
        type = "webhook"
        url = "http://{hook}/streams"
        secret = "{SECRET}"
        timeout_ms = 5000
        "#
    );
    let mut config = store.config.clone();
    config.stream_subscriptions = Config::from_toml_str(&text).unwrap().stream_subscriptions;
    let daemon = Daemon::start(config).await;

    let mut payloads: Vec<Value> = (0..5).map(|n| json!({"case": "ok", "n": n})).collect();
    payloads.extend([
        json!({"case": "flaky"}),
        json!({"case": "bad"}),
        json!({"case": "busy"}),
    ]);
    let ids = daemon.append("orders", &payloads).await;
    let correlation = |id: &str| format!("hook:orders:{id}");

    let settled = eventually(Duration::from_secs(30), || {
        let daemon = &daemon;
        let receiver = receiver.clone();
        async move {
            receiver.total() >= 10
                && daemon.pending_count("orders", "hook").await == 0
                && daemon.range("orders.dead").await.len() == 1
        }
    })
    .await;
    assert!(settled, "received {:?}", receiver.by_id().keys());
    // Nothing more arrives once every entry is settled.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let by_id = receiver.by_id();
    assert_eq!(receiver.total(), 10, "{:?}", by_id.keys());
    assert_eq!(by_id.len(), 8);

    let secret = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        SECRET.trim_start_matches("whsec_"),
    )
    .unwrap();
    for (i, id) in ids.iter().enumerate() {
        let requests = &by_id[&correlation(id)];
        let expected = match i {
            5 | 7 => 2,
            _ => 1,
        };
        assert_eq!(requests.len(), expected, "entry {i} ({id})");
        let first = &requests[0];
        let header = |name: &str| first.headers[name].to_str().unwrap().to_owned();
        assert_eq!(header("courier-tenant"), "a");
        assert_eq!(header("courier-stream"), "orders");
        assert_eq!(header("courier-entry-id"), *id);
        assert_eq!(header("courier-delivery"), "1");
        let body: Value = serde_json::from_slice(&first.body).unwrap();
        assert_eq!(body, payloads[i]);
        let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
        assert!(courier_server::webhook::verify(
            &secret,
            &correlation(id),
            timestamp,
            &first.body,
            &header("webhook-signature"),
            courier_server::webhook::DEFAULT_TOLERANCE,
        ));
    }
    // The 500 was retried once the entry had been idle for min_idle.
    let flaky = &by_id[&correlation(&ids[5])];
    assert_eq!(flaky[1].headers["courier-delivery"], "2");
    assert!(
        flaky[1].at - flaky[0].at >= Duration::from_millis(250),
        "{:?}",
        flaky[1].at - flaky[0].at
    );
    // The 429 was a deferral: its redelivery is still delivery 1.
    let busy = &by_id[&correlation(&ids[7])];
    assert_eq!(busy[1].headers["courier-delivery"], "1");
    // The 400 went to orders.dead, with where it came from and why.
    let dead = daemon.range("orders.dead").await;
    assert_eq!(dead[0]["payload"], json!({"case": "bad"}));
    assert_eq!(dead[0]["headers"]["courier-original-id"], json!(ids[6]));
    assert_eq!(
        dead[0]["headers"]["courier-original-stream"],
        json!("orders")
    );
    let errors = dead[0]["headers"]["courier-errors"].as_str().unwrap();
    assert!(errors.contains("400"), "{errors}");
    daemon.stopped().await;
}

/// A `redis_key` subscription reads a stream another program writes at a
/// key of its own: each foreign entry reaches the webhook once, as the object
/// of its fields, and is acked in the group at that key; one the endpoint
/// refuses (400) is dead-lettered to `{redis_key}.dead`. A `redis_key` without the Redis
/// backend is refused at start, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_reads_a_raw_redis_key_another_program_writes() {
    use courier::redis::{redis, RedisStreamStore};
    let (receiver, hook) = start_receiver().await;
    let store = store(Backend::Redis).await;
    let prefix = store.config.redis.as_ref().unwrap().key_prefix.clone();
    // Under the test's prefix only so that it is easy to clean up.
    let raw = format!("{prefix}legacy-orders");
    let text = format!(
        r#"
        [[stream_subscriptions]]
        name = "hook"
        tenant = "a"
        stream = "orders"
        redis_key = "{raw}"
        start = "beginning"
        block_ms = 100
        min_idle_ms = 300
        claim_interval_ms = 100
        max_deliveries = 2
        [stream_subscriptions.target]
        type = "webhook"
        url = "http://{hook}/streams"
        secret = "{SECRET}"
        "#
    );
    let refused = Config::from_toml_str(&text).err();
    assert_eq!(
        refused.as_ref().and_then(|e| e.key()),
        Some("stream_subscriptions[0].redis_key"),
        "{refused:?}"
    );
    let on_redis = Config::from_toml_str(&format!(
        "[streams]\nbackend = \"redis\"\n[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n{text}",
        courier_testkit::redis_url()
    ))
    .unwrap();

    let redis_store = RedisStreamStore::connect(&courier_testkit::redis_url(), &prefix)
        .await
        .unwrap();
    let mut connection = redis_store.connection();
    let mut ids = Vec::new();
    for case in ["ok", "ok", "bad"] {
        let id: String = redis::cmd("XADD")
            .arg(&raw)
            .arg("*")
            .arg("case")
            .arg(case)
            .arg("source")
            .arg("legacy")
            .query_async(&mut connection)
            .await
            .unwrap();
        ids.push(id);
    }
    let mut config = store.config.clone();
    config.stream_subscriptions = on_redis.stream_subscriptions;
    let daemon = Daemon::start(config).await;

    let dead = format!("{raw}.dead");
    let settled = eventually(Duration::from_secs(30), || {
        let receiver = receiver.clone();
        let mut connection = connection.clone();
        let (raw, dead) = (raw.clone(), dead.clone());
        async move {
            let pending: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
                .arg(&raw)
                .arg("hook")
                .query_async(&mut connection)
                .await
                .unwrap_or((1, redis::Value::Nil, redis::Value::Nil, redis::Value::Nil));
            let dead_len: u64 = redis::cmd("XLEN")
                .arg(&dead)
                .query_async(&mut connection)
                .await
                .unwrap_or(0);
            receiver.total() >= 3 && pending.0 == 0 && dead_len == 1
        }
    })
    .await;
    assert!(settled, "received {:?}", receiver.by_id().keys());
    let by_id = receiver.by_id();
    for (i, id) in ids.iter().enumerate() {
        let requests = &by_id[&format!("hook:orders:{id}")];
        assert_eq!(requests.len(), 1, "entry {i}");
        let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
        let case = if i == 2 { "bad" } else { "ok" };
        assert_eq!(body, json!({"case": case, "source": "legacy"}));
    }
    // Nothing was written at {prefix}{tenant}:{stream}.
    let under_prefix: i64 = redis::cmd("EXISTS")
        .arg(format!("{prefix}a:orders"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(under_prefix, 0);
    daemon.stopped().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&raw)
        .arg(&dead)
        .query_async(&mut connection)
        .await
        .unwrap();
}

// ---------------------------------------------------------------- per backend

macro_rules! per_backend {
    ($($name:ident: [$($backend:ident),+]),* $(,)?) => {
        $(
            mod $name {
                $(
                    #[allow(non_snake_case)]
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $backend() {
                        super::$name(super::Backend::$backend).await;
                    }
                )+
            }
        )*
    };
}

per_backend! {
    every_endpoint_answers_as_documented: [Sqlite, Postgres, Redis],
    bad_input_names_the_field_and_stores_nothing: [Sqlite, Postgres, Redis],
    a_blocking_read_waits_alone_and_returns_on_append: [Sqlite, Postgres, Redis],
    a_blocking_read_ends_when_its_client_goes_away: [Sqlite, Postgres, Redis],
    a_blocking_read_ends_when_the_daemon_shuts_down: [Sqlite, Redis],
    a_blocking_read_longer_than_the_request_timeout_is_answered: [Sqlite, Postgres, Redis],
    a_stream_subscription_delivers_each_entry_once_retries_defers_and_dead_letters: [Sqlite, Postgres, Redis],
    the_stream_listing_shows_a_token_its_tenants_streams_a_page_at_a_time: [Sqlite, Postgres, Redis],
}
