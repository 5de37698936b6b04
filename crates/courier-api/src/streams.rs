//! The request bodies and query parameters of the streams API under
//! `/v1/streams/{tenant}/{stream}`. They are plain data: the daemon's
//! operations (`courier_server::stream_api`) validate them, naming the field.

use std::collections::BTreeMap;

use courier_core::StreamEntryId;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// An entry to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEntry {
    /// Any JSON value, at most `max_payload_bytes` as compact text.
    #[schema(schema_with = crate::any_json_value)]
    pub payload: serde_json::Value,
    /// String headers (at most 64; names 1 to 128 bytes, values at most 4 KiB).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Entries to append, in order, all or nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendRequest {
    /// 1 to 10,000 entries.
    pub entries: Vec<AppendEntry>,
}

/// `GET …/entries`: entries above `after`, outside any group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RangeQuery {
    /// Only entries above this id (default `0-0`: from the start).
    #[param(value_type = Option<String>)]
    pub after: Option<StreamEntryId>,
    /// At most this many, 1 to 10,000 (default 100).
    pub count: Option<usize>,
}

/// `PUT …/groups/{group}`: where a new group starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupRequest {
    /// `end` (default: only entries appended from now), `beginning`, or an
    /// entry id (the entries after it).
    pub start: Option<String>,
}

/// `POST …/groups/{group}/read`: new entries for a consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    /// The consumer reading (created on first use).
    pub consumer: String,
    /// At most this many, 1 to 10,000 (default 100).
    pub count: Option<usize>,
    /// Wait up to this long (at most 30,000) for an entry when none is ready;
    /// returns as soon as one arrives. Absent or 0: answer at once.
    pub block_ms: Option<u64>,
}

/// `POST …/groups/{group}/ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// 1 to 10,000 entry ids.
    #[schema(value_type = Vec<String>)]
    pub ids: Vec<StreamEntryId>,
}

/// `POST …/groups/{group}/claim`: take over entries idle in the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The consumer taking the entries over (created on first use).
    pub consumer: String,
    /// Only entries not delivered for at least this long (backend clock; at
    /// most a year).
    pub min_idle_ms: u64,
    /// Scan from this id (default `0-0`: the start); pass the answer's `next`.
    #[schema(value_type = Option<String>)]
    pub cursor: Option<StreamEntryId>,
    /// At most this many, 1 to 10,000 (default 100).
    pub count: Option<usize>,
}

/// `GET …/groups/{group}/pending`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PendingParams {
    /// Only entries above this id (default `0-0`).
    #[param(value_type = Option<String>)]
    pub after: Option<StreamEntryId>,
    /// At most this many, 1 to 10,000 (default 100).
    pub count: Option<usize>,
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only entries idle at least this long.
    pub min_idle_ms: Option<u64>,
}

/// `POST …/trim`: exactly one of `max_len` and `min_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrimRequest {
    /// Keep the newest this many entries.
    pub max_len: Option<u64>,
    /// Keep the entries at or above this id.
    #[schema(value_type = Option<String>)]
    pub min_id: Option<StreamEntryId>,
}
