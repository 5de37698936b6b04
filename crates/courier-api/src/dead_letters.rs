//! The bodies of dead-letter retry and discard
//! (`POST /v1/dead-letters/retry`, `POST /v1/dead-letters/discard`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Which dead letters to retry or discard: `ids`, or a `filter`, not both.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilterBody {
    /// Only this tenant's; required for a token scoped to several tenants.
    pub tenant: Option<String>,
    /// Only this topic's.
    pub topic: Option<String>,
    /// Only this subscription's.
    pub subscription: Option<String>,
    /// Only this message's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    /// Only those dead-lettered at or after this instant (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_after: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant (RFC 3339); after
    /// `dead_after` when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_before: Option<DateTime<Utc>>,
    /// Only those whose last failure has this fingerprint (16 hex digits, as
    /// `GET /v1/dead-letters/groups` shows, or `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

impl From<DeadLetterFilterBody> for courier_core::DeadLetterFilter {
    /// The same fields, unchecked (see [`DeadLetterFilter::validate`](courier_core::DeadLetterFilter::validate)).
    fn from(body: DeadLetterFilterBody) -> Self {
        Self {
            tenant: body.tenant,
            topic: body.topic,
            subscription: body.subscription,
            message_id: body.message_id,
            dead_after: body.dead_after,
            dead_before: body.dead_before,
            fingerprint: body.fingerprint,
        }
    }
}

/// How many were affected (or, in a dry run, would be).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Affected {
    /// The count.
    pub affected: u64,
    /// Present and `true` for a dry run: nothing was changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// In a dry run, the first 100 matching delivery ids, oldest dead letter
    /// first (the listing's order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<i64>>,
}
