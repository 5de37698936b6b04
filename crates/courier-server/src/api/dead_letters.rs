//! Dead letters, under `/v1/dead-letters`: deliveries a subscription gave
//! up on, listed and shown with their error history, grouped by the
//! fingerprint of their last failure (`/groups`), and retried (attempts
//! reset) or discarded by `ids` or by `filter` (a `fingerprint` too).
//!
//! A selection names exactly one of `ids` (1 to [`MAX_IDS`]) and `filter`.
//! An empty filter matches every dead letter the token may see, so it is
//! refused (422 `filter`) unless `"all": true` says so; `"dry_run": true`
//! previews a filter, changing nothing and answering the count and the first
//! [`DRY_RUN_IDS`] ids. A token scoped to some tenants acts only on their
//! dead letters: another tenant's id is skipped as if it did not exist.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use courier::{DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterKey};
pub use courier_api::{Affected, DeadLetterFilterBody, DeadLetterSelection};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::{
    body_limit, check_name, page_limit, single_tenant, stored_json, ApiState, ErrorView,
    DRY_RUN_IDS, MAX_IDS, SMALL_BODY_BYTES,
};
use crate::auth::{Admin, Principal, Reader};
use crate::cursor;
use crate::error::{ApiError, ErrorBody};

/// The routes under `/v1/dead-letters`.
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_dead_letters))
        .routes(routes!(dead_letter_groups))
        .routes(routes!(get_dead_letter))
        .routes(routes!(retry_dead_letters))
        .routes(routes!(discard_dead_letters))
        .layer(body_limit(SMALL_BODY_BYTES))
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
    /// Only this message's.
    pub message_id: Option<Uuid>,
    /// Only those dead-lettered at or after this instant (RFC 3339).
    pub dead_after: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant (RFC 3339); after
    /// `dead_after` when both are given.
    pub dead_before: Option<DateTime<Utc>>,
    /// Only those whose last failure has this fingerprint (16 hex digits, as
    /// `GET /v1/dead-letters/groups` shows, or `unknown`).
    pub fingerprint: Option<String>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, unchanged (opaque).
    pub cursor: Option<String>,
}

/// Filters of `GET /v1/dead-letters/groups`: those of `GET /v1/dead-letters`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterGroupsQuery {
    /// Only this tenant's; required for a token scoped to several tenants.
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only this subscription's.
    pub subscription: Option<String>,
    /// Only this message's.
    pub message_id: Option<Uuid>,
    /// Only those dead-lettered at or after this instant (RFC 3339).
    pub dead_after: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant (RFC 3339); after
    /// `dead_after` when both are given.
    pub dead_before: Option<DateTime<Utc>>,
    /// Only this fingerprint's group (16 hex digits, or `unknown`).
    pub fingerprint: Option<String>,
    /// The most groups, largest first: 1 to 500 (default 50).
    pub limit: Option<usize>,
}

/// Dead letters whose last failure has one fingerprint.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterGroupView {
    /// The fingerprint: what `fingerprint` filters on in the listing, retry
    /// and discard. `unknown`: dead letters recorded before Courier stored
    /// fingerprints.
    pub fingerprint: String,
    /// The last error of the group's newest dead letter, as stored.
    pub sample_error: String,
    /// How many dead letters the group holds (within the filters).
    pub count: u64,
    /// The oldest `dead_at` in the group.
    pub first_seen: Option<DateTime<Utc>>,
    /// The newest `dead_at` in the group.
    pub last_seen: Option<DateTime<Utc>>,
    /// The subscriptions affected, sorted.
    pub subscriptions: Vec<String>,
    /// The topics affected, sorted.
    pub topics: Vec<String>,
}

impl From<DeadLetterGroup> for DeadLetterGroupView {
    fn from(group: DeadLetterGroup) -> Self {
        Self {
            fingerprint: group.fingerprint,
            sample_error: group.sample_error,
            count: group.count,
            first_seen: group.first_seen,
            last_seen: group.last_seen,
            subscriptions: group.subscriptions,
            topics: group.topics,
        }
    }
}

/// Dead-letter groups, largest first (by count, then fingerprint).
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterGroupsView {
    /// The groups.
    pub items: Vec<DeadLetterGroupView>,
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
    /// The payload, as published (on PostgreSQL, as `jsonb` keeps it).
    #[schema(schema_with = super::any_json_value)]
    pub payload: Box<serde_json::value::RawValue>,
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
            payload: stored_json(dead.payload),
            attempts: dead.attempts,
            errors: dead.errors.into_iter().map(ErrorView::from).collect(),
            dead_at: dead.dead_at,
            enqueued_at: dead.enqueued_at,
        }
    }
}

/// A page of dead letters, oldest first (by `dead_at`, then `id`).
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPageView {
    /// The dead letters.
    pub items: Vec<DeadLetterView>,
    /// Pass as `cursor` for the next page (opaque); `null` on the last.
    pub next_cursor: Option<String>,
}

/// Dead letters of the token's tenants, oldest first.
#[utoipa::path(
    get,
    path = "/v1/dead-letters",
    tag = "dead-letters",
    params(DeadLetterQuery),
    responses(
        (status = 200, body = DeadLetterPageView),
        (status = 400, description = "The cursor is not one of this list's", body = ErrorBody),
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
    let after = cursor::decode_optional::<DeadLetterKey>(query.cursor.as_deref())?;
    let filter = DeadLetterFilter {
        tenant: single_tenant(&principal, query.tenant, "tenant")?,
        topic: query.topic,
        subscription: query.subscription,
        message_id: query.message_id,
        dead_after: query.dead_after,
        dead_before: query.dead_before,
        fingerprint: query.fingerprint,
    };
    filter.validate()?;
    let page = state.store.list_dead_letters(filter, after, limit).await?;
    Ok(Json(DeadLetterPageView {
        items: page.items.into_iter().map(DeadLetterView::from).collect(),
        next_cursor: page.next_cursor.as_ref().map(cursor::encode),
    }))
}

/// Dead letters of the token's tenants grouped by what broke: the
/// fingerprint of their last failure, with a sample error, the count, when
/// the group was first and last seen and the subscriptions and topics it
/// touched. Retry or discard a group with `filter.fingerprint`.
#[utoipa::path(
    get,
    path = "/v1/dead-letters/groups",
    tag = "dead-letters",
    params(DeadLetterGroupsQuery),
    responses(
        (status = 200, body = DeadLetterGroupsView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn dead_letter_groups(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<DeadLetterGroupsQuery>,
) -> Result<Json<DeadLetterGroupsView>, ApiError> {
    check_name("topic", query.topic.as_ref())?;
    check_name("subscription", query.subscription.as_ref())?;
    let limit = page_limit(query.limit)?;
    let filter = DeadLetterFilter {
        tenant: single_tenant(&principal, query.tenant, "tenant")?,
        topic: query.topic,
        subscription: query.subscription,
        message_id: query.message_id,
        dead_after: query.dead_after,
        dead_before: query.dead_before,
        fingerprint: query.fingerprint,
    };
    filter.validate()?;
    let groups = state.store.dead_letter_groups(filter, limit).await?;
    Ok(Json(DeadLetterGroupsView {
        items: groups.into_iter().map(DeadLetterGroupView::from).collect(),
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
    let matching = state.store.count_dead_letters(filter.clone()).await?;
    let page = state
        .store
        .list_dead_letters(filter, None, DRY_RUN_IDS)
        .await?;
    Ok(Affected {
        affected: matching,
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
            let filter = DeadLetterFilter::from(filter);
            let empty = filter.is_empty();
            filter
                .validate()
                .map_err(|e| ApiError::invalid(format!("filter.{}", e.field), e.reason))?;
            let filter = DeadLetterFilter {
                tenant: single_tenant(principal, filter.tenant, "filter.tenant")?,
                ..filter
            };
            if empty && !all {
                return Err(ApiError::invalid(
                    "filter",
                    "an empty filter matches every dead letter this token may see; name a \
                     tenant, topic, subscription, message_id, fingerprint or \
                     dead_after/dead_before, or send \
                     \"all\": true to mean every one",
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
