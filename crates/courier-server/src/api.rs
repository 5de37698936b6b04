//! The HTTP API: publish, inspect, dead letters, subscriptions, health,
//! metrics, and the OpenAPI document generated from these handlers.
//!
//! Every route and its documentation are declared together (`utoipa-axum`'s
//! `routes!`), so the document served at `/v1/openapi.json` lists exactly the
//! routes the router serves.
//!
//! Before any handler runs, [`crate::guard`] refuses what a browser could
//! send on a user's behalf: a foreign `Host` (421), a foreign `Origin` (403)
//! and a state change not declared as JSON (415).
//!
//! Input is refused before anything is stored: the body is capped before it is
//! read (413), must be JSON (400), must match the request type exactly —
//! unknown fields and wrong types are refused (422) — and every name, key,
//! header and time is validated (422); the error names the field. A batch is
//! stored all or nothing.
//!
//! Access: `publish` to publish, `read` (or `admin`) to read, `admin` for
//! dead-letter retry/discard and subscription pause/resume. The streams
//! routes under `/v1/streams` are in [`crate::stream_api`]. A token sees only
//! its tenants: another tenant's message is 404, publishing for another tenant
//! 403. Pausing a subscription affects every tenant, so it needs a token
//! scoped to `*`; `/metrics` shows every tenant's counts, so it needs
//! `admin` (or a listener of its own, [`metrics_router`]). `/healthz`,
//! `/readyz` and `/v1/openapi.json` are public.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{
    DefaultBodyLimit, FromRef, FromRequest, FromRequestParts, Path, Request, State,
};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use courier::{
    validate_name, DeadLetter, DeadLetterFilter, DeliverySummary, ErrorEntry, NewMessage,
    StoredMessage, MAX_PAYLOAD_BYTES,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::{Admin, Authenticator, Principal, Publisher, Reader, TenantScope};
use crate::config::{Config, ConfigError, Role};
use crate::error::{ApiError, ErrorBody};
use crate::guard::{guard_requests, is_json, RequestGuard};
use crate::metrics::{prometheus, OLDEST_PENDING_AGE, PUBLISHED, QUEUE_DEPTH};
use crate::store::ApiStore;
use crate::stream_store::ApiStreams;

/// Room for the envelope around a message's payload (names, keys, up to 64
/// headers of 4 KiB) and for whitespace in the payload as sent.
pub const ENVELOPE_ALLOWANCE_BYTES: usize = 512 * 1024;
/// The most messages one batch may hold.
pub const MAX_BATCH_MESSAGES: usize = 1000;
/// The hard cap on a batch request's body.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;
/// The most ids one dead-letter operation may name.
pub const MAX_IDS: usize = 1000;
/// The most ids a dry run of a dead-letter retry or discard shows.
pub const DRY_RUN_IDS: usize = 100;
/// Page size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 50;
/// The largest page.
pub const MAX_PAGE: usize = 500;
/// The cap on a stream request's body other than an append (10,000 ids fit).
pub const STREAM_BODY_BYTES: usize = 1024 * 1024;

/// What the router serves from: the store, the token checker and the limits.
#[derive(Clone)]
pub struct ApiState {
    store: Arc<dyn ApiStore>,
    auth: Arc<Authenticator>,
    max_payload_bytes: usize,
    /// How far ahead `available_at` may be (`max_hold_days`).
    max_hold: std::time::Duration,
    metrics: PrometheusHandle,
    streams: Option<Arc<dyn ApiStreams>>,
    /// A stream backend of its own (Redis) that `/readyz` checks too.
    streams_ready: Option<(&'static str, ReadinessCheck)>,
    shutdown: tokio_util::sync::CancellationToken,
    guard: Arc<RequestGuard>,
    targets: Arc<BTreeMap<String, TargetView>>,
}

/// A check of a server the daemon depends on besides its database: `Ok`
/// when it answers.
pub type ReadinessCheck = Arc<
    dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(), courier::StoreError>>
        + Send
        + Sync,
>;

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("auth", &self.auth)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish_non_exhaustive()
    }
}

impl FromRef<ApiState> for Arc<Authenticator> {
    fn from_ref(state: &ApiState) -> Self {
        Arc::clone(&state.auth)
    }
}

impl ApiState {
    /// State over `store` with the tokens and limits of `config`.
    pub fn new<S: ApiStore>(store: S, config: &Config) -> Result<Self, ConfigError> {
        let mut state = Self::with_authenticator(
            store,
            Authenticator::new(&config.tokens)?,
            config.max_payload_bytes,
        )
        .with_guard(RequestGuard::with_origins(&config.server));
        // MAX_HOLD_DAYS days is MAX_HOLD.
        state.max_hold = std::time::Duration::from_secs(
            config.max_hold_days.clamp(1, crate::config::MAX_HOLD_DAYS) * 86_400,
        );
        state.targets = Arc::new(
            config
                .subscriptions
                .iter()
                .map(|subscription| {
                    (
                        subscription.name.clone(),
                        TargetView::of(&subscription.target),
                    )
                })
                .collect(),
        );
        Ok(state)
    }

    /// State over `store` with an explicit authenticator and payload limit
    /// (clamped to the store's 1 MiB).
    pub fn with_authenticator<S: ApiStore>(
        store: S,
        auth: Authenticator,
        max_payload_bytes: usize,
    ) -> Self {
        Self {
            store: Arc::new(store),
            auth: Arc::new(auth),
            max_payload_bytes: max_payload_bytes.clamp(1, MAX_PAYLOAD_BYTES),
            max_hold: courier::MAX_HOLD,
            metrics: prometheus(),
            streams: None,
            streams_ready: None,
            shutdown: tokio_util::sync::CancellationToken::new(),
            guard: Arc::new(RequestGuard::any_host()),
            targets: Arc::default(),
        }
    }

    /// The same state checking hosts, origins and content types with
    /// `guard` (see [`crate::guard`]); the default accepts any host.
    #[must_use]
    pub fn with_guard(mut self, guard: RequestGuard) -> Self {
        self.guard = Arc::new(guard);
        self
    }

    /// The same state serving `/v1/streams` from `streams`.
    #[must_use]
    pub fn with_streams<T: ApiStreams>(mut self, streams: T) -> Self {
        self.streams = Some(Arc::new(streams));
        self
    }

    /// This state, with `/readyz` also checking the stream backend
    /// `backend` (a server other than the database, such as Redis).
    pub fn with_streams_readiness(mut self, backend: &'static str, check: ReadinessCheck) -> Self {
        self.streams_ready = Some((backend, check));
        self
    }

    /// Cancelled when the daemon shuts down: blocking stream reads then end
    /// at once instead of holding shutdown up.
    pub fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }

    /// The stream backend; 404 on a router built without one.
    pub(crate) fn streams(&self) -> Result<&dyn ApiStreams, ApiError> {
        self.streams
            .as_deref()
            .ok_or_else(|| ApiError::not_found("this server has no stream backend", None))
    }

    /// The largest accepted payload.
    pub(crate) fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    /// Whether no tokens are configured.
    pub fn is_open(&self) -> bool {
        self.auth.is_open()
    }

    fn single_body_limit(&self) -> usize {
        2 * self.max_payload_bytes + ENVELOPE_ALLOWANCE_BYTES
    }
}

/// The router with every route, its body caps and `/v1/openapi.json`,
/// behind the state's [`RequestGuard`].
pub fn router(state: ApiState) -> Router {
    let guard = Arc::clone(&state.guard);
    let single = state.single_body_limit();
    let batch = MAX_BATCH_BODY_BYTES.max(single);
    let (router, document) = api_routes(single, batch).split_for_parts();
    let document = Arc::new(with_document_route(document));
    router
        .route(
            "/v1/openapi.json",
            axum::routing::get(move || {
                let document = Arc::clone(&document);
                async move { Json(document.as_ref().clone()) }
            }),
        )
        .fallback(|| async { ApiError::not_found("no such route", None) })
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(guard, guard_requests))
}

/// 405 for a known path asked with a method it does not serve.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{method} is not served on {}; /v1/openapi.json lists each path's methods",
        uri.path()
    ))
}

/// The OpenAPI 3 document of the API (what `/v1/openapi.json` serves).
pub fn openapi() -> utoipa::openapi::OpenApi {
    with_document_route(api_routes(0, 0).split_for_parts().1)
}

/// Adds `/v1/openapi.json` itself, which is served outside the documented routes.
fn with_document_route(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    document.paths.paths.insert(
        "/v1/openapi.json".to_owned(),
        utoipa::openapi::path::PathItem::new(
            utoipa::openapi::HttpMethod::Get,
            utoipa::openapi::path::OperationBuilder::new()
                .summary(Some("This document"))
                .operation_id(Some("openapi"))
                .tag("operations")
                .response(
                    "200",
                    utoipa::openapi::Response::new("The OpenAPI 3 document"),
                ),
        ),
    );
    with_guard_responses(&mut document);
    document
}

/// Adds to every operation the refusals [`crate::guard`] and
/// [`crate::http_server::request_timeout`] give before any handler runs: 408
/// and 431 everywhere, 421 except on the probes, 415 on state changes.
fn with_guard_responses(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = |description: &str| -> RefOr<utoipa::openapi::Response> {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build(),
        )
    };
    for (path, item) in &mut document.paths.paths {
        let probe = matches!(path.as_str(), "/healthz" | "/readyz");
        for (changes_state, operation) in [
            (false, &mut item.get),
            (true, &mut item.put),
            (true, &mut item.post),
            (true, &mut item.delete),
            (true, &mut item.patch),
        ] {
            let Some(operation) = operation.as_mut() else {
                continue;
            };
            let responses = &mut operation.responses.responses;
            let mut add = |status: &str, description: &str| {
                responses
                    .entry(status.to_owned())
                    .or_insert_with(|| error(description));
            };
            add(
                "408",
                "The request did not complete within `server.request_timeout_ms` (`request_timeout`)",
            );
            add(
                "431",
                "More than 100 header lines or 64 KiB of request head (`headers_too_large`)",
            );
            if !probe {
                add(
                    "421",
                    "The `Host` is not one this daemon answers to (`misdirected_request`)",
                );
            }
            if changes_state {
                add(
                    "415",
                    "Not declared as `application/json` (`unsupported_media_type`)",
                );
            }
        }
    }
}

fn api_routes(single_limit: usize, batch_limit: usize) -> OpenApiRouter<ApiState> {
    let limit = |bytes: usize| DefaultBodyLimit::max(bytes.max(1));
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(publish_message, list_messages))
        .layer(limit(single_limit))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(publish_batch))
                .layer(limit(batch_limit)),
        )
        .merge(crate::stream_api::routes(batch_limit, STREAM_BODY_BYTES))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(get_message))
                .routes(routes!(delivery_stats))
                .routes(routes!(list_dead_letters))
                .routes(routes!(get_dead_letter))
                .routes(routes!(retry_dead_letters))
                .routes(routes!(discard_dead_letters))
                .routes(routes!(list_subscriptions))
                .routes(routes!(get_subscription))
                .routes(routes!(pause_subscription))
                .routes(routes!(resume_subscription))
                .routes(routes!(healthz))
                .routes(routes!(readyz))
                .routes(routes!(metrics_text))
                .layer(limit(64 * 1024)),
        )
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Courier",
        description = "Durable event delivery: publish messages, inspect their delivery, manage dead letters and subscriptions; append to streams and consume them through groups. Errors are always `{\"error\": {\"code\", \"message\", \"field\"}}`."
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "messages", description = "Publish and inspect messages"),
        (name = "dead-letters", description = "Messages a subscription gave up on"),
        (name = "subscriptions", description = "Subscriptions and their pause state"),
        (name = "streams", description = "Streams and their consumer groups"),
        (name = "operations", description = "Health, readiness, statistics and metrics")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

// ---------------------------------------------------------------- extractors

/// A JSON body parsed strictly, with errors that name the field.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// The body of a request under the route's size cap, declared as JSON.
async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    // The router's guard refuses state changes without JSON already;
    // this holds for bodies read under any other router too.
    if let Some(content_type) = request.headers().get(header::CONTENT_TYPE) {
        let content_type = String::from_utf8_lossy(content_type.as_bytes());
        if !is_json(&content_type) {
            return Err(ApiError::unsupported_media_type(format!(
                "the body must be application/json, not {content_type:?}"
            )));
        }
    }
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(
                    "body",
                    "the request body is over this route's size limit (see max_payload_bytes)",
                )
            } else {
                ApiError::malformed(format!("cannot read the request body: {rejection}"))
            }
        })
}

/// A batch body, checked as it is read: the items of `messages` are kept as
/// slices of the body, and reading stops at item [`MAX_BATCH_MESSAGES`] + 1,
/// so neither a long array nor a large item is built into JSON values first.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchEnvelope<'a> {
    #[serde(borrow)]
    messages: BatchItems<'a>,
}

/// At most [`MAX_BATCH_MESSAGES`] raw items.
struct BatchItems<'a>(Vec<&'a serde_json::value::RawValue>);

/// The deserialisation error of an array past [`MAX_BATCH_MESSAGES`].
const TOO_MANY_MESSAGES: &str = "the batch holds more messages than the limit";

impl<'de: 'a, 'a> Deserialize<'de> for BatchItems<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Items<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Items<'a> {
            type Value = BatchItems<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an array of 1 to {MAX_BATCH_MESSAGES} messages")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'a serde_json::value::RawValue>()? {
                    if items.len() == MAX_BATCH_MESSAGES {
                        return Err(serde::de::Error::custom(TOO_MANY_MESSAGES));
                    }
                    items.push(item);
                }
                Ok(BatchItems(items))
            }
        }
        deserializer.deserialize_seq(Items(std::marker::PhantomData))
    }
}

/// The raw items of a batch body (see [`BatchEnvelope`]), with errors that
/// name the field: 422 `messages` past [`MAX_BATCH_MESSAGES`] items.
fn batch_items(bytes: &[u8]) -> Result<Vec<&serde_json::value::RawValue>, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
            Err(e) => Err(ApiError::malformed(format!(
                "the body is not valid JSON: {e}"
            ))),
        };
    }
    let envelope: BatchEnvelope<'_> = serde_json::from_slice(bytes).map_err(|error| {
        let message = strip_position(&error.to_string());
        match error.classify() {
            serde_json::error::Category::Data if message == TOO_MANY_MESSAGES => ApiError::invalid(
                "messages",
                format!("must hold 1 to {MAX_BATCH_MESSAGES} messages, got more"),
            ),
            serde_json::error::Category::Data => {
                let field = message
                    .strip_prefix("unknown field `")
                    .and_then(|rest| rest.split('`').next())
                    .unwrap_or("messages")
                    .to_owned();
                ApiError::invalid(field, message)
            }
            _ => ApiError::malformed(format!("the body is not valid JSON: {error}")),
        }
    })?;
    Ok(envelope.messages.0)
}

/// `error` of item `index` of a batch, its field under `messages[index]`.
fn in_batch(index: usize, error: ApiError) -> ApiError {
    let field = match error.field.as_deref() {
        None | Some("body") => format!("messages[{index}]"),
        Some(field) => format!("messages[{index}].{field}"),
    };
    ApiError {
        field: Some(field),
        ..error
    }
}

/// Parses `bytes` as `T`, naming the field of any error.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde reads a struct from an array too; requests are objects only.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
            Err(e) => Err(ApiError::malformed(format!(
                "the body is not valid JSON: {e}"
            ))),
        };
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let message = inner.to_string();
                ApiError::invalid(field_of(&path, &message), strip_position(&message))
            }
            _ => ApiError::malformed(format!("the body is not valid JSON: {inner}")),
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// The field an error concerns: the path serde reports, or for a missing
/// field, the field named in the message under that path.
fn field_of(path: &str, message: &str) -> String {
    let base = if path == "." { "" } else { path };
    if let Some(rest) = message.strip_prefix("missing field `") {
        if let Some(name) = rest.split('`').next() {
            return if base.is_empty() {
                name.to_owned()
            } else {
                format!("{base}.{name}")
            };
        }
    }
    if base.is_empty() {
        "body".to_owned()
    } else {
        base.to_owned()
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
}

/// A path parameter, percent-decoded; a parameter that is not UTF-8 once
/// decoded (`/v1/messages/%FF`) is refused 422 naming the parameter.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(PathRejection::FailedToDeserializePathParams(error)) => {
                let message = error.body_text();
                Err(match error.into_kind() {
                    ErrorKind::InvalidUtf8InPathParam { key } => {
                        ApiError::invalid(key, "is not valid UTF-8 once percent-decoded")
                    }
                    ErrorKind::ParseErrorAtKey { key, .. }
                    | ErrorKind::DeserializeError { key, .. } => ApiError::invalid(key, message),
                    _ => ApiError::invalid("path", message),
                })
            }
            Err(rejection) => Err(ApiError::internal(format!(
                "the path parameters are not available: {}",
                rejection.body_text()
            ))),
        }
    }
}

/// A query string parsed strictly, with errors that name the parameter.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|error| {
                let path = error.path().to_string();
                let message = error.into_inner().to_string();
                let field = match message
                    .strip_prefix("unknown field `")
                    .and_then(|rest| rest.split('`').next())
                {
                    Some(name) => name.to_owned(),
                    None => field_of(&path, &message),
                };
                ApiError::invalid(field, format!("bad query parameter: {message}"))
            })
    }
}

// ---------------------------------------------------------------- types

/// A message to publish.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The owner: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
    pub tenant: String,
    /// The event type, same grammar.
    pub topic: String,
    /// The payload's schema version (≥ 1, default 1).
    pub schema_version: Option<i32>,
    /// The payload: any JSON value, at most `max_payload_bytes` as compact text.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// String headers: a JSON object of strings (at most 64).
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub headers: Option<serde_json::Value>,
    /// Messages sharing (tenant, ordering key) are delivered one at a time, in order.
    pub ordering_key: Option<String>,
    /// A repeated (tenant, idempotency key) stores nothing and returns the first id.
    /// The `Idempotency-Key` header does the same.
    pub idempotency_key: Option<String>,
    /// Hold the message until this RFC 3339 time.
    #[schema(format = DateTime)]
    pub available_at: Option<String>,
}

impl PublishRequest {
    /// Validates the request into a message, exactly as `POST /v1/messages`
    /// does (the CLI's NDJSON publishing uses it too): names, payload size,
    /// headers, RFC 3339 `available_at`. The error names the field.
    pub fn into_message(self, max_payload_bytes: usize) -> Result<NewMessage, ApiError> {
        build_message(self, "", max_payload_bytes, courier::MAX_HOLD, None)
    }
}

/// A published (or already published) message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PublishResponse {
    /// The message id (the first message's, for a duplicate).
    pub id: Uuid,
    /// Present and `true` when an earlier message had the same idempotency key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// Messages to publish together, all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1000 messages.
    pub messages: Vec<PublishRequest>,
}

/// The outcome of each message of a batch, in order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchResponse {
    /// One entry per message.
    pub messages: Vec<PublishResponse>,
}

/// One entry of a delivery's error history.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorView {
    /// The attempt that failed.
    pub attempt: i32,
    /// When (database clock).
    pub at: DateTime<Utc>,
    /// What went wrong (at most 2,000 characters).
    pub message: String,
}

impl From<ErrorEntry> for ErrorView {
    fn from(entry: ErrorEntry) -> Self {
        Self {
            attempt: entry.attempt,
            at: entry.at,
            message: entry.message,
        }
    }
}

/// The state of a message for one subscription.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// The subscription.
    pub subscription: String,
    /// The open delivery's id: what dead-letter retry and discard take;
    /// `null` once completed (only its receipt is left).
    pub delivery_id: Option<i64>,
    /// `available`, `running`, `dead` or `completed`.
    pub state: String,
    /// Attempts spent.
    pub attempts: i32,
    /// The error history, oldest first.
    pub errors: Vec<ErrorView>,
}

impl From<DeliverySummary> for DeliveryView {
    fn from(summary: DeliverySummary) -> Self {
        Self {
            subscription: summary.subscription,
            delivery_id: summary.delivery_id,
            state: summary.state,
            attempts: summary.attempts,
            errors: summary.errors.into_iter().map(ErrorView::from).collect(),
        }
    }
}

/// A stored message.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageView {
    /// The id.
    pub id: Uuid,
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The schema version.
    pub schema_version: i32,
    /// The payload.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// The headers.
    pub headers: BTreeMap<String, String>,
    /// The ordering key.
    pub ordering_key: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// When the event happened (producer clock).
    pub occurred_at: DateTime<Utc>,
    /// When it first became deliverable.
    pub available_at: DateTime<Utc>,
    /// When it was enqueued (database clock).
    pub enqueued_at: DateTime<Utc>,
    /// Its state in each subscription (only on `GET /v1/messages/{id}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Vec<DeliveryView>>,
}

fn json_or_text(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

impl From<StoredMessage> for MessageView {
    fn from(message: StoredMessage) -> Self {
        Self {
            id: message.id,
            tenant: message.tenant,
            topic: message.topic,
            schema_version: message.schema_version,
            payload: json_or_text(message.payload),
            headers: message.headers,
            ordering_key: message.ordering_key,
            idempotency_key: message.idempotency_key,
            occurred_at: message.occurred_at,
            available_at: message.available_at,
            enqueued_at: message.enqueued_at,
            deliveries: None,
        }
    }
}

/// A page of messages, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessagePageView {
    /// The messages.
    pub items: Vec<MessageView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<Uuid>,
}

/// Filters of `GET /v1/messages`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MessageQuery {
    /// Only this tenant's (it must be one of the token's).
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only messages with a delivery in this state: `available`, `running`, `dead`, `completed`.
    pub state: Option<String>,
    /// Only messages owed to this subscription (with `state`: its delivery's state).
    pub subscription: Option<String>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<Uuid>,
}

/// Filters of `GET /v1/stats`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Only this tenant's (it must be one of the token's).
    pub tenant: Option<String>,
}

/// Open deliveries of one (subscription, topic).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsRow {
    /// The subscription.
    pub subscription: String,
    /// The topic.
    pub topic: String,
    /// Waiting (including backoff and delayed).
    pub available: i64,
    /// Under a lease.
    pub running: i64,
    /// Dead letters.
    pub dead: i64,
    /// Seconds since the oldest open delivery was enqueued.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Counts by state overall and per (subscription, topic).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsView {
    /// Waiting deliveries, in all.
    pub available: i64,
    /// Running deliveries, in all.
    pub running: i64,
    /// Dead letters, in all.
    pub dead: i64,
    /// The oldest open delivery's age, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Per (subscription, topic).
    pub by_subscription: Vec<StatsRow>,
}

/// Filters of `GET /v1/dead-letters`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterQuery {
    /// Only this tenant's; required for a token scoped to several tenants.
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only this subscription's.
    pub subscription: Option<String>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<i64>,
}

/// A dead-lettered delivery.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterView {
    /// The delivery id: what retry and discard take.
    pub id: i64,
    /// The message id.
    pub message_id: Uuid,
    /// The subscription that gave up.
    pub subscription: String,
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The schema version.
    pub schema_version: i32,
    /// The payload.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// Attempts spent.
    pub attempts: i32,
    /// The error history, oldest first.
    pub errors: Vec<ErrorView>,
    /// When it was dead-lettered.
    pub dead_at: Option<DateTime<Utc>>,
    /// When the message was enqueued.
    pub enqueued_at: DateTime<Utc>,
}

impl From<DeadLetter> for DeadLetterView {
    fn from(dead: DeadLetter) -> Self {
        Self {
            id: dead.delivery_id,
            message_id: dead.message_id,
            subscription: dead.subscription,
            tenant: dead.tenant,
            topic: dead.topic,
            schema_version: dead.schema_version,
            payload: json_or_text(dead.payload),
            attempts: dead.attempts,
            errors: dead.errors.into_iter().map(ErrorView::from).collect(),
            dead_at: dead.dead_at,
            enqueued_at: dead.enqueued_at,
        }
    }
}

/// A page of dead letters, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPageView {
    /// The dead letters.
    pub items: Vec<DeadLetterView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<i64>,
}

/// Which dead letters to retry or discard: `ids`, or a `filter`, not both.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSelection {
    /// Delivery ids (at most 1000); ids not visible to the token are skipped.
    pub ids: Option<Vec<i64>>,
    /// Every dead letter matching. An empty filter (`{}`, every dead letter
    /// the token may see) is refused unless `all` is `true`.
    pub filter: Option<DeadLetterFilterBody>,
    /// With an empty `filter`: yes, every dead letter the token may see.
    pub all: Option<bool>,
    /// With a `filter`: change nothing, answer how many match and the first
    /// 100 ids.
    pub dry_run: Option<bool>,
}

/// A dead-letter filter.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilterBody {
    /// Only this tenant's; required for a token scoped to several tenants.
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only this subscription's.
    pub subscription: Option<String>,
}

/// How many were affected (or, in a dry run, would be).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Affected {
    /// The count.
    pub affected: u64,
    /// Present and `true` for a dry run: nothing was changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// In a dry run, the first 100 matching delivery ids, ascending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<i64>>,
}

/// A subscription.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionView {
    /// The name.
    pub name: String,
    /// Its topic patterns.
    pub topics: Vec<String>,
    /// Whether claiming is paused.
    pub paused: bool,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// Every subscription.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionList {
    /// By name.
    pub subscriptions: Vec<SubscriptionView>,
}

/// Open deliveries by state.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Backlog {
    /// Waiting (including backoff and delayed).
    pub available: i64,
    /// Under a lease.
    pub running: i64,
    /// Dead letters.
    pub dead: i64,
}

/// Where a subscription of this daemon's config delivers: URLs with their
/// credentials and query values redacted, never a secret.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TargetView {
    /// `webhook`, `redis_stream`, `nats` or `stream`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A webhook's URL, redacted (`https://***@host/path?token=***`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The stream's name template (`redis_stream`, `stream`), or the
    /// JetStream stream (`nats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// The subject template (`nats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

impl TargetView {
    /// The view of `target`.
    pub fn of(target: &crate::config::TargetConfig) -> Self {
        use crate::config::TargetConfig;
        let mut view = Self {
            kind: target.kind().to_owned(),
            url: None,
            stream: None,
            subject: None,
        };
        match target {
            TargetConfig::Webhook(webhook) => {
                view.url = Some(crate::redact::redact_urls(&webhook.url));
            }
            TargetConfig::RedisStream(redis) => view.stream = Some(redis.stream.clone()),
            TargetConfig::Nats(nats) => {
                view.stream = Some(nats.stream.clone());
                view.subject = Some(nats.subject.clone());
            }
            TargetConfig::Stream(native) => view.stream = Some(native.stream.clone()),
        }
        view
    }
}

/// The last failed delivery this daemon saw.
#[derive(Debug, Serialize, ToSchema)]
pub struct LastErrorView {
    /// When.
    pub at: DateTime<Utc>,
    /// What happened, without URL, answer body or secret.
    pub message: String,
}

/// One subscription with its backlog, as the token's tenants see it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionDetail {
    /// The name.
    pub name: String,
    /// Its topic patterns.
    pub topics: Vec<String>,
    /// `active` or `paused`.
    pub state: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Its open deliveries of the token's tenants, by state (database, exact).
    pub backlog: Backlog,
    /// Seconds since the oldest of those waiting or running was enqueued.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Where this daemon delivers it; `null` when its config has no such
    /// subscription (a library worker's, or the built-in demo).
    pub target: Option<TargetView>,
    /// When this daemon last delivered one of its messages (every tenant's;
    /// kept in this process's memory, empty after a restart).
    pub last_success_at: Option<DateTime<Utc>>,
    /// This daemon's last failed delivery (in memory, like `last_success_at`).
    pub last_error: Option<LastErrorView>,
    /// Deliveries this daemon attempted in the last 5 minutes.
    pub deliveries_5m: u64,
    /// The share of those that failed, 0 to 1; `null` without deliveries.
    pub failure_rate_5m: Option<f64>,
}

/// A subscription's pause state after a change.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseState {
    /// The subscription.
    pub name: String,
    /// Whether it is paused now.
    pub paused: bool,
}

/// A health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`), `ready` or `not_ready` (`/readyz`).
    pub status: String,
    /// Why the daemon is not ready: only to an `admin` token (the database's
    /// error text may name hosts, users and schemas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

// ---------------------------------------------------------------- helpers

fn build_message(
    request: PublishRequest,
    prefix: &str,
    max_payload_bytes: usize,
    max_hold: std::time::Duration,
    header_key: Option<&str>,
) -> Result<NewMessage, ApiError> {
    let field = |name: &str| format!("{prefix}{name}");
    validate_name("tenant", &request.tenant).map_err(|e| ApiError::from_validation(prefix, e))?;
    validate_name("topic", &request.topic).map_err(|e| ApiError::from_validation(prefix, e))?;
    let payload = serde_json::to_string(&request.payload)
        .map_err(|e| ApiError::invalid(field("payload"), format!("cannot be encoded: {e}")))?;
    if payload.len() > max_payload_bytes {
        return Err(ApiError::too_large(
            field("payload"),
            format!(
                "is {} bytes of JSON; the limit is {max_payload_bytes}",
                payload.len()
            ),
        ));
    }
    let mut message = NewMessage::from_json_text(request.tenant, request.topic, payload)
        .map_err(|e| ApiError::from_validation(prefix, e))?;
    if let Some(version) = request.schema_version {
        message = message.with_schema_version(version);
    }
    match request.headers {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(headers)) => {
            for (name, value) in headers {
                match value {
                    serde_json::Value::String(value) => {
                        message = message.with_header(name, value);
                    }
                    other => {
                        return Err(ApiError::invalid(
                            format!("{}.{name}", field("headers")),
                            format!("header values must be strings, got {other}"),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                field("headers"),
                format!("must be a JSON object of string values, got {other}"),
            ))
        }
    }
    if let Some(key) = request.ordering_key {
        message = message.with_ordering_key(key);
    }
    let key = match (request.idempotency_key, header_key) {
        (Some(body), Some(header)) if body != header => {
            return Err(ApiError::invalid(
                field("idempotency_key"),
                "differs from the Idempotency-Key header; send one or make them equal",
            ))
        }
        (Some(body), _) => Some(body),
        (None, header) => header.map(str::to_owned),
    };
    if let Some(key) = key {
        message = message.with_idempotency_key(key);
    }
    if let Some(at) = request.available_at {
        let at = DateTime::parse_from_rfc3339(&at).map_err(|e| {
            ApiError::invalid(
                field("available_at"),
                format!("{at:?} is not an RFC 3339 time such as 2026-01-02T03:04:05Z: {e}"),
            )
        })?;
        message = message.available_at(at.with_timezone(&Utc));
    }
    message
        .validate()
        .and_then(|()| message.validate_hold(max_hold))
        .map_err(|e| ApiError::from_validation(prefix, e))?;
    Ok(message)
}

fn idempotency_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid("Idempotency-Key", "the header must be visible ASCII")),
    }
}

fn check_name(field: &'static str, value: Option<&String>) -> Result<(), ApiError> {
    if let Some(value) = value {
        validate_name(field, value)?;
    }
    Ok(())
}

fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and {MAX_PAGE}, got {limit}"),
        )),
    }
}

/// The tenants a listing covers: the requested one if the token may see it,
/// else every tenant the token sees (`None`: all).
fn listing_tenants(
    principal: &Principal,
    requested: Option<String>,
) -> Result<Option<Vec<String>>, ApiError> {
    match requested {
        Some(tenant) => {
            validate_name("tenant", &tenant)?;
            principal.require_tenant(&tenant, "tenant")?;
            Ok(Some(vec![tenant]))
        }
        None => Ok(principal.tenants.filter()),
    }
}

/// The one tenant a dead-letter operation concerns (`None`: all, for a token
/// that sees all).
fn single_tenant(
    principal: &Principal,
    requested: Option<String>,
    field: &str,
) -> Result<Option<String>, ApiError> {
    if let Some(tenant) = &requested {
        validate_name("tenant", tenant).map_err(|e| ApiError::invalid(field, e.reason))?;
        principal.require_tenant(tenant, field)?;
        return Ok(requested);
    }
    match &principal.tenants {
        TenantScope::All => Ok(None),
        TenantScope::Only(tenants) if tenants.len() == 1 => Ok(tenants.iter().next().cloned()),
        TenantScope::Only(_) => Err(ApiError::invalid(
            field,
            "required: this token sees several tenants; name one",
        )),
    }
}

// ---------------------------------------------------------------- handlers

/// Publish one message.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    request_body = PublishRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same as the body's `idempotency_key`")),
    responses(
        (status = 201, description = "Stored", body = PublishResponse),
        (status = 200, description = "A message with this idempotency key exists; nothing stored", body = PublishResponse),
        (status = 409, description = "The idempotency key names an earlier message with another topic, schema version or payload (`idempotency_key_reused`); nothing stored", body = ErrorBody),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `publish` role, or another tenant", body = ErrorBody),
        (status = 413, description = "Body or payload over the limit", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "A field is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn publish_message(
    State(state): State<ApiState>,
    Publisher(principal): Publisher,
    headers: HeaderMap,
    ApiJson(request): ApiJson<PublishRequest>,
) -> Result<Response, ApiError> {
    principal.require_tenant(&request.tenant, "tenant")?;
    let key = idempotency_header(&headers)?;
    let message = build_message(request, "", state.max_payload_bytes, state.max_hold, key)?;
    let asked = (
        message.topic.clone(),
        message.schema_version,
        message.payload.clone(),
    );
    let outcome = state
        .store
        .publish(vec![message])
        .await?
        .pop()
        .ok_or_else(|| ApiError::internal("the store returned no outcome"))?;
    if outcome.duplicate {
        // Nothing was stored; a key reused for another message is refused
        // rather than answered with the first message's id.
        if let Some((stored, _)) = state.store.get_message(outcome.id).await? {
            let (topic, schema_version, payload) = &asked;
            if stored.topic != *topic
                || stored.schema_version != *schema_version
                || !same_json(&stored.payload, payload)
            {
                return Err(ApiError::idempotency_key_reused(format!(
                    "message {} was published with this idempotency key and another topic, \
                     schema version or payload; use a new key for a new message",
                    outcome.id
                )));
            }
        }
    }
    count_published(std::slice::from_ref(&outcome));
    let status = if outcome.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(PublishResponse {
            id: outcome.id,
            duplicate: outcome.duplicate,
        }),
    )
        .into_response())
}

/// Whether two JSON texts hold the same value: objects compared as maps,
/// numbers by value (PostgreSQL's `jsonb` stores `1e2` as `100`).
fn same_json(stored: &str, asked: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(stored),
        serde_json::from_str::<serde_json::Value>(asked),
    ) {
        (Ok(a), Ok(b)) => same_value(&a, &b),
        _ => stored == asked,
    }
}

fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(name, p)| y.get(name).is_some_and(|q| same_value(p, q)))
        }
        _ => a == b,
    }
}

/// 409 `idempotency_key_reused` (field `messages[i].idempotency_key`) when an
/// item's key names an earlier message, stored or earlier in the batch, with
/// another topic, schema version or payload; checked before anything is
/// stored. A message stored under the key by a concurrent request between
/// this check and the batch's own transaction is only marked `duplicate`.
async fn refuse_reused_keys(state: &ApiState, messages: &[NewMessage]) -> Result<(), ApiError> {
    let reused = |index: usize, id: String| {
        let mut error = ApiError::idempotency_key_reused(format!(
            "message {id} was published with this idempotency key and another topic, \
             schema version or payload; use a new key for a new message; nothing was stored"
        ));
        error.field = Some(format!("messages[{index}].idempotency_key"));
        error
    };
    let differs = |a: &NewMessage, topic: &str, schema_version: i32, payload: &str| {
        a.topic != topic || a.schema_version != schema_version || !same_json(payload, &a.payload)
    };
    let mut first_of: std::collections::HashMap<(&str, &str), &NewMessage> =
        std::collections::HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        let Some(key) = message.idempotency_key.as_deref() else {
            continue;
        };
        match first_of.entry((message.tenant.as_str(), key)) {
            std::collections::hash_map::Entry::Occupied(first) => {
                let first = first.get();
                if differs(message, &first.topic, first.schema_version, &first.payload) {
                    return Err(reused(index, format!("{} of this batch", first.id)));
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(message);
            }
        }
    }
    if first_of.is_empty() {
        return Ok(());
    }
    let keys = first_of
        .keys()
        .map(|(tenant, key)| ((*tenant).to_owned(), (*key).to_owned()))
        .collect();
    let stored = state.store.messages_by_idempotency_keys(keys).await?;
    let stored: std::collections::HashMap<(&str, &str), &StoredMessage> = stored
        .iter()
        .filter_map(|m| Some(((m.tenant.as_str(), m.idempotency_key.as_deref()?), m)))
        .collect();
    for (index, message) in messages.iter().enumerate() {
        let Some(key) = message.idempotency_key.as_deref() else {
            continue;
        };
        if let Some(earlier) = stored.get(&(message.tenant.as_str(), key)) {
            if differs(
                message,
                &earlier.topic,
                earlier.schema_version,
                &earlier.payload,
            ) {
                return Err(reused(index, earlier.id.to_string()));
            }
        }
    }
    Ok(())
}

fn count_published(outcomes: &[courier::EnqueueOutcome]) {
    let duplicates = outcomes.iter().filter(|o| o.duplicate).count() as u64;
    let stored = outcomes.len() as u64 - duplicates;
    metrics::counter!(PUBLISHED, "outcome" => "stored").increment(stored);
    metrics::counter!(PUBLISHED, "outcome" => "duplicate").increment(duplicates);
}

/// Publish up to 1000 messages, all or nothing.
#[utoipa::path(
    post,
    path = "/v1/messages/batch",
    tag = "messages",
    request_body = BatchRequest,
    responses(
        (status = 201, description = "Stored (entries with `duplicate` stored nothing)", body = BatchResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `publish` role, or another tenant", body = ErrorBody),
        (status = 413, description = "Body or a payload over the limit", body = ErrorBody),
        (status = 409, description = "An item's idempotency key names an earlier message (stored, or earlier in the batch) with another topic, schema version or payload (`idempotency_key_reused`, field `messages[i].idempotency_key`); nothing stored", body = ErrorBody),
        (status = 422, description = "A field is refused (`messages[i].field`); nothing stored", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn publish_batch(
    State(state): State<ApiState>,
    Publisher(principal): Publisher,
    headers: HeaderMap,
    request: Request,
) -> Result<(StatusCode, Json<BatchResponse>), ApiError> {
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "a batch takes idempotency keys per message (`messages[i].idempotency_key`), not as a header",
        ));
    }
    let bytes = read_body(request, &state).await?;
    let items = batch_items(&bytes)?;
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            format!("must hold 1 to {MAX_BATCH_MESSAGES} messages, got none"),
        ));
    }
    // One item at a time: only its own JSON values exist at once.
    let item_limit = state.single_body_limit();
    let mut messages = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        if item.get().len() > item_limit {
            return Err(ApiError::too_large(
                format!("messages[{index}]"),
                format!(
                    "is {} bytes as sent; one message may be at most {item_limit}",
                    item.get().len()
                ),
            ));
        }
        let message: PublishRequest =
            parse_json(item.get().as_bytes()).map_err(|error| in_batch(index, error))?;
        let prefix = format!("messages[{index}].");
        principal.require_tenant(&message.tenant, &format!("{prefix}tenant"))?;
        messages.push(build_message(
            message,
            &prefix,
            state.max_payload_bytes,
            state.max_hold,
            None,
        )?);
    }
    refuse_reused_keys(&state, &messages).await?;
    let outcomes = state.store.publish(messages).await?;
    count_published(&outcomes);
    Ok((
        StatusCode::CREATED,
        Json(BatchResponse {
            messages: outcomes
                .into_iter()
                .map(|o| PublishResponse {
                    id: o.id,
                    duplicate: o.duplicate,
                })
                .collect(),
        }),
    ))
}

/// One message with its state in each subscription and their error histories.
#[utoipa::path(
    get,
    path = "/v1/messages/{id}",
    tag = "messages",
    params(("id" = Uuid, Path, description = "The message id")),
    responses(
        (status = 200, body = MessageView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "No such message, or another tenant's", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_message(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<MessageView>, ApiError> {
    let id: Uuid = id
        .parse()
        .map_err(|e| ApiError::invalid("id", format!("{id:?} is not a UUID: {e}")))?;
    let not_found = || ApiError::not_found(format!("no message {id}"), Some("id".into()));
    let (message, deliveries) = state.store.get_message(id).await?.ok_or_else(not_found)?;
    if !principal.tenants.allows(&message.tenant) {
        return Err(not_found());
    }
    let mut view = MessageView::from(message);
    view.deliveries = Some(deliveries.into_iter().map(DeliveryView::from).collect());
    Ok(Json(view))
}

/// Messages, newest first, of the token's tenants.
#[utoipa::path(
    get,
    path = "/v1/messages",
    tag = "messages",
    params(MessageQuery),
    responses(
        (status = 200, body = MessagePageView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_messages(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<MessageQuery>,
) -> Result<Json<MessagePageView>, ApiError> {
    check_name("topic", query.topic.as_ref())?;
    check_name("subscription", query.subscription.as_ref())?;
    if let Some(wanted) = &query.state {
        if !["available", "running", "dead", "completed"].contains(&wanted.as_str()) {
            return Err(ApiError::invalid(
                "state",
                format!("must be available, running, dead or completed, got {wanted:?}"),
            ));
        }
    }
    let limit = page_limit(query.limit)?;
    let filter = courier::MessageFilter {
        tenants: listing_tenants(&principal, query.tenant)?,
        topic: query.topic,
        state: query.state,
        subscription: query.subscription,
    };
    let page = state
        .store
        .list_messages(filter, query.cursor, limit)
        .await?;
    Ok(Json(MessagePageView {
        items: page.items.into_iter().map(MessageView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Open deliveries by state: overall and per (subscription, topic).
#[utoipa::path(
    get,
    path = "/v1/stats",
    tag = "operations",
    params(StatsQuery),
    responses(
        (status = 200, body = StatsView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delivery_stats(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> Result<Json<StatsView>, ApiError> {
    let tenants = listing_tenants(&principal, query.tenant)?;
    let rows = state.store.delivery_stats(tenants).await?;
    let mut view = StatsView {
        available: 0,
        running: 0,
        dead: 0,
        oldest_pending_age_seconds: None,
        by_subscription: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        view.available += row.available;
        view.running += row.running;
        view.dead += row.dead;
        view.oldest_pending_age_seconds = match (
            view.oldest_pending_age_seconds,
            row.oldest_pending_age_seconds,
        ) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        view.by_subscription.push(StatsRow {
            subscription: row.subscription,
            topic: row.topic,
            available: row.available,
            running: row.running,
            dead: row.dead,
            oldest_pending_age_seconds: row.oldest_pending_age_seconds,
        });
    }
    Ok(Json(view))
}

/// Dead letters of the token's tenants, oldest first.
#[utoipa::path(
    get,
    path = "/v1/dead-letters",
    tag = "dead-letters",
    params(DeadLetterQuery),
    responses(
        (status = 200, body = DeadLetterPageView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_dead_letters(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<DeadLetterQuery>,
) -> Result<Json<DeadLetterPageView>, ApiError> {
    check_name("topic", query.topic.as_ref())?;
    check_name("subscription", query.subscription.as_ref())?;
    let limit = page_limit(query.limit)?;
    let filter = DeadLetterFilter {
        tenant: single_tenant(&principal, query.tenant, "tenant")?,
        topic: query.topic,
        subscription: query.subscription,
    };
    let page = state
        .store
        .list_dead_letters(filter, query.cursor, limit)
        .await?;
    Ok(Json(DeadLetterPageView {
        items: page.items.into_iter().map(DeadLetterView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// One dead letter: its message, subscription and error history.
#[utoipa::path(
    get,
    path = "/v1/dead-letters/{id}",
    tag = "dead-letters",
    params(("id" = i64, Path, description = "The dead delivery's id (`id` in the listing)")),
    responses(
        (status = 200, body = DeadLetterView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "No such dead letter, or another tenant's", body = ErrorBody),
        (status = 422, description = "The id is not an integer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_dead_letter(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeadLetterView>, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|e| ApiError::invalid("id", format!("{id:?} is not a delivery id: {e}")))?;
    let not_found = || ApiError::not_found(format!("no dead letter {id}"), Some("id".into()));
    let dead = state
        .store
        .get_dead_letter(id)
        .await?
        .ok_or_else(not_found)?;
    if !principal.tenants.allows(&dead.tenant) {
        return Err(not_found());
    }
    Ok(Json(DeadLetterView::from(dead)))
}

enum Selection {
    /// Delivery ids; with `tenants`, only those tenants' dead letters.
    Ids {
        ids: Vec<i64>,
        tenants: Option<Vec<String>>,
    },
    Filter(DeadLetterFilter),
    /// A filter to count and show, changing nothing.
    DryRun(DeadLetterFilter),
}

/// How many dead letters `filter` matches and the first [`DRY_RUN_IDS`].
async fn dry_run(state: &ApiState, filter: DeadLetterFilter) -> Result<Affected, ApiError> {
    let stats = state
        .store
        .delivery_stats(filter.tenant.clone().map(|tenant| vec![tenant]))
        .await?;
    let matching: i64 = stats
        .iter()
        .filter(|row| {
            filter
                .topic
                .as_ref()
                .is_none_or(|topic| *topic == row.topic)
        })
        .filter(|row| {
            filter
                .subscription
                .as_ref()
                .is_none_or(|subscription| *subscription == row.subscription)
        })
        .map(|row| row.dead)
        .sum();
    let page = state
        .store
        .list_dead_letters(filter, None, DRY_RUN_IDS)
        .await?;
    Ok(Affected {
        affected: u64::try_from(matching).unwrap_or(0),
        dry_run: true,
        ids: Some(page.items.iter().map(|dead| dead.delivery_id).collect()),
    })
}

fn resolve_selection(
    principal: &Principal,
    selection: DeadLetterSelection,
) -> Result<Selection, ApiError> {
    let all = selection.all.unwrap_or(false);
    let dry_run = selection.dry_run.unwrap_or(false);
    match (selection.ids, selection.filter) {
        (Some(_), None) if selection.all.is_some() => Err(ApiError::invalid(
            "all",
            "goes with an empty `filter`, not with `ids`",
        )),
        (Some(_), None) if dry_run => Err(ApiError::invalid(
            "dry_run",
            "previews a `filter`; `ids` already name what would change",
        )),
        (Some(ids), None) => {
            if ids.is_empty() || ids.len() > MAX_IDS {
                return Err(ApiError::invalid(
                    "ids",
                    format!("must hold 1 to {MAX_IDS} ids, got {}", ids.len()),
                ));
            }
            // A scoped token acts only on its tenants' dead letters: the one
            // statement skips others' as if they did not exist.
            Ok(Selection::Ids {
                ids,
                tenants: principal.tenants.filter(),
            })
        }
        (None, Some(filter)) => {
            check_name("topic", filter.topic.as_ref()).map_err(|e| ApiError {
                field: Some("filter.topic".into()),
                ..e
            })?;
            check_name("subscription", filter.subscription.as_ref()).map_err(|e| ApiError {
                field: Some("filter.subscription".into()),
                ..e
            })?;
            let empty =
                filter.tenant.is_none() && filter.topic.is_none() && filter.subscription.is_none();
            let filter = DeadLetterFilter {
                tenant: single_tenant(principal, filter.tenant, "filter.tenant")?,
                topic: filter.topic,
                subscription: filter.subscription,
            };
            if empty && !all {
                return Err(ApiError::invalid(
                    "filter",
                    "an empty filter matches every dead letter this token may see; name a \
                     tenant, topic or subscription, or send \"all\": true to mean every one",
                ));
            }
            if !empty && selection.all.is_some() {
                return Err(ApiError::invalid(
                    "all",
                    "goes with an empty `filter` only; this filter names what it matches",
                ));
            }
            Ok(if dry_run {
                Selection::DryRun(filter)
            } else {
                Selection::Filter(filter)
            })
        }
        _ => Err(ApiError::invalid(
            "ids",
            "send exactly one of `ids` and `filter`",
        )),
    }
}

/// Make dead letters deliverable again, with attempts reset.
///
/// By `ids`, or by `filter`; an empty filter needs `"all": true`. With
/// `"dry_run": true` a filter changes nothing and the answer is how many
/// match and the first 100 ids.
#[utoipa::path(
    post,
    path = "/v1/dead-letters/retry",
    tag = "dead-letters",
    request_body = DeadLetterSelection,
    responses(
        (status = 200, description = "Retried (in a dry run: would be, with the first ids)", body = Affected),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A field is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn retry_dead_letters(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    ApiJson(selection): ApiJson<DeadLetterSelection>,
) -> Result<Json<Affected>, ApiError> {
    let affected = match resolve_selection(&principal, selection)? {
        Selection::Ids { ids, tenants: None } => state.store.retry_dead_letters(ids).await?,
        Selection::Ids {
            ids,
            tenants: Some(tenants),
        } => state.store.retry_tenants_dead_letters(ids, tenants).await?,
        Selection::Filter(filter) => state.store.retry_dead_letters_matching(filter).await?,
        Selection::DryRun(filter) => return Ok(Json(dry_run(&state, filter).await?)),
    };
    Ok(Json(Affected {
        affected,
        dry_run: false,
        ids: None,
    }))
}

/// Discard dead letters for good.
///
/// By `ids`, or by `filter`; an empty filter needs `"all": true`. With
/// `"dry_run": true` a filter changes nothing and the answer is how many
/// match and the first 100 ids.
#[utoipa::path(
    post,
    path = "/v1/dead-letters/discard",
    tag = "dead-letters",
    request_body = DeadLetterSelection,
    responses(
        (status = 200, description = "Discarded (in a dry run: would be, with the first ids)", body = Affected),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A field is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn discard_dead_letters(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    ApiJson(selection): ApiJson<DeadLetterSelection>,
) -> Result<Json<Affected>, ApiError> {
    let affected = match resolve_selection(&principal, selection)? {
        Selection::Ids { ids, tenants: None } => state.store.discard_dead_letters(ids).await?,
        Selection::Ids {
            ids,
            tenants: Some(tenants),
        } => {
            state
                .store
                .discard_tenants_dead_letters(ids, tenants)
                .await?
        }
        Selection::Filter(filter) => state.store.discard_dead_letters_matching(filter).await?,
        Selection::DryRun(filter) => return Ok(Json(dry_run(&state, filter).await?)),
    };
    Ok(Json(Affected {
        affected,
        dry_run: false,
        ids: None,
    }))
}

/// Every subscription with its topics and pause state.
#[utoipa::path(
    get,
    path = "/v1/subscriptions",
    tag = "subscriptions",
    responses(
        (status = 200, body = SubscriptionList),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_subscriptions(
    State(state): State<ApiState>,
    Reader(_principal): Reader,
) -> Result<Json<SubscriptionList>, ApiError> {
    let subscriptions = state.store.list_subscriptions().await?;
    Ok(Json(SubscriptionList {
        subscriptions: subscriptions
            .into_iter()
            .map(|s| SubscriptionView {
                name: s.name,
                topics: s.topics,
                paused: s.paused,
                created_at: s.created_at,
            })
            .collect(),
    }))
}

/// One subscription: its topics, state and backlog of the token's tenants
/// (from the database), its target in this daemon's config (URLs redacted),
/// and this daemon's recent outcomes delivering it (kept in its memory, so
/// per process and empty after a restart).
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{name}",
    tag = "subscriptions",
    params(("name" = String, Path, description = "The subscription")),
    responses(
        (status = 200, body = SubscriptionDetail),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "No such subscription", body = ErrorBody),
        (status = 422, description = "The name is not a subscription name", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_subscription(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<SubscriptionDetail>, ApiError> {
    validate_name("name", &name)?;
    let subscription = state
        .store
        .list_subscriptions()
        .await?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            ApiError::not_found(format!("no subscription {name:?}"), Some("name".into()))
        })?;
    let rows = state
        .store
        .delivery_stats(principal.tenants.filter())
        .await?;
    let mut backlog = Backlog::default();
    let mut oldest: Option<f64> = None;
    for row in rows.into_iter().filter(|row| row.subscription == name) {
        backlog.available += row.available;
        backlog.running += row.running;
        backlog.dead += row.dead;
        oldest = match (oldest, row.oldest_pending_age_seconds) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let recent = crate::outcomes::global().recent(&name);
    let (deliveries, failures) = recent.as_ref().map_or((0, 0), |r| (r.attempts, r.failures));
    Ok(Json(SubscriptionDetail {
        target: state.targets.get(&name).cloned(),
        last_success_at: recent.as_ref().and_then(|r| r.last_success_at),
        last_error: recent
            .and_then(|r| r.last_error)
            .map(|(at, message)| LastErrorView { at, message }),
        deliveries_5m: deliveries,
        failure_rate_5m: (deliveries > 0).then(|| failures as f64 / deliveries as f64),
        name: subscription.name,
        topics: subscription.topics,
        state: if subscription.paused {
            "paused"
        } else {
            "active"
        }
        .to_owned(),
        created_at: subscription.created_at,
        backlog,
        oldest_pending_age_seconds: oldest,
    }))
}

async fn set_paused(
    state: &ApiState,
    principal: &Principal,
    name: String,
    paused: bool,
) -> Result<Json<PauseState>, ApiError> {
    if principal.tenants != TenantScope::All {
        return Err(ApiError::forbidden(
            "pausing or resuming a subscription affects every tenant; it needs a token scoped to \"*\"",
            None,
        ));
    }
    validate_name("name", &name)?;
    if !state
        .store
        .set_subscription_paused(name.clone(), paused)
        .await?
    {
        return Err(ApiError::not_found(
            format!("no subscription {name:?}"),
            Some("name".into()),
        ));
    }
    Ok(Json(PauseState { name, paused }))
}

/// Stop claiming for a subscription: its messages wait, nothing is lost.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{name}/pause",
    tag = "subscriptions",
    params(("name" = String, Path, description = "The subscription")),
    responses(
        (status = 200, body = PauseState),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role for every tenant", body = ErrorBody),
        (status = 404, description = "No such subscription", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn pause_subscription(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<PauseState>, ApiError> {
    set_paused(&state, &principal, name, true).await
}

/// Resume claiming for a subscription.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{name}/resume",
    tag = "subscriptions",
    params(("name" = String, Path, description = "The subscription")),
    responses(
        (status = 200, body = PauseState),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role for every tenant", body = ErrorBody),
        (status = 404, description = "No such subscription", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn resume_subscription(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<PauseState>, ApiError> {
    set_paused(&state, &principal, name, false).await
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        detail: None,
    })
}

/// The database answers and its schema is the one this build expects (and,
/// with `[streams] backend = "redis"`, Redis answers a `PING`).
///
/// Public, and the public answer is only the status: 200 `{"status":
/// "ready"}` or 503 `{"status": "not_ready"}`. An `admin` token (or an open
/// API) also gets `detail`, why it is not ready; the log always has it.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, body = Health),
        (status = 503, description = "Database unreachable, schema not current, or a Redis stream backend unreachable (`detail` only for an `admin` token)", body = Health),
    )
)]
async fn readyz(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let mut problem = match state.store.ready().await {
        Ok(true) => None,
        Ok(false) => {
            Some("the database schema is not the one this build expects; run migrations".to_owned())
        }
        Err(error) => {
            let detail =
                crate::redact::redact_urls(&format!("the database is unreachable: {error}"));
            tracing::warn!(%detail, "readiness check failed");
            Some(detail)
        }
    };
    if let (None, Some((backend, check))) = (&problem, &state.streams_ready) {
        if let Err(error) = check().await {
            let detail = crate::redact::redact_urls(&format!(
                "the stream backend ({backend}) is unreachable: {error}"
            ));
            tracing::warn!(%detail, "readiness check failed");
            problem = Some(detail);
        }
    }
    let Some(problem) = problem else {
        return Json(Health {
            status: "ready".into(),
            detail: None,
        })
        .into_response();
    };
    // A bad or missing token is not refused here: it gets the public answer.
    let admin = state
        .auth
        .authenticate(&headers)
        .is_ok_and(|principal| principal.has(Role::Admin));
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, crate::error::RETRY_AFTER_SECONDS)],
        Json(Health {
            status: "not_ready".into(),
            detail: admin.then_some(problem),
        }),
    )
        .into_response()
}

/// Prometheus metrics (text format 0.0.4): every subscription's counts over
/// every tenant, so only for `admin` tokens (or on `server.metrics_listen`).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn metrics_text(State(state): State<ApiState>, Admin(_principal): Admin) -> Response {
    render_metrics(&state).await
}

/// A router serving only `GET /metrics`, without tokens: for
/// `server.metrics_listen`, an address of its own that only the scraper
/// reaches (loopback, or a network the operator controls).
pub fn metrics_router(state: ApiState) -> Router {
    let guard = Arc::clone(&state.guard);
    Router::new()
        .route(
            "/metrics",
            axum::routing::get(|State(state): State<ApiState>| async move {
                render_metrics(&state).await
            }),
        )
        .fallback(|| async { ApiError::not_found("only /metrics is served here", None) })
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(guard, guard_requests))
}

/// The metrics text, with the queue depths of every subscription set first.
async fn render_metrics(state: &ApiState) -> Response {
    match state.store.delivery_stats(None).await {
        Ok(rows) => {
            let mut by_subscription: BTreeMap<String, (i64, i64, i64, Option<f64>)> =
                BTreeMap::new();
            for row in rows {
                let entry = by_subscription.entry(row.subscription).or_default();
                entry.0 += row.available;
                entry.1 += row.running;
                entry.2 += row.dead;
                entry.3 = match (entry.3, row.oldest_pending_age_seconds) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
            for (subscription, (available, running, dead, oldest)) in by_subscription {
                for (label, count) in [
                    ("available", available),
                    ("running", running),
                    ("dead", dead),
                ] {
                    metrics::gauge!(QUEUE_DEPTH, "subscription" => subscription.clone(), "state" => label)
                        .set(count as f64);
                }
                metrics::gauge!(OLDEST_PENDING_AGE, "subscription" => subscription)
                    .set(oldest.unwrap_or(0.0));
            }
        }
        Err(error) => tracing::warn!(%error, "queue depth unavailable for /metrics"),
    }
    state.metrics.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_errors_name_the_field() {
        let err = parse_json::<PublishRequest>(br#"{"tenant": 5, "topic": "t", "payload": 1}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("tenant"), "{err:?}");
        let err = parse_json::<PublishRequest>(br#"{"topic": "t", "payload": 1}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("tenant"), "{err:?}");
        let err =
            parse_json::<PublishRequest>(br#"{"tenant": "a", "topic": "t", "payload": 1, "x": 1}"#)
                .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("x"), "{err:?}");
        let err = parse_json::<BatchRequest>(
            br#"{"messages": [{"tenant": "a", "topic": "t", "payload": 1, "schema_version": "1"}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.field.as_deref(),
            Some("messages[0].schema_version"),
            "{err:?}"
        );
        let err = parse_json::<PublishRequest>(b"{").unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let err = parse_json::<PublishRequest>(br#"{"tenant": "a", "topic": "t", "payload": 1} x"#)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }
}
