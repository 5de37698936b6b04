//! Helpers for the router tests: requests without a socket, tokens, fixtures.
// Test helpers: a panic is the failure report, and not every test uses every helper.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use courier::{handler_fn, AdminStore, Courier, DeadLetterStore, HandlerError, OutboxStore};
use courier_server::config::{Role, TokenConfig};
use courier_server::{ApiState, Authenticator};
use http_body_util::BodyExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tower::ServiceExt;

pub mod counting;

/// A response: status, headers of interest and the body as JSON (or a string).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
    pub text: String,
    pub content_type: String,
}

impl Reply {
    /// The `error.field` of an error reply.
    pub fn field(&self) -> Option<&str> {
        self.body["error"]["field"].as_str()
    }

    /// The `error.code` of an error reply.
    pub fn code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }
}

/// Sends one request to `app` without a socket.
pub async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<Body>,
    extra_headers: &[(&str, &str)],
) -> Reply {
    // Every state change declares JSON, bodiless ones too (the API refuses
    // them otherwise); a test that sends another type names it.
    let changes_state = !matches!(method, Method::GET | Method::HEAD);
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if (body.is_some() || changes_state)
        && !extra_headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    for (name, value) in extra_headers {
        request = request.header(*name, *value);
    }
    let request = request.body(body.unwrap_or_else(Body::empty)).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        body,
        text,
        content_type,
    }
}

pub async fn get(app: &Router, uri: &str, token: Option<&str>) -> Reply {
    call(app, Method::GET, uri, token, None, &[]).await
}

pub async fn post(app: &Router, uri: &str, token: Option<&str>, body: &Value) -> Reply {
    call(
        app,
        Method::POST,
        uri,
        token,
        Some(Body::from(body.to_string())),
        &[],
    )
    .await
}

pub async fn post_raw(
    app: &Router,
    uri: &str,
    token: Option<&str>,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> Reply {
    call(app, Method::POST, uri, token, Some(body.into()), headers).await
}

/// A token config whose clear text is `secret`.
pub fn token(name: &str, secret: &str, tenants: &[&str], roles: &[Role]) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        sha256: hex::encode(Sha256::digest(secret.as_bytes())),
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
        roles: roles.to_vec(),
    }
}

/// The tokens most tests use; the clear text of each is its name.
pub fn standard_tokens() -> Vec<TokenConfig> {
    vec![
        token("publisher-a", "publisher-a", &["a"], &[Role::Publish]),
        token("reader-a", "reader-a", &["a"], &[Role::Read]),
        token("admin-a", "admin-a", &["a"], &[Role::Admin]),
        token("admin-all", "admin-all", &["*"], &[Role::Admin]),
        token(
            "all",
            "all",
            &["*"],
            &[Role::Admin, Role::Publish, Role::Read],
        ),
        token(
            "both-ab",
            "both-ab",
            &["a", "b"],
            &[Role::Admin, Role::Publish, Role::Read],
        ),
    ]
}

/// A router over `store` with `tokens` (none: open) and a payload limit.
pub fn app<S>(store: S, tokens: &[TokenConfig], max_payload_bytes: usize) -> Router
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let auth = Authenticator::new(tokens).unwrap();
    courier_server::router(ApiState::with_authenticator(store, auth, max_payload_bytes))
}

/// A message body for `tenant` on `topic`.
pub fn message(tenant: &str, topic: &str) -> Value {
    serde_json::json!({"tenant": tenant, "topic": topic, "payload": {"n": 1}})
}

/// Generates each named generic test once per backend, with `AdminStore` in the bound.
#[macro_export]
macro_rules! api_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    let fixture = courier_testkit::PgFixture::new().await?;
                    super::$name(courier_testkit::Backend::courier(&fixture).clone()).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    let fixture = courier_testkit::SqliteFixture::new().await?;
                    let result = super::$name(courier_testkit::Backend::courier(&fixture).clone()).await;
                    drop(fixture);
                    result
                }
            )*
        }
    };
}

/// A worker of `subscription` whose handler refuses every message of
/// `topic` (a permanent failure: each message it runs becomes a dead letter).
pub async fn refusing_worker<S>(
    courier: &Courier<S>,
    subscription: &str,
    topic: &str,
) -> anyhow::Result<courier::Worker<S>>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    Ok(courier
        .worker(subscription)
        .handle(
            topic,
            1,
            handler_fn(|_message: courier::Message<Value>| async {
                Err::<(), _>(HandlerError::permanent("refused"))
            }),
        )
        .build()
        .await?)
}
