//! Operations: the probes `/healthz` (the process is up) and `/readyz` (the
//! database answers with the schema this build expects, and a Redis stream
//! backend answers), delivery statistics (`/v1/stats`), this daemon's
//! deliveries per second (`/v1/throughput`, see [`crate::throughput`]) and
//! Prometheus metrics (`/metrics`, or a listener of its own,
//! [`metrics_router`]).
//!
//! The probes are public, and the public answer of `/readyz` is only ready
//! or not ready (503 with `Retry-After`): why is told only to an `admin`
//! token (or an open API), since a database error may name hosts, users and
//! schemas; an unreachable backend is logged as well. `/metrics` counts every tenant's deliveries, so it needs
//! `admin`; when the database does not answer it still serves the counters,
//! without fresh queue depths.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::ApiQuery;
use super::{
    body_limit, listing_tenants, method_not_allowed, page_limit, ApiState, SMALL_BODY_BYTES,
};
use crate::auth::{Admin, Reader};
use crate::config::Role;
use crate::cursor;
use crate::error::{ApiError, ErrorBody};
use crate::guard::guard_requests;
use crate::metrics::{
    DATABASE_DEAD_TUPLES, DATABASE_OLDEST_TRANSACTION, OLDEST_PENDING_AGE, QUEUE_DEPTH,
};

/// The routes tagged `operations` (`/v1/openapi.json` is added by the router).
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(delivery_stats))
        .routes(routes!(throughput))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .layer(body_limit(SMALL_BODY_BYTES))
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
    /// How the database is doing (`/readyz`, to an `admin` token, when the
    /// database answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseHealthView>,
}

/// The database's own health, as operators watch it.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatabaseHealthView {
    /// Seconds the oldest transaction open in the database (other than the
    /// daemon's question) has run; `null` when none is, on SQLite, or when
    /// the daemon's role may not see other sessions (PostgreSQL shows them
    /// to superusers and `pg_read_all_stats`). A long one holds back vacuum.
    pub oldest_transaction_seconds: Option<f64>,
    /// Dead row versions per table of Courier's schema (PostgreSQL; empty
    /// on SQLite).
    pub dead_tuples: BTreeMap<String, i64>,
}

impl From<courier::DatabaseHealth> for DatabaseHealthView {
    fn from(health: courier::DatabaseHealth) -> Self {
        Self {
            oldest_transaction_seconds: health.oldest_transaction_seconds,
            dead_tuples: health.dead_tuples,
        }
    }
}

/// Filters of `GET /v1/stats`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Only this tenant's (it must be one of the token's).
    pub tenant: Option<String>,
    /// Rows per page, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, unchanged (opaque).
    pub cursor: Option<String>,
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
    /// Of the waiting ones, those that failed before and wait to be retried.
    pub retrying: i64,
    /// Under a lease.
    pub running: i64,
    /// Dead letters.
    pub dead: i64,
    /// Seconds since the oldest open delivery was enqueued.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Deliveries this daemon completed in the last hour (its own handlers'
    /// only: see `/v1/throughput`). A pair with nothing open but completions
    /// in the last hour has a row too.
    pub completed_last_hour: u64,
}

/// Counts by state overall (every row the token may see, whatever the
/// page) and a page of them per (subscription, topic).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsView {
    /// Waiting deliveries, in all.
    pub available: i64,
    /// Waiting deliveries that failed before, in all.
    pub retrying: i64,
    /// Running deliveries, in all.
    pub running: i64,
    /// Dead letters, in all.
    pub dead: i64,
    /// The oldest open delivery's age, in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Deliveries this daemon completed in the last hour, in all.
    pub completed_last_hour: u64,
    /// Per (subscription, topic), by subscription then topic in byte order.
    pub items: Vec<StatsRow>,
    /// Pass as `cursor` for the next page of `items` (opaque); `null` on the last.
    pub next_cursor: Option<String>,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        detail: None,
        database: None,
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
    // A bad or missing token is not refused here: it gets the public answer.
    let admin = state
        .auth
        .authenticate(&headers)
        .is_ok_and(|principal| principal.has(Role::Admin));
    let Some(problem) = problem else {
        let database = if admin {
            match state.store.database_health().await {
                Ok(health) => Some(health.into()),
                Err(error) => {
                    tracing::warn!(%error, "database health unavailable for /readyz");
                    None
                }
            }
        } else {
            None
        };
        return Json(Health {
            status: "ready".into(),
            detail: None,
            database,
        })
        .into_response();
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, crate::error::RETRY_AFTER_SECONDS)],
        Json(Health {
            status: "not_ready".into(),
            detail: admin.then_some(problem),
            database: None,
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
    match every_stats_row(state).await {
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
    match state.store.database_health().await {
        Ok(health) => {
            metrics::gauge!(DATABASE_OLDEST_TRANSACTION)
                .set(health.oldest_transaction_seconds.unwrap_or(0.0));
            for (table, dead) in health.dead_tuples {
                metrics::gauge!(DATABASE_DEAD_TUPLES, "table" => table).set(dead as f64);
            }
        }
        Err(error) => tracing::warn!(%error, "database health unavailable for /metrics"),
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

/// Every (subscription, topic) row of every tenant, page after page.
async fn every_stats_row(
    state: &ApiState,
) -> Result<Vec<courier::DeliveryStats>, courier::StoreError> {
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let page = state
            .store
            .delivery_stats(None, after, courier::MAX_LIST_PAGE)
            .await?;
        rows.extend(page.items);
        match page.next_cursor {
            Some(key) => after = Some(key),
            None => return Ok(rows),
        }
    }
}

/// Open deliveries by state: overall and per (subscription, topic).
///
/// The totals count every row the token may see (of `tenant`, if given);
/// `items` is one page of the rows, `limit` at a time.
#[utoipa::path(
    get,
    path = "/v1/stats",
    tag = "operations",
    params(StatsQuery),
    responses(
        (status = 200, body = StatsView),
        (status = 400, description = "The cursor is not one of this list's", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A bad query parameter (named)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delivery_stats(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> Result<Json<StatsView>, ApiError> {
    let tenants = listing_tenants(&principal, query.tenant)?;
    let limit = page_limit(query.limit)?;
    let after = cursor::decode_optional::<courier::StatsKey>(query.cursor.as_deref())?;
    let completed = crate::throughput::global().completed_last_hour(tenants.as_deref());
    let totals = state.store.delivery_totals(tenants.clone(), None).await?;
    let page = state
        .store
        .delivery_stats(tenants, after.clone(), limit)
        .await?;
    let (items, next_cursor) = with_completions(page, &completed, after.as_ref(), limit);
    let view = StatsView {
        available: totals.available,
        retrying: totals.retrying,
        running: totals.running,
        dead: totals.dead,
        oldest_pending_age_seconds: totals.oldest_pending_age_seconds,
        completed_last_hour: completed.values().sum(),
        items,
        next_cursor: next_cursor.as_ref().map(cursor::encode),
    };
    Ok(Json(view))
}

/// A page of the database's rows merged with the pairs only this daemon's
/// completions know of (nothing open, but completed in the last hour), in
/// the same (subscription, topic) byte order and under the same cursor: a
/// pair from `completed` is shown on the page whose database rows reach it.
fn with_completions(
    page: courier::DeliveryStatsPage,
    completed: &BTreeMap<(String, String), u64>,
    after: Option<&courier::StatsKey>,
    limit: usize,
) -> (Vec<StatsRow>, Option<courier::StatsKey>) {
    let key = |subscription: &str, topic: &str| (subscription.to_owned(), topic.to_owned());
    let after = after.map(|after| key(&after.subscription, &after.topic));
    // While the database has more, its next page covers the pairs past this one's end.
    let reach = page
        .next_cursor
        .as_ref()
        .map(|next| key(&next.subscription, &next.topic));
    let mut rows: BTreeMap<(String, String), StatsRow> = BTreeMap::new();
    for row in page.items {
        let pair = key(&row.subscription, &row.topic);
        let completed_last_hour = completed.get(&pair).copied().unwrap_or(0);
        rows.insert(
            pair,
            StatsRow {
                subscription: row.subscription,
                topic: row.topic,
                available: row.available,
                retrying: row.retrying,
                running: row.running,
                dead: row.dead,
                oldest_pending_age_seconds: row.oldest_pending_age_seconds,
                completed_last_hour,
            },
        );
    }
    for (pair, count) in completed {
        let past_cursor = after.as_ref().is_none_or(|after| pair > after);
        let within_reach = reach.as_ref().is_none_or(|reach| pair <= reach);
        if past_cursor && within_reach && !rows.contains_key(pair) {
            rows.insert(
                pair.clone(),
                StatsRow {
                    subscription: pair.0.clone(),
                    topic: pair.1.clone(),
                    available: 0,
                    retrying: 0,
                    running: 0,
                    dead: 0,
                    oldest_pending_age_seconds: None,
                    completed_last_hour: *count,
                },
            );
        }
    }
    let more = rows.len() > limit || reach.is_some();
    let items: Vec<StatsRow> = rows.into_values().take(limit).collect();
    let next = if more {
        items.last().map(|row| courier::StatsKey {
            subscription: row.subscription.clone(),
            topic: row.topic.clone(),
        })
    } else {
        None
    };
    (items, next)
}

/// Filters of `GET /v1/throughput`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ThroughputQuery {
    /// Only this tenant's (it must be one of the token's).
    pub tenant: Option<String>,
}

/// Deliveries per second made by this daemon, oldest second first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThroughputView {
    /// Seconds per bucket (1).
    pub interval_seconds: u64,
    /// When the last bucket ends (this daemon's clock).
    pub until: chrono::DateTime<chrono::Utc>,
    /// Deliveries that succeeded in each second of the last 15 minutes.
    pub delivered: Vec<u64>,
    /// Deliveries that failed (to be retried, or dead-lettered) in each second.
    pub failed: Vec<u64>,
}

/// This daemon's deliveries per second over the last 15 minutes, summed
/// over the token's tenants (or `tenant`).
///
/// Counted in this process's memory as its webhooks, relays and other
/// handlers finish: with several daemons each shows its own, and a restart
/// starts at zero. Snoozes (deferrals that spend no attempt) are not counted.
#[utoipa::path(
    get,
    path = "/v1/throughput",
    tag = "operations",
    params(ThroughputQuery),
    responses(
        (status = 200, body = ThroughputView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A bad query parameter (named)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn throughput(
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<ThroughputQuery>,
) -> Result<Json<ThroughputView>, ApiError> {
    let tenants = listing_tenants(&principal, query.tenant)?;
    let series = crate::throughput::global().series(tenants.as_deref());
    let until = i64::try_from(series.until)
        .ok()
        .and_then(|second| chrono::DateTime::from_timestamp(second + 1, 0))
        .unwrap_or_else(chrono::Utc::now);
    Ok(Json(ThroughputView {
        interval_seconds: 1,
        until,
        delivered: series.delivered,
        failed: series.failed,
    }))
}
