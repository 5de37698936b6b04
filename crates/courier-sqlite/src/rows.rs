//! Decoding SQLite rows into Courier's types.
//!
//! SQLite keeps ids as UUID text, times as integer milliseconds since the Unix
//! epoch and JSON as text; everything that does not parse is a
//! [`StoreError::Corrupt`] naming the column, never a panic.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use courier_core::{
    ClaimedDelivery, DeadLetter, EntryOrigin, ErrorEntry, StoreError, StoredMessage, StreamEntry,
    StreamEntryId,
};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::map;

/// A column read as its Rust type, with driver errors mapped.
pub(crate) fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(column).map_err(map)
}

/// A UUID stored as text.
pub(crate) fn uuid(row: &SqliteRow, column: &str) -> Result<Uuid, StoreError> {
    let text: String = get(row, column)?;
    parse_uuid(column, &text)
}

fn parse_uuid(column: &str, text: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text).map_err(|e| StoreError::Corrupt(format!("{column} {text:?}: {e}")))
}

/// A time stored as integer milliseconds since the Unix epoch.
pub(crate) fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    let millis: i64 = get(row, column)?;
    from_millis(column, millis)
}

/// A nullable time stored as integer milliseconds since the Unix epoch.
pub(crate) fn optional_time(
    row: &SqliteRow,
    column: &str,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let millis: Option<i64> = get(row, column)?;
    millis.map(|millis| from_millis(column, millis)).transpose()
}

/// `at` as the integer milliseconds the tables store, rounded up: a stored
/// time `t` is at or after `at` exactly when `t >= millis_ceil(at)`, and
/// before it exactly when `t < millis_ceil(at)`, so half-open bounds stay
/// exact for instants finer than a millisecond.
pub(crate) fn millis_ceil(at: DateTime<Utc>) -> i64 {
    let floor = at.timestamp_millis();
    if at.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        floor
    } else {
        floor.saturating_add(1)
    }
}

pub(crate) fn from_millis(column: &str, millis: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(millis)
        .ok_or_else(|| StoreError::Corrupt(format!("{column}: {millis} ms is out of range")))
}

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

/// A row of `claim.sql`, or `None` when its message is gone (deleted by hand):
/// as in PostgreSQL, such a delivery is not handed out; its lease expires and
/// the rescuer returns it until it is dead-lettered.
pub(crate) fn claimed(
    row: &SqliteRow,
    subscription: &str,
) -> Result<Option<ClaimedDelivery>, StoreError> {
    let Some(payload) = get::<Option<String>>(row, "payload")? else {
        return Ok(None);
    };
    let headers: String = get(row, "headers")?;
    Ok(Some(ClaimedDelivery {
        delivery_id: get(row, "id")?,
        message_id: uuid(row, "message_id")?,
        subscription: subscription.to_owned(),
        tenant: get(row, "tenant")?,
        topic: get(row, "topic")?,
        schema_version: get(row, "schema_version")?,
        ordering_key: get(row, "ordering_key")?,
        priority: get(row, "priority")?,
        payload,
        headers: parse_headers(&headers)?,
        attempt: get(row, "attempts")?,
        max_attempts: get(row, "max_attempts")?,
        lease_token: uuid(row, "lease_token")?,
        lease_expires_at: time(row, "lease_expires_at")?,
        occurred_at: time(row, "occurred_at")?,
        enqueued_at: time(row, "created_at")?,
    }))
}

/// A row of `dead_letters_list.sql` or `dead_letter_get.sql`.
pub(crate) fn dead_letter(row: &SqliteRow) -> Result<DeadLetter, StoreError> {
    let errors: String = get(row, "errors")?;
    Ok(DeadLetter {
        delivery_id: get(row, "id")?,
        message_id: uuid(row, "message_id")?,
        subscription: get(row, "subscription")?,
        tenant: get(row, "tenant")?,
        topic: get(row, "topic")?,
        schema_version: get(row, "schema_version")?,
        payload: get(row, "payload")?,
        attempts: get(row, "attempts")?,
        errors: parse_errors(&errors)?,
        dead_at: optional_time(row, "dead_at")?,
        enqueued_at: time(row, "created_at")?,
    })
}

/// A row of `message_get.sql` or `messages_list.sql`.
pub(crate) fn stored_message(row: &SqliteRow) -> Result<StoredMessage, StoreError> {
    let headers: String = get(row, "headers")?;
    Ok(StoredMessage {
        id: uuid(row, "id")?,
        tenant: get(row, "tenant")?,
        topic: get(row, "topic")?,
        schema_version: get(row, "schema_version")?,
        payload: get(row, "payload")?,
        headers: parse_headers(&headers)?,
        ordering_key: get(row, "ordering_key")?,
        idempotency_key: get(row, "idempotency_key")?,
        priority: get(row, "priority")?,
        occurred_at: time(row, "occurred_at")?,
        available_at: time(row, "available_at")?,
        enqueued_at: time(row, "created_at")?,
    })
}

/// A stream entry's id from its rowid `n`: `n-0`.
pub(crate) fn entry_id_of_rowid(rowid: i64) -> Result<StreamEntryId, StoreError> {
    u64::try_from(rowid)
        .map(|major| StreamEntryId::new(major, 0))
        .map_err(|_| StoreError::Corrupt(format!("{rowid} is not a stream entry id")))
}

/// A stream entry's id stored as its rowid.
pub(crate) fn entry_id(row: &SqliteRow, column: &str) -> Result<StreamEntryId, StoreError> {
    entry_id_of_rowid(get(row, column)?)
}

/// A row of `stream_entries_after.sql` or `stream_entries_get.sql`.
pub(crate) fn stream_entry(row: &SqliteRow) -> Result<StreamEntry, StoreError> {
    let payload: String = get(row, "payload")?;
    let headers: String = get(row, "headers")?;
    let origin = match get::<Option<String>>(row, "message_id")? {
        None => None,
        Some(message_id) => Some(EntryOrigin {
            message_id: parse_uuid("message_id", &message_id)?,
            tenant: get(row, "origin_tenant")?,
            topic: get(row, "topic")?,
            schema_version: get(row, "schema_version")?,
        }),
    };
    Ok(StreamEntry {
        id: entry_id(row, "id")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))?,
        headers: parse_headers(&headers)?,
        origin,
    })
}
