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

//!
//! The routes are split by resource, as their paths are: `messages.rs`
//! (`/v1/messages`), `dead_letters.rs` (`/v1/dead-letters`),
//! `subscriptions.rs` (`/v1/subscriptions`), `session.rs` (the dashboard's
//! sign-in, `/v1/session`) and `health.rs` (the probes, `/v1/stats`,
//! `/v1/throughput` and `/metrics`, tagged `operations`); `extract.rs` holds the
//! strict extractors they share. This module holds the state, the router and
//! the document, and the helpers several resources use.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use courier::{validate_name, ErrorEntry, MAX_PAYLOAD_BYTES};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;

use crate::auth::{Authenticator, Principal, TenantScope};
use crate::config::{Config, ConfigError};
use crate::error::{ApiError, ErrorBody};
use crate::guard::{guard_requests, RequestGuard};
use crate::metrics::prometheus;
use crate::store::ApiStore;
use crate::stream_store::ApiStreams;

mod dead_letters;
mod extract;
mod health;
mod messages;
mod session;
mod subscriptions;

pub use dead_letters::{
    Affected, DeadLetterFilterBody, DeadLetterGroupView, DeadLetterGroupsQuery,
    DeadLetterGroupsView, DeadLetterPageView, DeadLetterQuery, DeadLetterSelection, DeadLetterView,
};
pub use extract::{ApiJson, ApiPath, ApiQuery};
pub use health::{
    metrics_router, Health, StatsQuery, StatsRow, StatsView, ThroughputQuery, ThroughputView,
};
pub use messages::{
    BatchRequest, BatchResponse, CancelView, DeliveryView, MessagePageView, MessageQuery,
    MessageView, PublishRequest, PublishResponse,
};
pub use session::{SessionView, SignIn};
pub use subscriptions::{
    Backlog, LastErrorView, PauseState, RetryPolicyView, SubscriptionDetail, SubscriptionList,
    SubscriptionQuery, SubscriptionView, TargetView,
};

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
    /// The configured subscriptions' retry policies.
    retry_policies: Arc<BTreeMap<String, RetryPolicyView>>,
    /// The configured webhook subscriptions' endpoints, for test pings.
    webhooks: Arc<BTreeMap<String, crate::webhook::WebhookHandler>>,
    /// The longest a blocking stream read waits ([`max_block_within`] the
    /// request timeout), so a legal `block_ms` is answered, not cut off.
    max_block: std::time::Duration,
}

/// The longest a blocking stream read may wait under a request timeout of
/// `timeout`: a second less (a quarter less below 4 s, so a short timeout
/// still leaves a blocking read), at least a millisecond, at most
/// [`courier::MAX_STREAM_BLOCK`].
pub fn max_block_within(timeout: std::time::Duration) -> std::time::Duration {
    let margin = (timeout / 4).min(std::time::Duration::from_secs(1));
    timeout
        .saturating_sub(margin)
        .max(std::time::Duration::from_millis(1))
        .min(courier::MAX_STREAM_BLOCK)
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
            Authenticator::new(&config.tokens)?.with_limits(config.server.limit_settings()),
            config.max_payload_bytes,
        )
        .with_guard(RequestGuard::with_origins(&config.server));
        // MAX_HOLD_DAYS days is MAX_HOLD.
        state.max_hold = std::time::Duration::from_secs(
            config.max_hold_days.clamp(1, crate::config::MAX_HOLD_DAYS) * 86_400,
        );
        state.max_block = max_block_within(config.server.request_timeout());
        // A webhook the daemon cannot build stops it at start, before it serves.
        state.webhooks = Arc::new(
            config
                .subscriptions
                .iter()
                .filter(|subscription| {
                    matches!(subscription.target, crate::config::TargetConfig::Webhook(_))
                })
                .filter_map(|subscription| {
                    let handler = crate::webhook::WebhookHandler::from_config(subscription).ok()?;
                    Some((subscription.name.clone(), handler))
                })
                .collect(),
        );
        state.retry_policies = Arc::new(
            config
                .subscriptions
                .iter()
                .map(|subscription| {
                    (
                        subscription.name.clone(),
                        RetryPolicyView::from(&subscription.retry),
                    )
                })
                .collect(),
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
            retry_policies: Arc::default(),
            webhooks: Arc::default(),
            max_block: courier::MAX_STREAM_BLOCK,
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

    /// The longest a blocking stream read waits here: `block_ms` up to
    /// 30,000 is accepted, and a read asking for more than this waits this
    /// long ([`max_block_within`] `server.request_timeout_ms`) and answers
    /// what it has, rather than be cut off by the request timeout.
    pub fn max_block(&self) -> std::time::Duration {
        self.max_block
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
        .merge(crate::dashboard::routes())
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

pub(crate) use courier_api::any_json_value;
pub(crate) use messages::{request_trace_context, TRACEPARENT_DOC};

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
    // After the routes are merged: as one of ApiDoc's modifiers it ran on a
    // document without paths, and no operation listed its 429.
    utoipa::Modify::modify(&RateLimited, &mut document);
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

/// The cap on the body of every route without a cap of its own.
const SMALL_BODY_BYTES: usize = 64 * 1024;

/// A body cap of `bytes` (at least 1).
fn body_limit(bytes: usize) -> DefaultBodyLimit {
    DefaultBodyLimit::max(bytes.max(1))
}

fn api_routes(single_limit: usize, batch_limit: usize) -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(messages::routes(single_limit, batch_limit))
        .merge(crate::stream_api::routes(batch_limit, STREAM_BODY_BYTES))
        .merge(dead_letters::routes())
        .merge(subscriptions::routes())
        .merge(session::routes())
        .merge(health::routes())
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

/// Every route that takes a token may answer 429 (see [`crate::limits`]).
struct RateLimited;

impl utoipa::Modify for RateLimited {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::content::ContentBuilder;
        use utoipa::openapi::header::HeaderBuilder;
        use utoipa::openapi::schema::{Object, Type};
        use utoipa::openapi::{Ref, RefOr, ResponseBuilder};
        let limited = ResponseBuilder::new()
            .description(
                "Over a request limit (`too_many_requests`): the tenant's request rate, or this \
                 address's failed authentications; `Retry-After` says when to try again",
            )
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(Object::with_type(Type::Integer))
                    .description(Some("Seconds to wait"))
                    .build(),
            )
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                if operation.responses.responses.contains_key("401") {
                    operation
                        .responses
                        .responses
                        .insert("429".into(), RefOr::T(limited.clone()));
                }
            }
        }
    }
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

/// A stored payload as it goes out: its JSON text unchanged (a text that
/// is not JSON, which no backend stores, goes out as a JSON string).
fn stored_json(text: String) -> Box<serde_json::value::RawValue> {
    use serde_json::value::RawValue;
    if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err() {
        return serde_json::value::to_raw_value(&text)
            .unwrap_or_else(|_| RawValue::NULL.to_owned());
    }
    RawValue::from_string(text).unwrap_or_else(|_| RawValue::NULL.to_owned())
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

/// The tenants a listing covers: the requested one if the token may see it
/// (403 naming `tenant` if not, 422 if it is no name), else every tenant the
/// token sees (`None`: all). Every listing of the API uses it, the streams'
/// too.
pub(crate) fn listing_tenants(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::max_block_within;

    #[test]
    fn a_blocking_read_ends_before_the_request_timeout_and_still_blocks() {
        let ms = Duration::from_millis;
        assert_eq!(max_block_within(ms(60_000)), ms(30_000));
        assert_eq!(max_block_within(ms(20_000)), ms(19_000));
        assert_eq!(max_block_within(ms(3_000)), ms(2_250));
        // A short timeout still leaves a blocking read, never a spinning one.
        assert_eq!(max_block_within(ms(1_000)), ms(750));
        assert_eq!(max_block_within(ms(1)), ms(1));
    }
}
