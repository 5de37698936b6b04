//! Messages, under `/v1/messages`: publish one (`POST /v1/messages`) or a
//! batch, all or nothing (`POST /v1/messages/batch`), list them and show one
//! with its state in each subscription.
//!
//! A message is validated whole before anything is stored (names, payload
//! size, headers, `available_at` within `max_hold_days`), and a refusal names
//! the field, under `messages[i].` in a batch. A repeated (tenant,
//! idempotency key) stores nothing and answers the first id, unless the
//! earlier message has another topic, schema version or payload: then 409
//! `idempotency_key_reused`. A batch item's key is checked against earlier
//! items and stored messages before the batch's transaction; a message
//! stored under the key by a concurrent request in between is only marked
//! `duplicate`.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use courier::{DeliverySummary, NewMessage, StoredMessage};
pub use courier_api::{BatchRequest, BatchResponse, PublishRequest, PublishResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::extract::{batch_items, in_batch, parse_json, read_body, ApiJson, ApiPath, ApiQuery};
use super::{
    body_limit, check_name, listing_tenants, page_limit, stored_json, ApiState, ErrorView,
    MAX_BATCH_MESSAGES, SMALL_BODY_BYTES,
};
use crate::auth::{Publisher, Reader};
use crate::cursor;
use crate::error::{ApiError, ErrorBody};
use crate::metrics::PUBLISHED;

/// The routes under `/v1/messages`: publishing one and listing under the
/// single-message cap `single_limit`, a batch under `batch_limit`.
pub(super) fn routes(single_limit: usize, batch_limit: usize) -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(publish_message, list_messages))
        .layer(body_limit(single_limit))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(publish_batch))
                .layer(body_limit(batch_limit)),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(get_message))
                .routes(routes!(cancel_message))
                .layer(body_limit(SMALL_BODY_BYTES)),
        )
}

/// The state of a message for one subscription.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// The subscription.
    pub subscription: String,
    /// The open delivery's id: what dead-letter retry and discard take;
    /// `null` once completed or discarded (the delivery is gone).
    pub delivery_id: Option<i64>,
    /// `available`, `running`, `dead`, `discarded` (a dead letter an operator
    /// discarded) or `completed` (applied: a transactional handler's receipt,
    /// or a subscription that receives the message with no open delivery of
    /// it).
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
    /// The payload, as published (on PostgreSQL, as `jsonb` keeps it: see
    /// the README).
    #[schema(schema_with = super::any_json_value)]
    pub payload: Box<serde_json::value::RawValue>,
    /// The headers.
    pub headers: BTreeMap<String, String>,
    /// The ordering key.
    pub ordering_key: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The priority, 0 to 9 (higher is delivered first within its tenant's
    /// share of each claim).
    pub priority: i16,
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

impl From<StoredMessage> for MessageView {
    fn from(message: StoredMessage) -> Self {
        Self {
            id: message.id,
            tenant: message.tenant,
            topic: message.topic,
            schema_version: message.schema_version,
            payload: stored_json(message.payload),
            headers: message.headers,
            ordering_key: message.ordering_key,
            idempotency_key: message.idempotency_key,
            priority: message.priority,
            occurred_at: message.occurred_at,
            available_at: message.available_at,
            enqueued_at: message.enqueued_at,
            deliveries: None,
        }
    }
}

/// A page of messages, newest first (by `enqueued_at`, then `id`).
#[derive(Debug, Serialize, ToSchema)]
pub struct MessagePageView {
    /// The messages.
    pub items: Vec<MessageView>,
    /// Pass as `cursor` for the next page (opaque); `null` on the last.
    pub next_cursor: Option<String>,
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
    /// Only the message with this id.
    pub message_id: Option<Uuid>,
    /// Only messages enqueued at or after this instant (RFC 3339, the
    /// database clock's `enqueued_at`).
    pub enqueued_after: Option<DateTime<Utc>>,
    /// Only messages enqueued before this instant (RFC 3339); after
    /// `enqueued_after` when both are given.
    pub enqueued_before: Option<DateTime<Utc>>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, unchanged (opaque).
    pub cursor: Option<String>,
}

/// What the OpenAPI document says of the `traceparent` request header.
pub(crate) const TRACEPARENT_DOC: &str = "W3C `traceparent` of the caller's span: stored as the \
    message's `traceparent` header (with `tracestate`) unless the body's `headers` \
    carry one, so deliveries continue the caller's trace; a malformed value is ignored";

fn idempotency_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid("Idempotency-Key", "the header must be visible ASCII")),
    }
}

/// The W3C trace context of a publish request (its `traceparent` and
/// `tracestate` headers), for the messages it publishes; `None` when it has
/// no `traceparent`, several, or one that is not valid
/// ([`courier::valid_traceparent`]): a malformed context is ignored, never
/// a reason to refuse the publish (or an append).
pub(crate) fn request_trace_context(headers: &HeaderMap) -> Option<(&str, Option<&str>)> {
    let mut parents = headers.get_all(courier::TRACEPARENT).iter();
    let parent = parents.next()?.to_str().ok()?;
    if parents.next().is_some() || !courier::valid_traceparent(parent) {
        return None;
    }
    let state = headers
        .get(courier::TRACESTATE)
        .and_then(|state| state.to_str().ok());
    Some((parent, state))
}

/// Adds the request's trace context to each message without one of its own.
fn add_trace_context(headers: &HeaderMap, messages: &mut [NewMessage]) {
    if let Some((parent, state)) = request_trace_context(headers) {
        for message in messages {
            courier::insert_trace_context(&mut message.headers, parent, state);
        }
    }
}

/// Publish one message.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    request_body = PublishRequest,
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Same as the body's `idempotency_key`"),
        ("traceparent" = Option<String>, Header, description = TRACEPARENT_DOC),
        ("tracestate" = Option<String>, Header, description = "W3C `tracestate`, kept with `traceparent`"),
    ),
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
    let mut message = request.validate_into("", state.max_payload_bytes, state.max_hold, key)?;
    add_trace_context(&headers, std::slice::from_mut(&mut message));
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
    params(
        ("traceparent" = Option<String>, Header, description = TRACEPARENT_DOC),
        ("tracestate" = Option<String>, Header, description = "W3C `tracestate`, kept with `traceparent`"),
    ),
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
        messages.push(message.validate_into(
            &prefix,
            state.max_payload_bytes,
            state.max_hold,
            None,
        )?);
    }
    refuse_reused_keys(&state, &messages).await?;
    add_trace_context(&headers, &mut messages);
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

/// A cancelled message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CancelView {
    /// The message id.
    pub id: Uuid,
    /// Always `true`: the message and its deliveries are gone.
    pub cancelled: bool,
    /// How many deliveries (one per subscription owed it) were removed.
    pub deliveries: u64,
}

/// Cancel a message no subscription has started on (scheduled for later, or
/// waiting): it and its deliveries are removed at once, no subscription will
/// see it, and its idempotency key is free again. Once a delivery runs,
/// fails an attempt, is dead-lettered or completes, the cancel is 409
/// `already_started` naming the subscription, and nothing changes.
#[utoipa::path(
    post,
    path = "/v1/messages/{id}/cancel",
    tag = "messages",
    params(("id" = Uuid, Path, description = "The message id")),
    responses(
        (status = 200, body = CancelView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `publish` role", body = ErrorBody),
        (status = 404, description = "No such message (or cancelled before), or another tenant's", body = ErrorBody),
        (status = 409, description = "`already_started`: a subscription has started on it", body = ErrorBody),
        (status = 422, description = "The id is not a UUID", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn cancel_message(
    State(state): State<ApiState>,
    Publisher(principal): Publisher,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<CancelView>, ApiError> {
    let id: Uuid = id
        .parse()
        .map_err(|e| ApiError::invalid("id", format!("{id:?} is not a UUID: {e}")))?;
    let not_found = || ApiError::not_found(format!("no message {id}"), Some("id".into()));
    // The tenant never changes, so checking it before the cancel is as good
    // as checking it inside.
    let (message, _) = state.store.get_message(id).await?.ok_or_else(not_found)?;
    if !principal.tenants.allows(&message.tenant) {
        return Err(not_found());
    }
    match state.store.cancel_message(id).await? {
        courier::CancelOutcome::Cancelled { deliveries } => {
            tracing::info!(message_id = %id, tenant = %message.tenant, deliveries, "message cancelled");
            Ok(Json(CancelView {
                id,
                cancelled: true,
                deliveries,
            }))
        }
        courier::CancelOutcome::NotFound => Err(not_found()),
        courier::CancelOutcome::Started {
            subscription,
            state,
        } => Err(ApiError::already_started(format!(
            "message {id} cannot be cancelled: subscription {subscription} has started on it ({state})"
        ))),
    }
}

/// Messages, newest first, of the token's tenants.
#[utoipa::path(
    get,
    path = "/v1/messages",
    tag = "messages",
    params(MessageQuery),
    responses(
        (status = 200, body = MessagePageView),
        (status = 400, description = "The cursor is not one of this list's", body = ErrorBody),
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
    let before = cursor::decode_optional::<courier::MessageKey>(query.cursor.as_deref())?;
    let filter = courier::MessageFilter {
        tenants: listing_tenants(&principal, query.tenant)?,
        topic: query.topic,
        state: query.state,
        subscription: query.subscription,
        message_id: query.message_id,
        enqueued_after: query.enqueued_after,
        enqueued_before: query.enqueued_before,
    };
    filter.validate()?;
    let page = state.store.list_messages(filter, before, limit).await?;
    Ok(Json(MessagePageView {
        items: page.items.into_iter().map(MessageView::from).collect(),
        next_cursor: page.next_cursor.as_ref().map(cursor::encode),
    }))
}
