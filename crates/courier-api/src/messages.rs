//! The bodies of publishing (`POST /v1/messages`, `POST /v1/messages/batch`)
//! and the validation that turns a [`PublishRequest`] into a [`NewMessage`].

use chrono::{DateTime, Utc};
use courier_core::{validate_name, NewMessage, MAX_HOLD};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::RequestError;

/// A message to publish.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The owner: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
    pub tenant: String,
    /// The event type, same grammar.
    pub topic: String,
    /// The payload's schema version (≥ 1, default 1).
    pub schema_version: Option<i32>,
    /// The payload: any JSON value, at most `max_payload_bytes` of JSON
    /// text as sent. It is stored and delivered as sent, byte for byte (on
    /// PostgreSQL as `jsonb` keeps it: every number's digits, but not
    /// spacing, key order or duplicate keys).
    #[schema(schema_with = crate::any_json_value)]
    pub payload: Box<serde_json::value::RawValue>,
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
    /// 0 (the default) to 9: within its tenant's share of each claim, a
    /// higher priority is delivered first (tenants still take turns first).
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i16>,
}

impl PublishRequest {
    /// Validates the request into a message, exactly as `POST /v1/messages`
    /// does (the CLI's NDJSON publishing uses it too): names, payload size,
    /// headers, RFC 3339 `available_at`. The error names the field.
    pub fn into_message(self, max_payload_bytes: usize) -> Result<NewMessage, RequestError> {
        self.validate_into("", max_payload_bytes, MAX_HOLD, None)
    }

    /// Validates the request into a message as both publish routes do, with
    /// the fields it names under `prefix` (`messages[3].` in a batch):
    /// names, a payload of at most `max_payload_bytes` of JSON text as sent,
    /// headers, an RFC 3339 `available_at` at most `max_hold` ahead, and an
    /// `idempotency_key` equal to the `Idempotency-Key` header `header_key`
    /// when both are given.
    pub fn validate_into(
        self,
        prefix: &str,
        max_payload_bytes: usize,
        max_hold: std::time::Duration,
        header_key: Option<&str>,
    ) -> Result<NewMessage, RequestError> {
        let field = |name: &str| format!("{prefix}{name}");
        validate_name("tenant", &self.tenant)
            .map_err(|e| RequestError::from_validation(prefix, e))?;
        validate_name("topic", &self.topic)
            .map_err(|e| RequestError::from_validation(prefix, e))?;
        let payload = String::from(Box::<str>::from(self.payload));
        if payload.len() > max_payload_bytes {
            return Err(RequestError::too_large(
                field("payload"),
                format!(
                    "is {} bytes of JSON; the limit is {max_payload_bytes}",
                    payload.len()
                ),
            ));
        }
        let mut message = NewMessage::from_json_text(self.tenant, self.topic, payload)
            .map_err(|e| RequestError::from_validation(prefix, e))?;
        if let Some(version) = self.schema_version {
            message = message.with_schema_version(version);
        }
        match self.headers {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(headers)) => {
                for (name, value) in headers {
                    match value {
                        serde_json::Value::String(value) => {
                            message = message.with_header(name, value);
                        }
                        other => {
                            return Err(RequestError::invalid(
                                format!("{}.{name}", field("headers")),
                                format!("header values must be strings, got {other}"),
                            ))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(RequestError::invalid(
                    field("headers"),
                    format!("must be a JSON object of string values, got {other}"),
                ))
            }
        }
        if let Some(key) = self.ordering_key {
            message = message.with_ordering_key(key);
        }
        if let Some(priority) = self.priority {
            message = message.with_priority(priority);
        }
        let key = match (self.idempotency_key, header_key) {
            (Some(body), Some(header)) if body != header => {
                return Err(RequestError::invalid(
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
        if let Some(at) = self.available_at {
            let at = DateTime::parse_from_rfc3339(&at).map_err(|e| {
                RequestError::invalid(
                    field("available_at"),
                    format!("{at:?} is not an RFC 3339 time such as 2026-01-02T03:04:05Z: {e}"),
                )
            })?;
            message = message.available_at(at.with_timezone(&Utc));
        }
        message
            .validate()
            .and_then(|()| message.validate_hold(max_hold))
            .map_err(|e| RequestError::from_validation(prefix, e))?;
        Ok(message)
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
#[derive(Debug, Serialize, Deserialize, ToSchema)]
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
