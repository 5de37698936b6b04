//! Subscriptions, under `/v1/subscriptions`: every subscription with its
//! pause state, one with its backlog, target and this daemon's recent
//! outcomes, and pause/resume.
//!
//! The backlog is exact and comes from the database, counted over the
//! token's tenants; the target comes from this daemon's config with URLs
//! redacted; the recent outcomes are kept in this process's memory, so they
//! are per daemon and empty after a restart. Pausing stops claiming for
//! every tenant, so it needs an `admin` token scoped to `*`; a paused
//! subscription's messages wait and nothing is lost.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use courier::validate_name;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiPath, ApiQuery};
use super::{body_limit, page_limit, ApiState, SMALL_BODY_BYTES};
use crate::auth::{Admin, Principal, Reader, TenantScope};
use crate::cursor::{self, SubscriptionKey};
use crate::error::{ApiError, ErrorBody};

/// The routes under `/v1/subscriptions`.
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_subscriptions))
        .routes(routes!(get_subscription))
        .routes(routes!(pause_subscription))
        .routes(routes!(ping_subscription))
        .routes(routes!(resume_subscription))
        .layer(body_limit(SMALL_BODY_BYTES))
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
    /// Where this daemon delivers it; `null` when its config has no such
    /// subscription (a library worker's, or the built-in demo).
    pub target: Option<TargetView>,
}

/// A page of subscriptions, by name in byte order.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubscriptionList {
    /// The subscriptions.
    pub items: Vec<SubscriptionView>,
    /// Pass as `cursor` for the next page (opaque); `null` on the last.
    pub next_cursor: Option<String>,
}

/// Paging of `GET /v1/subscriptions`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SubscriptionQuery {
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, unchanged (opaque).
    pub cursor: Option<String>,
}

/// Open deliveries by state.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Backlog {
    /// Waiting (including backoff and delayed).
    pub available: i64,
    /// Of the waiting ones, those that failed before and wait to be retried.
    pub retrying: i64,
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

/// A configured subscription's retry policy: capped exponential backoff
/// with jitter, then a dead letter.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetryPolicyView {
    /// Attempts before a delivery is dead-lettered.
    pub max_attempts: i32,
    /// The first retry's delay, in milliseconds.
    pub base_ms: u64,
    /// The longest delay, in milliseconds.
    pub cap_ms: u64,
}

impl From<&crate::config::RetryConfig> for RetryPolicyView {
    fn from(retry: &crate::config::RetryConfig) -> Self {
        Self {
            max_attempts: retry.max_attempts,
            base_ms: retry.base_ms,
            cap_ms: retry.cap_ms,
        }
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
    /// How this daemon retries its deliveries; `null` when its config has no
    /// such subscription.
    pub retry_policy: Option<RetryPolicyView>,
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

/// Subscriptions with their topics and pause state, by name, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/subscriptions",
    tag = "subscriptions",
    params(SubscriptionQuery),
    responses(
        (status = 200, body = SubscriptionList),
        (status = 400, description = "The cursor is not one of this list's", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_subscriptions(
    State(state): State<ApiState>,
    Reader(_principal): Reader,
    ApiQuery(query): ApiQuery<SubscriptionQuery>,
) -> Result<Json<SubscriptionList>, ApiError> {
    let limit = page_limit(query.limit)?;
    let after = cursor::decode_optional::<SubscriptionKey>(query.cursor.as_deref())?;
    let page = state
        .store
        .list_subscriptions(after.map(|key| key.0), limit)
        .await?;
    Ok(Json(SubscriptionList {
        next_cursor: page
            .next_cursor
            .map(|name| cursor::encode(&SubscriptionKey(name))),
        items: page
            .items
            .into_iter()
            .map(|s| SubscriptionView {
                target: state.targets.get(&s.name).cloned(),
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
        .get_subscription(name.clone())
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("no subscription {name:?}"), Some("name".into()))
        })?;
    let totals = state
        .store
        .delivery_totals(principal.tenants.filter(), Some(name.clone()))
        .await?;
    let backlog = Backlog {
        available: totals.available,
        retrying: totals.retrying,
        running: totals.running,
        dead: totals.dead,
    };
    let oldest = totals.oldest_pending_age_seconds;
    let recent = crate::outcomes::global().recent(&name);
    let (deliveries, failures) = recent.as_ref().map_or((0, 0), |r| (r.attempts, r.failures));
    Ok(Json(SubscriptionDetail {
        target: state.targets.get(&name).cloned(),
        retry_policy: state.retry_policies.get(&name).cloned(),
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
        (status = 422, description = "Not a valid subscription name", body = ErrorBody),
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
        (status = 422, description = "Not a valid subscription name", body = ErrorBody),
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

/// Send a signed test request to a webhook subscription's endpoint, as its
/// deliveries are sent but carrying no message: the body is `{"type":
/// "courier.ping", "timestamp", "data": {"subscription"}}`, `webhook-id` is
/// `{subscription}:ping-{uuid}` and `courier-topic` is `courier.ping`.
/// Nothing is stored and no delivery, attempt or throttle changes; the
/// answer says what the endpoint made of it (a 200 here whatever the
/// endpoint answered; `delivered` is whether it answered 2xx).
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{name}/ping",
    tag = "subscriptions",
    params(("name" = String, Path, description = "The subscription")),
    responses(
        (status = 200, body = crate::webhook::PingOutcome),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role for every tenant", body = ErrorBody),
        (status = 404, description = "No such subscription in this daemon's config", body = ErrorBody),
        (status = 409, description = "`not_a_webhook`: the subscription's target is not a webhook", body = ErrorBody),
        (status = 422, description = "Not a valid subscription name", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn ping_subscription(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<crate::webhook::PingOutcome>, ApiError> {
    if principal.tenants != TenantScope::All {
        return Err(ApiError::forbidden(
            "a subscription's endpoint serves every tenant; pinging it needs a token scoped to \"*\"",
            None,
        ));
    }
    validate_name("name", &name)?;
    let Some(webhook) = state.webhooks.get(&name) else {
        return Err(match state.targets.get(&name) {
            Some(target) => ApiError::not_a_webhook(format!(
                "subscription {name:?} delivers to a {} target, not a webhook",
                target.kind
            )),
            None => ApiError::not_found(
                format!("no subscription {name:?} in this daemon's config"),
                Some("name".into()),
            ),
        });
    };
    let outcome = webhook.ping().await;
    tracing::info!(
        subscription = %name,
        delivered = outcome.delivered,
        status = outcome.status,
        "webhook test ping sent"
    );
    Ok(Json(outcome))
}
