//! Messages as producers write them and as handlers receive them.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{validate_name, ValidationError};

/// The largest payload Courier stores, in bytes of JSON text (1 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The longest error message kept in a delivery's history, in characters.
pub const MAX_ERROR_CHARS: usize = 2000;

/// The longest ordering or idempotency key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// The most headers one message may carry.
pub const MAX_HEADERS: usize = 64;

/// A message a producer is about to enqueue.
///
/// Built with [`NewMessage::new`] (which validates tenant, topic and payload)
/// and refined with the `with_*` methods. The id is a UUIDv7 made here, on the
/// client, so the producer knows it before the transaction commits.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// The message id (UUIDv7 unless the producer chose another).
    pub id: Uuid,
    /// The owner of the message.
    pub tenant: String,
    /// The event type.
    pub topic: String,
    /// The payload's schema version (≥ 1).
    pub schema_version: i32,
    /// The payload as JSON text.
    pub payload: String,
    /// String headers carried beside the payload.
    pub headers: BTreeMap<String, String>,
    /// Messages sharing (tenant, ordering key) are delivered one at a time in enqueue order.
    pub ordering_key: Option<String>,
    /// A second enqueue with the same (tenant, idempotency key) stores nothing.
    pub idempotency_key: Option<String>,
    /// When the event happened, by the producer's clock.
    pub occurred_at: DateTime<Utc>,
    /// When the message may first be delivered.
    pub available: Availability,
    /// How urgent it is, [`MIN_PRIORITY`] (the default) to [`MAX_PRIORITY`]:
    /// within its tenant's share of each claim, a higher priority is claimed
    /// first; tenants still take turns first.
    pub priority: i16,
}

/// When a new message becomes deliverable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Availability {
    /// As soon as the producer's transaction commits.
    #[default]
    Now,
    /// At this instant.
    At(DateTime<Utc>),
    /// This long after the enqueue, measured by the database clock.
    After(Duration),
}

impl NewMessage {
    /// A message for `tenant` on `topic` (schema version 1) carrying `payload` as JSON.
    pub fn new<T: Serialize + ?Sized>(
        tenant: impl Into<String>,
        topic: impl Into<String>,
        payload: &T,
    ) -> Result<Self, ValidationError> {
        let payload = serde_json::to_string(payload)
            .map_err(|e| ValidationError::new("payload", format!("is not serializable: {e}")))?;
        Self::from_json_text(tenant, topic, payload)
    }

    /// A message whose payload is already JSON text; the text is checked to be JSON.
    pub fn from_json_text(
        tenant: impl Into<String>,
        topic: impl Into<String>,
        payload: impl Into<String>,
    ) -> Result<Self, ValidationError> {
        let message = Self {
            id: Uuid::now_v7(),
            tenant: tenant.into(),
            topic: topic.into(),
            schema_version: 1,
            payload: payload.into(),
            headers: BTreeMap::new(),
            ordering_key: None,
            idempotency_key: None,
            occurred_at: Utc::now(),
            available: Availability::Now,
            priority: MIN_PRIORITY,
        };
        validate_name("tenant", &message.tenant)?;
        validate_name("topic", &message.topic)?;
        if message.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(ValidationError::new(
                "payload",
                format!(
                    "is {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                    message.payload.len()
                ),
            ));
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&message.payload)
            .map_err(|e| ValidationError::new("payload", format!("is not valid JSON: {e}")))?;
        Ok(message)
    }

    /// Sets the payload's schema version (≥ 1).
    pub fn with_schema_version(mut self, version: i32) -> Self {
        self.schema_version = version;
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets the ordering key.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets the idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Holds the message until `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available = Availability::At(at);
        self
    }

    /// Holds the message for `delay` after the enqueue (database clock).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.available = Availability::After(delay);
        self
    }

    /// Sets the priority, [`MIN_PRIORITY`] (the default) to [`MAX_PRIORITY`];
    /// higher is claimed first within its tenant's share of each claim.
    /// [`NewMessage::validate`] refuses a value outside that range.
    pub fn with_priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the id (the default is a fresh UUIDv7).
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// Sets when the event happened (the default is now, by this process's clock).
    pub fn with_occurred_at(mut self, at: DateTime<Utc>) -> Self {
        self.occurred_at = at;
        self
    }

    /// Checks every field; backends call this before storing anything.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name("tenant", &self.tenant)?;
        validate_name("topic", &self.topic)?;
        if self.schema_version < 1 {
            return Err(ValidationError::new(
                "schema_version",
                format!("must be at least 1, got {}", self.schema_version),
            ));
        }
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(ValidationError::new(
                "payload",
                format!(
                    "is {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                    self.payload.len()
                ),
            ));
        }
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(ValidationError::new(
                "priority",
                format!(
                    "must be between {MIN_PRIORITY} and {MAX_PRIORITY} (higher is delivered first), got {}",
                    self.priority
                ),
            ));
        }
        validate_key("ordering_key", self.ordering_key.as_deref())?;
        validate_key("idempotency_key", self.idempotency_key.as_deref())?;
        if self.headers.len() > MAX_HEADERS {
            return Err(ValidationError::new(
                "headers",
                format!(
                    "has {} entries; the limit is {MAX_HEADERS}",
                    self.headers.len()
                ),
            ));
        }
        for (name, value) in &self.headers {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    "headers",
                    format!(
                        "header name {name:?} must be 1 to 128 bytes without control characters"
                    ),
                ));
            }
            if value.len() > 4096 {
                return Err(ValidationError::new(
                    "headers",
                    format!(
                        "header {name:?} is {} bytes; the limit is 4096",
                        value.len()
                    ),
                ));
            }
            if value.contains('\0') {
                return Err(ValidationError::new(
                    "headers",
                    format!("header {name:?} contains U+0000, which no backend stores alike"),
                ));
            }
        }
        refuse_nul_in_payload(&self.payload)?;
        self.validate_hold(MAX_HOLD)
    }

    /// Checks that the message is not held (its delay, or its
    /// `available_at`) more than `max` ahead; [`NewMessage::validate`]
    /// checks [`MAX_HOLD`], a daemon may set a shorter bound. The error
    /// (field `available_at`) states the bound in days.
    pub fn validate_hold(&self, max: Duration) -> Result<(), ValidationError> {
        let too_far = || {
            let days = max.as_secs() / 86_400;
            let bound = if days > 0 {
                format!("{days} days")
            } else {
                format!("{} s", max.as_secs())
            };
            ValidationError::new(
                "available_at",
                format!("is more than {bound} ahead (the most a message may be held)"),
            )
        };
        match self.available {
            Availability::Now => {}
            Availability::After(delay) => {
                if delay > max {
                    return Err(too_far());
                }
            }
            Availability::At(at) => {
                let limit = chrono::Duration::from_std(max).unwrap_or(chrono::Duration::MAX);
                if at > Utc::now() + limit {
                    return Err(too_far());
                }
            }
        }
        Ok(())
    }

    /// The headers as a JSON object's text.
    pub fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// The lowest (and default) priority: most messages have it.
pub const MIN_PRIORITY: i16 = 0;

/// The highest priority; within a tenant's share of a claim, higher is
/// claimed first.
pub const MAX_PRIORITY: i16 = 9;

/// The longest a new message may be held before its first delivery: with an
/// ordering key, a message held longer would hold back its key as long.
pub const MAX_HOLD: Duration = Duration::from_secs(366 * 24 * 3600);

/// Refuses a payload holding U+0000 (as the escape `\u0000`) in a string or a
/// key: PostgreSQL's `jsonb` cannot store it and SQLite would, so one message
/// must not store on one backend and fail on the other.
fn refuse_nul_in_payload(payload: &str) -> Result<(), ValidationError> {
    // Valid JSON can carry U+0000 only escaped: payloads without the escape
    // are not parsed again.
    if !payload.contains("\\u0000") {
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_str(payload)
        .map_err(|e| ValidationError::new("payload", format!("is not valid JSON: {e}")))?;
    if holds_nul(&value) {
        return Err(ValidationError::new(
            "payload",
            "contains U+0000 (\\u0000) in a string or key, which PostgreSQL cannot store",
        ));
    }
    Ok(())
}

pub(crate) fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => text.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(fields) => fields
            .iter()
            .any(|(name, value)| name.contains('\0') || holds_nul(value)),
        _ => false,
    }
}

fn validate_key(field: &'static str, key: Option<&str>) -> Result<(), ValidationError> {
    let Some(key) = key else { return Ok(()) };
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(ValidationError::new(
            field,
            format!("must be 1 to {MAX_KEY_BYTES} bytes, got {}", key.len()),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EnqueueOutcome {
    /// The stored message's id: the new one, or the first message's id for a duplicate.
    pub id: Uuid,
    /// Whether an earlier message with the same (tenant, idempotency key) was found
    /// and nothing new was stored.
    pub duplicate: bool,
}

/// The outcome of each message of a batch insert, in input order, given the
/// ids the insert stored and, for the skipped ones, the ids already stored
/// under their (tenant, idempotency key). A key repeated within the batch
/// points at its first occurrence. Backends share this so their answers agree.
pub fn enqueue_outcomes(
    messages: &[NewMessage],
    inserted: &std::collections::HashSet<Uuid>,
    existing: &std::collections::HashMap<(String, String), Uuid>,
) -> Result<Vec<EnqueueOutcome>, crate::StoreError> {
    let mut seen_in_batch: std::collections::HashMap<(&str, &str), Uuid> =
        std::collections::HashMap::new();
    messages
        .iter()
        .map(|m| {
            if inserted.contains(&m.id) {
                if let Some(key) = m.idempotency_key.as_deref() {
                    seen_in_batch.insert((m.tenant.as_str(), key), m.id);
                }
                return Ok(EnqueueOutcome {
                    id: m.id,
                    duplicate: false,
                });
            }
            let key = m.idempotency_key.as_deref().ok_or_else(|| {
                crate::StoreError::Corrupt(format!("message {} was not inserted", m.id))
            })?;
            let first = seen_in_batch
                .get(&(m.tenant.as_str(), key))
                .copied()
                .or_else(|| existing.get(&(m.tenant.clone(), key.to_owned())).copied())
                .ok_or_else(|| {
                    crate::StoreError::Corrupt(format!(
                        "idempotency key {key:?} conflicted but no message holds it"
                    ))
                })?;
            Ok(EnqueueOutcome {
                id: first,
                duplicate: true,
            })
        })
        .collect()
}

/// One claimed (message, subscription) pair, under a lease.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    /// The delivery's id (one per message and subscription).
    pub delivery_id: i64,
    /// The message id.
    pub message_id: Uuid,
    /// The subscription this delivery belongs to.
    pub subscription: String,
    /// The message's tenant.
    pub tenant: String,
    /// The message's topic.
    pub topic: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The message's priority ([`MIN_PRIORITY`] to [`MAX_PRIORITY`]).
    pub priority: i16,
    /// The payload as JSON text.
    pub payload: String,
    /// The headers.
    pub headers: BTreeMap<String, String>,
    /// This attempt's number, starting at 1.
    pub attempt: i32,
    /// The attempt after which a failure dead-letters the delivery.
    pub max_attempts: i32,
    /// The token every write about this claim must present.
    pub lease_token: Uuid,
    /// When the lease runs out (database clock).
    pub lease_expires_at: DateTime<Utc>,
    /// When the event happened (producer clock).
    pub occurred_at: DateTime<Utc>,
    /// When the message was enqueued (database clock).
    pub enqueued_at: DateTime<Utc>,
}

impl ClaimedDelivery {
    /// The reference that fences writes about this claim.
    pub fn lease(&self) -> crate::LeaseRef {
        crate::LeaseRef {
            delivery_id: self.delivery_id,
            lease_token: self.lease_token,
        }
    }
}

/// A message as a handler receives it, with its payload decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<T> {
    /// The message id; also the idempotency key for effects outside the database.
    pub id: Uuid,
    /// The tenant.
    pub tenant: String,
    /// The topic.
    pub topic: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// The decoded payload.
    pub payload: T,
    /// The headers.
    pub headers: BTreeMap<String, String>,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The message's priority ([`MIN_PRIORITY`] to [`MAX_PRIORITY`]).
    pub priority: i16,
    /// The subscription delivering it.
    pub subscription: String,
    /// This attempt's number, starting at 1.
    pub attempt: i32,
    /// When the event happened (producer clock).
    pub occurred_at: DateTime<Utc>,
    /// When the message was enqueued (database clock).
    pub enqueued_at: DateTime<Utc>,
}

impl<T> Message<T> {
    /// The key an effect outside the database should be made idempotent by: the
    /// message id, stable across every redelivery.
    pub fn idempotency_key(&self) -> Uuid {
        self.id
    }
}

/// One entry of a delivery's bounded error history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEntry {
    /// The attempt that failed.
    pub attempt: i32,
    /// When it failed (database clock).
    pub at: DateTime<Utc>,
    /// What went wrong, at most [`MAX_ERROR_CHARS`] characters.
    pub message: String,
}

/// Cuts `text` to at most `max_chars` characters, never inside a character.
pub fn truncate_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((byte_index, _)) => &text[..byte_index],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_nul_is_refused_but_an_escaped_backslash_before_u0000_is_not() {
        let refused = |payload: &str| {
            NewMessage::from_json_text("a", "t", payload)
                .and_then(|m| m.validate())
                .map_err(|e| e.field.to_string())
        };
        assert_eq!(refused(r#"{"s":"a\u0000b"}"#), Err("payload".to_owned()));
        assert_eq!(refused(r#"{"k\u0000":1}"#), Err("payload".to_owned()));
        assert_eq!(
            refused(r#"[[{"deep":["\u0000"]}]]"#),
            Err("payload".to_owned())
        );
        // A backslash, then the text u0000: no NUL.
        assert_eq!(refused(r#"{"s":"\\u0000"}"#), Ok(()));
        assert_eq!(refused(r#"{"s":"plain"}"#), Ok(()));
    }

    #[test]
    fn a_message_may_be_held_for_a_year_at_most() {
        let message = NewMessage::from_json_text("a", "t", "{}").map(|m| m.delay(MAX_HOLD));
        assert!(message.is_ok_and(|m| m.validate().is_ok()));
        let held = |m: NewMessage| m.validate().map_err(|e| e.field.to_string());
        let too_long = NewMessage::from_json_text("a", "t", "{}").map(|m| m.delay(MAX_HOLD * 2));
        assert_eq!(
            too_long.map(held).ok(),
            Some(Err("available_at".to_owned()))
        );
        let far = NewMessage::from_json_text("a", "t", "{}")
            .map(|m| m.available_at(Utc::now() + chrono::Duration::days(400)));
        assert_eq!(far.map(held).ok(), Some(Err("available_at".to_owned())));
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        let text = "é".repeat(2500);
        let cut = truncate_chars(&text, MAX_ERROR_CHARS);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert_eq!(cut.len(), 2 * MAX_ERROR_CHARS);
        assert_eq!(truncate_chars("short", 10), "short");
    }

    #[test]
    fn new_message_refuses_bad_fields() {
        assert_eq!(
            NewMessage::new("bad tenant", "t", &1).map_err(|e| e.field),
            Err("tenant")
        );
        assert_eq!(
            NewMessage::new("a", "t:x", &1).map_err(|e| e.field),
            Err("topic")
        );
        let big = "x".repeat(MAX_PAYLOAD_BYTES);
        assert_eq!(
            NewMessage::new("a", "t", &big).map_err(|e| e.field),
            Err("payload")
        );
        assert_eq!(
            NewMessage::from_json_text("a", "t", "{not json").map_err(|e| e.field),
            Err("payload")
        );
        let message = NewMessage::new("a", "t", &1)
            .map(|m| m.with_schema_version(0))
            .map(|m| m.validate().map_err(|e| e.field));
        assert_eq!(message, Ok(Err("schema_version")));
        let message = NewMessage::new("a", "t", &1)
            .map(|m| m.with_ordering_key(""))
            .map(|m| m.validate().map_err(|e| e.field));
        assert_eq!(message, Ok(Err("ordering_key")));
    }

    #[test]
    fn ids_are_uuid_v7() {
        let message = NewMessage::new("a", "t", &serde_json::json!({"k": 1}));
        assert_eq!(message.map(|m| m.id.get_version_num()), Ok(7));
    }
}
