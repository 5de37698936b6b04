//! Decoding PostgreSQL rows into Courier's types.
//!
//! Payloads, headers and error histories come back as JSON text; anything that
//! does not parse is a [`StoreError::Corrupt`] naming the column, never a panic.

use std::collections::BTreeMap;

use courier_core::{
    ClaimedDelivery, DeadLetter, ErrorEntry, FailureApplied, StoreError, StoredMessage,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::map;

/// A headers object; non-string values (written by hand) become their JSON text.
pub(crate) fn parse_headers(text: &str) -> Result<BTreeMap<String, String>, StoreError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(StoreError::Corrupt("headers is not a JSON object".into()));
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

/// An error history.
pub(crate) fn parse_errors(text: &str) -> Result<Vec<ErrorEntry>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("errors: {e}")))
}

/// A row of `claim.sql` that claimed a delivery.
pub(crate) fn claimed_from_row(
    row: &PgRow,
    subscription: &str,
) -> Result<ClaimedDelivery, sqlx::Error> {
    let headers: String = row.try_get("headers")?;
    Ok(ClaimedDelivery {
        delivery_id: row.try_get("id")?,
        message_id: row.try_get("message_id")?,
        subscription: subscription.to_owned(),
        tenant: row.try_get("tenant")?,
        topic: row.try_get("topic")?,
        schema_version: row.try_get("schema_version")?,
        ordering_key: row.try_get("ordering_key")?,
        priority: row.try_get("priority")?,
        payload: row.try_get("payload")?,
        headers: parse_headers(&headers).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        attempt: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        lease_token: row.try_get("lease_token")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        occurred_at: row.try_get("occurred_at")?,
        enqueued_at: row.try_get("created_at")?,
    })
}

/// A row of `dead_letters_list.sql` or `dead_letter_get.sql`.
pub(crate) fn dead_letter_from_row(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let errors: String = row.try_get("errors").map_err(map)?;
    Ok(DeadLetter {
        delivery_id: row.try_get("id").map_err(map)?,
        message_id: row.try_get("message_id").map_err(map)?,
        subscription: row.try_get("subscription").map_err(map)?,
        tenant: row.try_get("tenant").map_err(map)?,
        topic: row.try_get("topic").map_err(map)?,
        schema_version: row.try_get("schema_version").map_err(map)?,
        payload: row.try_get("payload").map_err(map)?,
        attempts: row.try_get("attempts").map_err(map)?,
        errors: parse_errors(&errors)?,
        dead_at: row.try_get("dead_at").map_err(map)?,
        enqueued_at: row.try_get("created_at").map_err(map)?,
    })
}

/// The `(id, dead)` rows fail.sql and snooze.sql return.
pub(crate) fn failures_applied(rows: &[PgRow]) -> Result<Vec<FailureApplied>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok(FailureApplied {
                delivery_id: row.try_get("id")?,
                dead: row.try_get("dead")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(map)
}

/// A row of `message_get.sql` or `messages_list.sql`.
pub(crate) fn stored_message_from_row(row: &PgRow) -> Result<StoredMessage, StoreError> {
    let headers: String = row.try_get("headers").map_err(map)?;
    Ok(StoredMessage {
        id: row.try_get("id").map_err(map)?,
        tenant: row.try_get("tenant").map_err(map)?,
        topic: row.try_get("topic").map_err(map)?,
        schema_version: row.try_get("schema_version").map_err(map)?,
        payload: row.try_get("payload").map_err(map)?,
        headers: parse_headers(&headers)?,
        ordering_key: row.try_get("ordering_key").map_err(map)?,
        idempotency_key: row.try_get("idempotency_key").map_err(map)?,
        priority: row.try_get("priority").map_err(map)?,
        occurred_at: row.try_get("occurred_at").map_err(map)?,
        available_at: row.try_get("available_at").map_err(map)?,
        enqueued_at: row.try_get("created_at").map_err(map)?,
    })
}
