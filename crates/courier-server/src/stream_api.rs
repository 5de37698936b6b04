//! The streams API under `/v1/streams`: the listing of streams with their
//! groups (`GET /v1/streams`), and under `/v1/streams/{tenant}/{stream}`
//! append and range, consumer groups (create, read, ack, claim, pending,
//! consumers) and trim, over the daemon's stream backend ([`ApiStreams`]).
//!
//! Each operation is a plain function here (`append`, `read`, ...) taking
//! the backend, the stream and its typed request: the HTTP handlers call them
//! after checking the token, and the CLI calls the same functions when it
//! talks to a stream backend directly, so both refuse the same input with the
//! same field named.
//!
//! Input is refused before anything is written: names (`tenant`, `stream`,
//! `group`, `consumer`), entry ids (`ids[3]`, `after`, `cursor`, `min_id`),
//! counts (1 to 10,000), `block_ms` (at most 30,000), `min_idle_ms` (at most
//! a year), a trim with both or
//! neither bound, and headers are 422 naming the field; a payload over
//! `max_payload_bytes` is 413 (`entries[i].payload`); a body that is not JSON
//! is 400. An append is all or nothing.
//!
//! Access: `publish` appends; `read` (or `admin`) lists streams, entries,
//! pending entries and consumers; `consume` reads, acks and claims through a
//! group; `admin` creates groups, trims and deletes consumers. A stream of a
//! tenant the token does not see is 404 to it, and appending to it 403. The
//! listing shows only the token's tenants, and asking it for another tenant
//! is 403 (`tenant`); it pages like every list of the API (`limit`, an
//! opaque `cursor`, see [`crate::cursor`]). An unknown group is 404
//! (`group`). When the backend is unreachable the answer is 503 with
//! `Retry-After`.
//!
//! A blocking read waits on its own request (other requests go on), at most
//! a second less than `server.request_timeout_ms` (a quarter less below 4 s;
//! [`crate::api::max_block_within`]; so a legal `block_ms` is
//! answered, with what arrived, rather than cut off with 408), and ends
//! early when the client goes away (its request future is dropped, and the
//! backend's wait with it) or when the daemon shuts down (it answers the
//! entries read so far: none). Entries a cancelled read may already have been
//! handed stay pending for its consumer, to be claimed once idle.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use courier::{
    validate_count, validate_name, ClaimIdle, ConsumerInfo, ConsumerRemoval, DeliveredEntry,
    EntryOrigin, GroupStart, GroupSummary, NewStreamEntry, PendingDetail, PendingQuery, ReadNew,
    StoreError, StreamEntry, StreamEntryId, StreamKey, StreamPage, StreamSummary, TrimBound,
    MAX_HEADERS, MAX_STREAM_BATCH, MAX_STREAM_BLOCK, MAX_STREAM_PAGE,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub use courier_api::{
    AckRequest, AppendEntry, AppendRequest, ClaimRequest, GroupRequest, PendingParams, RangeQuery,
    ReadRequest, TrimRequest,
};

use crate::api::{
    request_trace_context, ApiJson, ApiQuery, ApiState, DEFAULT_PAGE, MAX_PAGE, TRACEPARENT_DOC,
};
use crate::auth::{Admin, Consumer, Principal, Publisher, Reader};
use crate::cursor;
use crate::error::{ApiError, ErrorBody};
use crate::metrics::{STREAM_ENTRIES_APPENDED, STREAM_READS_BLOCKED};
use crate::stream_store::ApiStreams;

/// How many entries a read, range, claim or pending page returns when
/// `count` is not given.
pub const DEFAULT_STREAM_COUNT: usize = 100;
/// The longest header name of a stream entry, in bytes.
pub const MAX_HEADER_NAME_BYTES: usize = 128;
/// The longest header value of a stream entry, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;
/// The largest `min_idle_ms` of a claim or pending query (a year).
pub const MAX_MIN_IDLE_MS: u64 = 365 * 24 * 3600 * 1000;

// ---------------------------------------------------------------- types

/// The ids the appended entries got, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppendResponse {
    /// One id (`a-b`) per entry.
    #[schema(value_type = Vec<String>)]
    pub ids: Vec<StreamEntryId>,
}

/// The outbox message a relayed entry carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OriginView {
    /// The message id.
    pub message_id: Uuid,
    /// The message's tenant.
    pub tenant: String,
    /// The message's topic.
    pub topic: String,
    /// The message's schema version.
    pub schema_version: i32,
}

impl From<EntryOrigin> for OriginView {
    fn from(origin: EntryOrigin) -> Self {
        Self {
            message_id: origin.message_id,
            tenant: origin.tenant,
            topic: origin.topic,
            schema_version: origin.schema_version,
        }
    }
}

/// A stored entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EntryView {
    /// Its id (`a-b`).
    #[schema(value_type = String)]
    pub id: StreamEntryId,
    /// Its payload.
    #[schema(schema_with = crate::api::any_json_value)]
    pub payload: serde_json::Value,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// The outbox message it relays, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OriginView>,
}

impl From<StreamEntry> for EntryView {
    fn from(entry: StreamEntry) -> Self {
        Self {
            id: entry.id,
            payload: entry.payload,
            headers: entry.headers,
            origin: entry.origin.map(OriginView::from),
        }
    }
}

/// Entries, in id order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EntryList {
    /// The entries.
    pub entries: Vec<EntryView>,
}

/// An entry handed to a consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeliveredView {
    /// Its id (`a-b`).
    #[schema(value_type = String)]
    pub id: StreamEntryId,
    /// Its payload.
    #[schema(schema_with = crate::api::any_json_value)]
    pub payload: serde_json::Value,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// The outbox message it relays, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OriginView>,
    /// Deliveries so far, this one included.
    pub deliveries: u64,
}

impl From<DeliveredEntry> for DeliveredView {
    fn from(delivered: DeliveredEntry) -> Self {
        let entry = EntryView::from(delivered.entry);
        Self {
            id: entry.id,
            payload: entry.payload,
            headers: entry.headers,
            origin: entry.origin,
            deliveries: delivered.deliveries,
        }
    }
}

/// Entries handed to a consumer, in id order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeliveredList {
    /// The entries, each now pending for the consumer until acked.
    pub entries: Vec<DeliveredView>,
}

/// A group after `PUT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// Whether this request created it (`false`: it existed and is unchanged).
    pub created: bool,
}

/// How many acked ids were pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Acked {
    /// Ids not pending (or unknown) count 0.
    pub acked: u64,
}

/// What a claim took over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClaimView {
    /// Entries now pending for the claiming consumer.
    pub entries: Vec<DeliveredView>,
    /// Idle pending ids whose entries were trimmed: dropped from pending.
    #[schema(value_type = Vec<String>)]
    pub deleted: Vec<StreamEntryId>,
    /// The cursor of the next claim; `0-0` when the scan reached the end.
    #[schema(value_type = String)]
    pub next: StreamEntryId,
}

/// A group's pending entries, summed up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PendingSummaryView {
    /// How many entries are pending.
    pub count: u64,
    /// The lowest pending id.
    #[schema(value_type = Option<String>)]
    pub lowest: Option<StreamEntryId>,
    /// The highest pending id.
    #[schema(value_type = Option<String>)]
    pub highest: Option<StreamEntryId>,
    /// Pending entries per consumer (consumers with none left out).
    pub consumers: BTreeMap<String, u64>,
}

/// One pending entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PendingEntryView {
    /// The entry's id.
    #[schema(value_type = String)]
    pub id: StreamEntryId,
    /// The consumer it is pending for.
    pub consumer: String,
    /// Milliseconds since it was last delivered (backend clock).
    pub idle_ms: u64,
    /// How often it has been delivered, less the deliveries a subscription
    /// took back (deferred, or read and not run): 0 for an entry read once
    /// and deferred.
    pub deliveries: u64,
}

impl From<PendingDetail> for PendingEntryView {
    fn from(detail: PendingDetail) -> Self {
        Self {
            id: detail.id,
            consumer: detail.consumer,
            idle_ms: millis(detail.idle),
            deliveries: detail.deliveries,
        }
    }
}

/// The summary of a group's pending entries and a page of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PendingView {
    /// Over the whole group, whatever the filters.
    pub summary: PendingSummaryView,
    /// The page the parameters select, in id order.
    pub entries: Vec<PendingEntryView>,
}

/// A consumer of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConsumerView {
    /// Its name.
    pub name: String,
    /// Entries pending for it.
    pub pending: u64,
    /// Milliseconds since it last read or claimed (backend clock).
    pub idle_ms: u64,
}

impl From<ConsumerInfo> for ConsumerView {
    fn from(info: ConsumerInfo) -> Self {
        Self {
            name: info.name,
            pending: info.pending,
            idle_ms: millis(info.idle),
        }
    }
}

/// A group's consumers, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConsumerList {
    /// The consumers.
    pub consumers: Vec<ConsumerView>,
}

/// How many entries a trim removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Trimmed {
    /// The count (entries still pending stay pending).
    pub removed: u64,
}

/// Filter and paging of `GET /v1/streams`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamListQuery {
    /// Only this tenant's streams (it must be one of the token's).
    pub tenant: Option<String>,
    /// Streams per page, 1 to 500 (default 50).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, unchanged (opaque).
    pub cursor: Option<String>,
}

/// A consumer group of a listed stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GroupSummaryView {
    /// The group.
    pub name: String,
    /// Its consumers, idle or not.
    pub consumers: u64,
    /// Entries handed out and not acked yet.
    pub pending: u64,
    /// Entries it has not handed out yet; `null` when the backend cannot
    /// tell (Redis, after entries were deleted or trimmed from the part not
    /// read yet).
    pub lag: Option<u64>,
    /// Its cursor (`a-b`): the last id it handed out, or where it started.
    #[schema(value_type = String)]
    pub last_delivered_id: StreamEntryId,
}

impl From<GroupSummary> for GroupSummaryView {
    fn from(group: GroupSummary) -> Self {
        Self {
            name: group.name,
            consumers: group.consumers,
            pending: group.pending,
            lag: group.lag,
            last_delivered_id: group.last_delivered,
        }
    }
}

/// A stream with its groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamSummaryView {
    /// The stream's tenant.
    pub tenant: String,
    /// The stream (dead letters are the stream `{stream}.dead`).
    pub stream: String,
    /// How many entries it holds.
    pub length: u64,
    /// Its newest entry's id (`a-b`); `null` when it holds none.
    #[schema(value_type = Option<String>)]
    pub last_id: Option<StreamEntryId>,
    /// Its consumer groups, by name in byte order.
    pub groups: Vec<GroupSummaryView>,
}

impl From<StreamSummary> for StreamSummaryView {
    fn from(summary: StreamSummary) -> Self {
        Self {
            tenant: summary.tenant,
            stream: summary.stream,
            length: summary.length,
            last_id: summary.last_id,
            groups: summary
                .groups
                .into_iter()
                .map(GroupSummaryView::from)
                .collect(),
        }
    }
}

/// A page of streams, by tenant then stream in byte order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamPageView {
    /// The streams.
    pub items: Vec<StreamSummaryView>,
    /// Pass as `cursor` for the next page (opaque); `null` on the last.
    pub next_cursor: Option<String>,
}

// ---------------------------------------------------------------- operations

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The stream `tenant`/`stream`, or 422 naming `tenant` or `stream`.
pub fn stream_key(tenant: &str, stream: &str) -> Result<StreamKey, ApiError> {
    Ok(StreamKey::new(tenant, stream)?)
}

fn min_idle(min_idle_ms: u64) -> Result<Duration, ApiError> {
    if min_idle_ms > MAX_MIN_IDLE_MS {
        return Err(ApiError::invalid(
            "min_idle_ms",
            format!("is {min_idle_ms}; the limit is {MAX_MIN_IDLE_MS} (a year)"),
        ));
    }
    Ok(Duration::from_millis(min_idle_ms))
}

fn count_or_default(count: Option<usize>) -> Result<usize, ApiError> {
    let count = count.unwrap_or(DEFAULT_STREAM_COUNT);
    validate_count("count", count)?;
    Ok(count)
}

/// A backend error as the API answers it: a missing group is 404
/// (`group`), an outage 503.
fn backend_error(streams: &dyn ApiStreams, error: StoreError) -> ApiError {
    match error {
        StoreError::NotFound { what } => {
            ApiError::not_found(format!("no {what}"), Some("group".into()))
        }
        StoreError::Invalid(validation) => validation.into(),
        error if error.is_transient() => {
            tracing::warn!(backend = streams.backend(), %error, "stream backend temporarily unavailable");
            ApiError::unavailable(format!(
                "the stream backend ({}) is temporarily unavailable; try again",
                streams.backend()
            ))
        }
        error => {
            tracing::error!(backend = streams.backend(), %error, "stream backend error");
            ApiError::internal("internal error; the daemon's log has the details")
        }
    }
}

/// Checks entries to append and builds them; nothing is written.
pub fn validate_entries(
    request: AppendRequest,
    max_payload_bytes: usize,
) -> Result<Vec<NewStreamEntry>, ApiError> {
    if request.entries.is_empty() || request.entries.len() > MAX_STREAM_BATCH {
        return Err(ApiError::invalid(
            "entries",
            format!(
                "must hold 1 to {MAX_STREAM_BATCH} entries, got {}",
                request.entries.len()
            ),
        ));
    }
    let limit = max_payload_bytes.min(courier::MAX_PAYLOAD_BYTES);
    let mut entries = Vec::with_capacity(request.entries.len());
    for (index, entry) in request.entries.into_iter().enumerate() {
        let field = |name: &str| format!("entries[{index}].{name}");
        let size = serde_json::to_string(&entry.payload)
            .map_err(|e| ApiError::invalid(field("payload"), format!("cannot be encoded: {e}")))?
            .len();
        if size > limit {
            return Err(ApiError::too_large(
                field("payload"),
                format!("is {size} bytes of JSON; the limit is {limit}"),
            ));
        }
        if entry.headers.len() > MAX_HEADERS {
            return Err(ApiError::invalid(
                field("headers"),
                format!(
                    "has {} entries; the limit is {MAX_HEADERS}",
                    entry.headers.len()
                ),
            ));
        }
        for (name, value) in &entry.headers {
            if name.is_empty()
                || name.len() > MAX_HEADER_NAME_BYTES
                || name.chars().any(char::is_control)
            {
                return Err(ApiError::invalid(
                    field("headers"),
                    format!("header name {name:?} must be 1 to {MAX_HEADER_NAME_BYTES} bytes without control characters"),
                ));
            }
            if value.len() > MAX_HEADER_VALUE_BYTES {
                return Err(ApiError::invalid(
                    format!("{}.{name}", field("headers")),
                    format!(
                        "is {} bytes; the limit is {MAX_HEADER_VALUE_BYTES}",
                        value.len()
                    ),
                ));
            }
        }
        let entry = NewStreamEntry {
            payload: entry.payload,
            headers: entry.headers,
            origin: None,
        };
        entry
            .validate(index, limit)
            .map_err(|e| ApiError::from_validation(&format!("entries[{index}]."), e))?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Appends entries, all or nothing. `trace` (the request's W3C
/// `traceparent` and `tracestate`) goes into each entry whose headers carry
/// no trace context of their own, so the stream's subscriptions continue
/// the caller's trace.
pub async fn append(
    streams: &dyn ApiStreams,
    key: StreamKey,
    request: AppendRequest,
    max_payload_bytes: usize,
    trace: Option<(&str, Option<&str>)>,
) -> Result<AppendResponse, ApiError> {
    let mut entries = validate_entries(request, max_payload_bytes)?;
    if let Some((parent, state)) = trace {
        for entry in &mut entries {
            courier::insert_trace_context(&mut entry.headers, parent, state);
        }
    }
    let count = entries.len() as u64;
    let ids = streams
        .append(key, entries)
        .await
        .map_err(|e| backend_error(streams, e))?;
    metrics::counter!(STREAM_ENTRIES_APPENDED, "backend" => streams.backend()).increment(count);
    Ok(AppendResponse { ids })
}

/// Entries above `after`, outside any group.
pub async fn range(
    streams: &dyn ApiStreams,
    key: StreamKey,
    query: RangeQuery,
) -> Result<EntryList, ApiError> {
    let count = count_or_default(query.count)?;
    let after = query.after.unwrap_or(StreamEntryId::ZERO);
    let entries = streams
        .range(key, after, count)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(EntryList {
        entries: entries.into_iter().map(EntryView::from).collect(),
    })
}

/// Creates `group` unless it exists.
pub async fn ensure_group(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    request: GroupRequest,
) -> Result<GroupView, ApiError> {
    validate_name("group", &group)?;
    let start: GroupStart = request.start.as_deref().unwrap_or("end").parse()?;
    let created = streams
        .ensure_group(key, group.clone(), start)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(GroupView { group, created })
}

/// Counts a blocking read while it waits (`courier_stream_reads_blocked`).
struct BlockedRead;

impl BlockedRead {
    fn start() -> Self {
        metrics::gauge!(STREAM_READS_BLOCKED).increment(1.0);
        BlockedRead
    }
}

impl Drop for BlockedRead {
    fn drop(&mut self) {
        metrics::gauge!(STREAM_READS_BLOCKED).decrement(1.0);
    }
}

/// Hands `request.consumer` new entries of `group`, waiting up to
/// `block_ms` (at most `max_block`) for one; a wait ends early, with no
/// entries, when `stop` is cancelled.
pub async fn read(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    request: ReadRequest,
    max_block: Duration,
    stop: &CancellationToken,
) -> Result<DeliveredList, ApiError> {
    let read = ReadNew {
        group,
        consumer: request.consumer,
        count: count_or_default(request.count)?,
        block: request
            .block_ms
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis),
    };
    if let Some(block) = read.block {
        if block > MAX_STREAM_BLOCK {
            return Err(ApiError::invalid(
                "block_ms",
                format!(
                    "is {} ms; the limit is {} ms",
                    block.as_millis(),
                    MAX_STREAM_BLOCK.as_millis()
                ),
            ));
        }
    }
    read.validate()?;
    let read = ReadNew {
        block: read
            .block
            .map(|block| block.min(max_block))
            .filter(|block| !block.is_zero()),
        ..read
    };
    let entries = if read.block.is_some() {
        let _counted = BlockedRead::start();
        tokio::select! {
            entries = streams.read_new(key, read) => entries,
            () = stop.cancelled() => Ok(Vec::new()),
        }
    } else {
        streams.read_new(key, read).await
    }
    .map_err(|e| backend_error(streams, e))?;
    Ok(DeliveredList {
        entries: entries.into_iter().map(DeliveredView::from).collect(),
    })
}

/// Acknowledges entries of `group`.
pub async fn ack(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    request: AckRequest,
) -> Result<Acked, ApiError> {
    validate_name("group", &group)?;
    if request.ids.is_empty() || request.ids.len() > MAX_STREAM_BATCH {
        return Err(ApiError::invalid(
            "ids",
            format!(
                "must hold 1 to {MAX_STREAM_BATCH} ids, got {}",
                request.ids.len()
            ),
        ));
    }
    let acked = streams
        .ack(key, group, request.ids)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(Acked { acked })
}

/// Takes over entries of `group` idle at least `min_idle_ms`.
pub async fn claim(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    request: ClaimRequest,
) -> Result<ClaimView, ApiError> {
    let claim = ClaimIdle {
        group,
        consumer: request.consumer,
        min_idle: min_idle(request.min_idle_ms)?,
        cursor: request.cursor.unwrap_or(StreamEntryId::ZERO),
        count: count_or_default(request.count)?,
    };
    claim.validate()?;
    let claimed = streams
        .claim_idle(key, claim)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(ClaimView {
        entries: claimed
            .entries
            .into_iter()
            .map(DeliveredView::from)
            .collect(),
        deleted: claimed.deleted,
        next: claimed.next,
    })
}

/// The summary of `group`'s pending entries and the page `params` selects.
pub async fn pending(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    params: PendingParams,
) -> Result<PendingView, ApiError> {
    validate_name("group", &group)?;
    let query = PendingQuery {
        after: params.after.unwrap_or(StreamEntryId::ZERO),
        count: count_or_default(params.count)?,
        consumer: params.consumer,
        min_idle: params.min_idle_ms.map(min_idle).transpose()?,
    };
    query.validate()?;
    let summary = streams
        .pending_summary(key.clone(), group.clone())
        .await
        .map_err(|e| backend_error(streams, e))?;
    let entries = streams
        .pending_detail(key, group, query)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(PendingView {
        summary: PendingSummaryView {
            count: summary.count,
            lowest: summary.lowest,
            highest: summary.highest,
            consumers: summary.consumers,
        },
        entries: entries.into_iter().map(PendingEntryView::from).collect(),
    })
}

/// `group`'s consumers.
pub async fn consumers(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
) -> Result<ConsumerList, ApiError> {
    validate_name("group", &group)?;
    let consumers = streams
        .consumers(key, group)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(ConsumerList {
        consumers: consumers.into_iter().map(ConsumerView::from).collect(),
    })
}

/// Deletes `consumer` of `group`: 404 when unknown, 409 (with its pending
/// count) while entries are pending for it.
pub async fn delete_consumer(
    streams: &dyn ApiStreams,
    key: StreamKey,
    group: String,
    consumer: String,
) -> Result<(), ApiError> {
    validate_name("group", &group)?;
    validate_name("consumer", &consumer)?;
    let removal = streams
        .delete_consumer(key, group.clone(), consumer.clone())
        .await
        .map_err(|e| backend_error(streams, e))?;
    match removal {
        ConsumerRemoval::Deleted => Ok(()),
        ConsumerRemoval::NotFound => Err(ApiError::not_found(
            format!("group {group} has no consumer {consumer}"),
            Some("consumer".into()),
        )),
        ConsumerRemoval::HasPending(pending) => Err(ApiError::conflict(
            format!(
                "consumer {consumer} still has pending entries ({pending}); ack them or claim them for another consumer first"
            ),
            Some("consumer".into()),
        )),
    }
}

/// A page size: `limit`, 1 to 500 (422 naming `limit` outside), or 50.
pub fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let most = MAX_PAGE.min(MAX_STREAM_PAGE);
    match limit {
        None => Ok(DEFAULT_PAGE.min(most)),
        Some(limit) if (1..=most).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and {most}, got {limit}"),
        )),
    }
}

/// A page of the streams of `tenants` (`None`: all) after `after`, at most
/// `limit`, each with its groups.
pub async fn list(
    streams: &dyn ApiStreams,
    tenants: Option<Vec<String>>,
    after: Option<StreamKey>,
    limit: usize,
) -> Result<StreamPageView, ApiError> {
    let page: StreamPage = streams
        .list_streams(tenants, after, limit)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(StreamPageView {
        next_cursor: page.next.as_ref().map(cursor::encode),
        items: page
            .items
            .into_iter()
            .map(StreamSummaryView::from)
            .collect(),
    })
}

/// Removes the oldest entries down to the request's one bound.
pub async fn trim(
    streams: &dyn ApiStreams,
    key: StreamKey,
    request: TrimRequest,
) -> Result<Trimmed, ApiError> {
    let bound = match (request.max_len, request.min_id) {
        (Some(max_len), None) => TrimBound::MaxLen(max_len),
        (None, Some(min_id)) => TrimBound::MinId(min_id),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "min_id",
                "send exactly one of `max_len` and `min_id`, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "max_len",
                "send exactly one of `max_len` and `min_id`",
            ))
        }
    };
    let removed = streams
        .trim(key, bound)
        .await
        .map_err(|e| backend_error(streams, e))?;
    Ok(Trimmed { removed })
}

// ---------------------------------------------------------------- HTTP

/// The path parameters of a stream route, as sent (checked by the handler).
pub struct StreamPath(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for StreamPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map(|Path(params)| StreamPath(params))
            .map_err(|rejection| ApiError::invalid("path", rejection.body_text()))
    }
}

impl StreamPath {
    fn param(&self, name: &str) -> &str {
        self.0.get(name).map_or("", String::as_str)
    }

    /// The stream, checked; 404 when `principal` does not see its tenant.
    fn visible_key(&self, principal: &Principal) -> Result<StreamKey, ApiError> {
        let key = stream_key(self.param("tenant"), self.param("stream"))?;
        if !principal.tenants.allows(key.tenant()) {
            return Err(ApiError::not_found(
                format!("no stream {key}"),
                Some("stream".into()),
            ));
        }
        Ok(key)
    }

    fn group(&self) -> Result<String, ApiError> {
        let group = self.param("group");
        validate_name("group", group)?;
        Ok(group.to_owned())
    }

    fn consumer(&self) -> Result<String, ApiError> {
        let consumer = self.param("consumer");
        validate_name("consumer", consumer)?;
        Ok(consumer.to_owned())
    }
}

/// The routes under `/v1/streams`; appends take bodies up to `append_limit`
/// bytes, the others up to `other_limit`.
pub(crate) fn routes(append_limit: usize, other_limit: usize) -> OpenApiRouter<ApiState> {
    let limit = |bytes: usize| axum::extract::DefaultBodyLimit::max(bytes.max(1));
    OpenApiRouter::new()
        .routes(routes!(append_entries, list_entries))
        .layer(limit(append_limit))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(list_streams))
                .routes(routes!(trim_stream))
                .routes(routes!(create_group))
                .routes(routes!(read_group))
                .routes(routes!(ack_entries))
                .routes(routes!(claim_entries))
                .routes(routes!(list_pending))
                .routes(routes!(list_consumers))
                .routes(routes!(remove_consumer))
                .layer(limit(other_limit)),
        )
}

/// The streams of the token's tenants (or of `tenant`) with their
/// consumer groups, by tenant then stream in byte order, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/streams",
    tag = "streams",
    params(StreamListQuery),
    responses(
        (status = 200, body = StreamPageView),
        (status = 400, description = "The cursor is not one of this list's", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role, or another tenant (`tenant`)", body = ErrorBody),
        (status = 404, description = "This daemon has no stream backend", body = ErrorBody),
        (status = 422, description = "A bad query parameter (named)", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_streams(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    ApiQuery(query): ApiQuery<StreamListQuery>,
) -> Result<Json<StreamPageView>, ApiError> {
    let tenants = crate::api::listing_tenants(&principal, query.tenant)?;
    let limit = page_limit(query.limit)?;
    let after = cursor::decode_optional::<StreamKey>(query.cursor.as_deref())?;
    Ok(Json(list(state.streams()?, tenants, after, limit).await?))
}

/// Append entries, all or nothing.
#[utoipa::path(
    post,
    path = "/v1/streams/{tenant}/{stream}/entries",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("traceparent" = Option<String>, Header, description = TRACEPARENT_DOC),
        ("tracestate" = Option<String>, Header, description = "W3C `tracestate`, kept with `traceparent`"),
    ),
    request_body = AppendRequest,
    responses(
        (status = 201, description = "Appended", body = AppendResponse),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `publish` role, or another tenant", body = ErrorBody),
        (status = 413, description = "Body or a payload over the limit (`entries[i].payload`)", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "A field is refused; nothing appended", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn append_entries(
    State(state): State<ApiState>,
    Publisher(principal): Publisher,
    path: StreamPath,
    headers: HeaderMap,
    ApiJson(request): ApiJson<AppendRequest>,
) -> Result<(StatusCode, Json<AppendResponse>), ApiError> {
    let key = stream_key(path.param("tenant"), path.param("stream"))?;
    principal.require_tenant(key.tenant(), "tenant")?;
    let response = append(
        state.streams()?,
        key,
        request,
        state.max_payload_bytes(),
        request_trace_context(&headers),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(response)))
}

/// Entries above `after`, in id order, outside any group.
#[utoipa::path(
    get,
    path = "/v1/streams/{tenant}/{stream}/entries",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        RangeQuery,
    ),
    responses(
        (status = 200, body = EntryList),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "Another tenant's stream", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_entries(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    path: StreamPath,
    ApiQuery(query): ApiQuery<RangeQuery>,
) -> Result<Json<EntryList>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(range(state.streams()?, key, query).await?))
}

/// Remove the oldest entries: keep `max_len`, or the entries at or above `min_id`.
#[utoipa::path(
    post,
    path = "/v1/streams/{tenant}/{stream}/trim",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
    ),
    request_body = TrimRequest,
    responses(
        (status = 200, body = Trimmed),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role", body = ErrorBody),
        (status = 404, description = "Another tenant's stream", body = ErrorBody),
        (status = 422, description = "Both or neither bound, or a bad id", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn trim_stream(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    path: StreamPath,
    ApiJson(request): ApiJson<TrimRequest>,
) -> Result<Json<Trimmed>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(trim(state.streams()?, key, request).await?))
}

/// Create a consumer group (and the stream) unless it exists.
#[utoipa::path(
    put,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
    ),
    request_body = GroupRequest,
    responses(
        (status = 201, description = "Created", body = GroupView),
        (status = 200, description = "It existed; unchanged", body = GroupView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role", body = ErrorBody),
        (status = 404, description = "Another tenant's stream", body = ErrorBody),
        (status = 422, description = "A bad name or start", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_group(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    path: StreamPath,
    ApiJson(request): ApiJson<GroupRequest>,
) -> Result<Response, ApiError> {
    let key = path.visible_key(&principal)?;
    let view = ensure_group(state.streams()?, key, path.group()?, request).await?;
    let status = if view.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

/// Read entries the group has not handed out, for one consumer.
#[utoipa::path(
    post,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/read",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
    ),
    request_body = ReadRequest,
    responses(
        (status = 200, description = "Entries, now pending for the consumer (none when a wait ended empty)", body = DeliveredList),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `consume` role", body = ErrorBody),
        (status = 404, description = "No such group, or another tenant's stream", body = ErrorBody),
        (status = 422, description = "A field is refused", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn read_group(
    State(state): State<ApiState>,
    Consumer(principal): Consumer,
    path: StreamPath,
    ApiJson(request): ApiJson<ReadRequest>,
) -> Result<Json<DeliveredList>, ApiError> {
    let key = path.visible_key(&principal)?;
    let group = path.group()?;
    let stop = state.shutdown_token();
    Ok(Json(
        read(
            state.streams()?,
            key,
            group,
            request,
            state.max_block(),
            &stop,
        )
        .await?,
    ))
}

/// Acknowledge entries: they leave the group's pending lists.
#[utoipa::path(
    post,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/ack",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
    ),
    request_body = AckRequest,
    responses(
        (status = 200, body = Acked),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `consume` role", body = ErrorBody),
        (status = 404, description = "No such group, or another tenant's stream", body = ErrorBody),
        (status = 422, description = "A bad id (`ids[i]`) or count", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn ack_entries(
    State(state): State<ApiState>,
    Consumer(principal): Consumer,
    path: StreamPath,
    ApiJson(request): ApiJson<AckRequest>,
) -> Result<Json<Acked>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(
        ack(state.streams()?, key, path.group()?, request).await?,
    ))
}

/// Take over entries idle in the group's pending lists.
#[utoipa::path(
    post,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/claim",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
    ),
    request_body = ClaimRequest,
    responses(
        (status = 200, body = ClaimView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `consume` role", body = ErrorBody),
        (status = 404, description = "No such group, or another tenant's stream", body = ErrorBody),
        (status = 422, description = "A field is refused", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn claim_entries(
    State(state): State<ApiState>,
    Consumer(principal): Consumer,
    path: StreamPath,
    ApiJson(request): ApiJson<ClaimRequest>,
) -> Result<Json<ClaimView>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(
        claim(state.streams()?, key, path.group()?, request).await?,
    ))
}

/// The group's pending entries: a summary and a page.
#[utoipa::path(
    get,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/pending",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
        PendingParams,
    ),
    responses(
        (status = 200, body = PendingView),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "No such group, or another tenant's stream", body = ErrorBody),
        (status = 422, description = "A parameter is refused", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_pending(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    path: StreamPath,
    ApiQuery(params): ApiQuery<PendingParams>,
) -> Result<Json<PendingView>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(
        pending(state.streams()?, key, path.group()?, params).await?,
    ))
}

/// The group's consumers with their pending counts and idle times.
#[utoipa::path(
    get,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/consumers",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
    ),
    responses(
        (status = 200, body = ConsumerList),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `read` role", body = ErrorBody),
        (status = 404, description = "No such group, or another tenant's stream", body = ErrorBody),
        (status = 422, description = "A bad tenant, stream or group name (named)", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_consumers(
    State(state): State<ApiState>,
    Reader(principal): Reader,
    path: StreamPath,
) -> Result<Json<ConsumerList>, ApiError> {
    let key = path.visible_key(&principal)?;
    Ok(Json(consumers(state.streams()?, key, path.group()?).await?))
}

/// Delete a consumer that has no pending entries.
#[utoipa::path(
    delete,
    path = "/v1/streams/{tenant}/{stream}/groups/{group}/consumers/{consumer}",
    tag = "streams",
    params(
        ("tenant" = String, Path, description = "The stream's tenant"),
        ("stream" = String, Path, description = "The stream"),
        ("group" = String, Path, description = "The group"),
        ("consumer" = String, Path, description = "The consumer"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "No `admin` role", body = ErrorBody),
        (status = 404, description = "No such group or consumer, or another tenant's stream", body = ErrorBody),
        (status = 409, description = "The consumer has pending entries (the message says how many)", body = ErrorBody),
        (status = 422, description = "A bad name", body = ErrorBody),
        (status = 503, description = "The stream backend is unreachable; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn remove_consumer(
    State(state): State<ApiState>,
    Admin(principal): Admin,
    path: StreamPath,
) -> Result<StatusCode, ApiError> {
    let key = path.visible_key(&principal)?;
    delete_consumer(state.streams()?, key, path.group()?, path.consumer()?).await?;
    Ok(StatusCode::NO_CONTENT)
}
