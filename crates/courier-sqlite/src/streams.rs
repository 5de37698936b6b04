//! [`StreamStore`] for SQLite: native streams and consumer groups with
//! Redis Streams' semantics, in the four tables of `migrations/0005_streams.sql`.
//!
//! # The model
//!
//! An entry is a row of `stream_entries`; its id is its rowid `n`, written
//! `n-0`. The rowid is AUTOINCREMENT, so ids grow with every append and are
//! never reused, not even after a trim removed the newest entry (a group's
//! cursor may be past it). A group is a cursor (`stream_groups.last_id`, the
//! highest id it has handed out) plus its pending list (`stream_pending`,
//! one row per entry handed out and not acked: its consumer, when it was last
//! delivered and how often). A trim deletes entries and leaves pending rows
//! alone: re-reads report those entries deleted, and claims drop them.
//!
//! # Writes and time
//!
//! Every operation that writes more than one statement (append, read, re-read,
//! claim, delete a consumer, dead-letter) is one `BEGIN IMMEDIATE`
//! transaction taken in this process's write turn, so it is all or nothing
//! and nobody else reads, claims or acks between its statements. Acks, group
//! creation and trims are single autocommit statements. Idle times are the
//! database clock minus the stored delivery time, in milliseconds.
//!
//! # Blocking reads and how they fail
//!
//! A read with `block` that finds nothing waits for this store's (or a
//! clone's) next append, which bumps an in-process counter after it commits,
//! or for [`STREAM_POLL_INTERVAL`], whichever comes first; it then checks for
//! new entries without taking the write lock and reads them if there are
//! any. Appends by other processes are thus seen within one poll interval.
//! A read that loses its entries to another consumer keeps waiting until its
//! block ends. A process that dies mid-transaction leaves nothing behind
//! (SQLite rolls the transaction back); one that dies after reading leaves
//! its entries pending, for another consumer to claim once they are idle.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use courier_core::{
    dead_letter_entry, group_not_found, validate_count, validate_name, validate_tenants, ClaimIdle,
    ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry, GroupStart, GroupSummary,
    NewStreamEntry, PendingDetail, PendingEntry, PendingQuery, PendingSummary, ReadNew, StoreError,
    StreamEntry, StreamEntryId, StreamKey, StreamPage, StreamStore, StreamSummary, TrimBound,
    ValidationError, MAX_PAYLOAD_BYTES, MAX_STREAM_BATCH, MAX_STREAM_PAGE,
};
use serde_json::{json, Value};
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection};
use tokio::time::Instant;

use crate::error::map;
use crate::rows::{self, entry_id_of_rowid as entry_id, get};
use crate::{millis, queries, SqliteStore};

/// How long a blocked read waits at most before it looks again for entries
/// appended by another process (this process's appends wake it at once).
pub const STREAM_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The rowid bound for "above `id`": entry `n-0` is above `a-b` exactly when
/// `n > a`.
fn rowid_above(id: StreamEntryId) -> i64 {
    i64::try_from(id.major).unwrap_or(i64::MAX)
}

/// The rowid bound for "at or above `id`": entry `n-0` is at or above `a-0`
/// when `n >= a`, and at or above `a-b` (b > 0) when `n >= a + 1`.
fn rowid_from(id: StreamEntryId) -> i64 {
    let major = if id.minor == 0 {
        id.major
    } else {
        id.major.saturating_add(1)
    };
    i64::try_from(major).unwrap_or(i64::MAX)
}

/// The rowid of `id` when it can name one of this store's entries.
fn rowid(id: StreamEntryId) -> Option<i64> {
    if id.minor != 0 {
        return None;
    }
    i64::try_from(id.major).ok()
}

/// A batch size as the `LIMIT` it binds (counts are validated, at most
/// [`MAX_STREAM_BATCH`]).
fn limit(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Rowids as the JSON array the queries read with `json_each`.
fn rowids_json(rowids: impl IntoIterator<Item = i64>) -> String {
    Value::Array(rowids.into_iter().map(Value::from).collect()).to_string()
}

/// A stored count or millisecond duration, which is never negative.
fn non_negative(column: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column}: {value} is negative")))
}

/// A non-negative integer column.
fn unsigned(row: &SqliteRow, column: &str) -> Result<u64, StoreError> {
    non_negative(column, get(row, column)?)
}

/// Validates `entries` as an append takes them and encodes them
/// ([`encode_entries`]).
fn entries_json(entries: &[NewStreamEntry]) -> Result<String, StoreError> {
    encode_entries(entries, |entry, index| {
        entry.validate(index, MAX_PAYLOAD_BYTES)
    })
}

/// [`entries_json`] for one dead letter, held to a dead letter's limits
/// ([`NewStreamEntry::validate_dead_letter`]).
fn dead_letter_json(entry: &NewStreamEntry) -> Result<String, StoreError> {
    encode_entries(std::slice::from_ref(entry), |entry, _| {
        entry.validate_dead_letter()
    })
}

/// Validates each of `entries` with `validate` (given its index) and encodes
/// them as the JSON array `stream_append.sql` reads: `[payload, headers,
/// message_id, origin_tenant, topic, schema_version]` per entry.
fn encode_entries(
    entries: &[NewStreamEntry],
    validate: impl Fn(&NewStreamEntry, usize) -> Result<String, ValidationError>,
) -> Result<String, StoreError> {
    if entries.len() > MAX_STREAM_BATCH {
        return Err(ValidationError::new(
            "entries",
            format!(
                "has {} entries; the limit is {MAX_STREAM_BATCH}",
                entries.len()
            ),
        )
        .into());
    }
    let mut rows = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let payload = validate(entry, index)?;
        let headers = serde_json::to_string(&entry.headers)
            .map_err(|e| ValidationError::new("headers", format!("entries[{index}]: {e}")))?;
        let origin = entry.origin.as_ref();
        rows.push(json!([
            payload,
            headers,
            origin.map(|o| o.message_id.to_string()),
            origin.map(|o| o.tenant.as_str()),
            origin.map(|o| o.topic.as_str()),
            origin.map(|o| o.schema_version),
        ]));
    }
    Ok(Value::Array(rows).to_string())
}

/// The page `stream_list.sql`'s rows describe: one row per (stream, group),
/// in listing order, a stream without groups with NULL group columns.
fn stream_page(listed: &[SqliteRow]) -> Result<StreamPage, StoreError> {
    let mut page = StreamPage::default();
    let mut more = false;
    for row in listed {
        more = get(row, "more")?;
        let tenant: String = get(row, "tenant")?;
        let stream: String = get(row, "stream")?;
        let same = page
            .items
            .last()
            .is_some_and(|last| last.tenant == tenant && last.stream == stream);
        if !same {
            page.items.push(StreamSummary {
                tenant,
                stream,
                length: unsigned(row, "length")?,
                last_id: get::<Option<i64>>(row, "last_id")?
                    .map(entry_id)
                    .transpose()?,
                groups: Vec::new(),
            });
        }
        let Some(name) = get::<Option<String>>(row, "group_name")? else {
            continue;
        };
        let group = GroupSummary {
            name,
            consumers: unsigned(row, "consumers")?,
            pending: unsigned(row, "pending")?,
            last_delivered: rows::entry_id(row, "group_last_id")?,
            lag: Some(unsigned(row, "lag")?),
        };
        if let Some(summary) = page.items.last_mut() {
            summary.groups.push(group);
        }
    }
    if more {
        page.next = page
            .items
            .last()
            .map(|last| StreamKey::new(last.tenant.as_str(), last.stream.as_str()))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("a listed stream's name: {e}")))?;
    }
    Ok(page)
}

/// Rows of `stream_pending_reread.sql` or `stream_claim.sql`: (rowid,
/// deliveries), in id order.
fn delivered_rows(rows: &[SqliteRow]) -> Result<Vec<(i64, u64)>, StoreError> {
    let mut delivered = rows
        .iter()
        .map(|row| Ok((get::<i64>(row, "entry_id")?, unsigned(row, "deliveries")?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    delivered.sort_unstable();
    Ok(delivered)
}

/// The cursor of `group`, or [`StoreError::NotFound`] when `key` has no such
/// group.
async fn group_cursor<'e, E>(executor: E, key: &StreamKey, group: &str) -> Result<i64, StoreError>
where
    E: sqlx::Executor<'e, Database = Sqlite>,
{
    sqlx::query_scalar::<_, i64>(queries::STREAM_GROUP_CURSOR)
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .fetch_optional(executor)
        .await
        .map_err(map)?
        .ok_or_else(|| group_not_found(key, group))
}

/// Creates `consumer` of `group`, or marks it seen now.
async fn touch_consumer(
    conn: &mut SqliteConnection,
    key: &StreamKey,
    group: &str,
    consumer: &str,
) -> Result<(), StoreError> {
    sqlx::query(queries::STREAM_CONSUMER_TOUCH)
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .bind(consumer)
        .execute(conn)
        .await
        .map_err(map)?;
    Ok(())
}

/// Inserts `count` entries encoded by [`entries_json`]; returns their ids in
/// append order.
async fn insert_entries(
    conn: &mut SqliteConnection,
    key: &StreamKey,
    entries: String,
    count: usize,
) -> Result<Vec<StreamEntryId>, StoreError> {
    let returned = sqlx::query(queries::STREAM_APPEND)
        .bind(key.tenant())
        .bind(key.stream())
        .bind(entries)
        .fetch_all(conn)
        .await
        .map_err(map)?;
    let mut ids = returned
        .iter()
        .map(|row| rows::entry_id(row, "id"))
        .collect::<Result<Vec<_>, _>>()?;
    // Rows go in in array order with consecutive AUTOINCREMENT ids; only
    // RETURNING's order is unspecified.
    ids.sort_unstable();
    if ids.len() != count {
        return Err(StoreError::Corrupt(format!(
            "appended {} entries of {count}",
            ids.len()
        )));
    }
    Ok(ids)
}

/// The entries at `rowids` that still exist, by rowid.
async fn entries_by_rowid(
    conn: &mut SqliteConnection,
    key: &StreamKey,
    rowids: impl IntoIterator<Item = i64>,
) -> Result<HashMap<i64, StreamEntry>, StoreError> {
    let fetched = sqlx::query(queries::STREAM_ENTRIES_GET)
        .bind(key.tenant())
        .bind(key.stream())
        .bind(rowids_json(rowids))
        .fetch_all(conn)
        .await
        .map_err(map)?;
    let mut entries = HashMap::with_capacity(fetched.len());
    for row in &fetched {
        entries.insert(get::<i64>(row, "id")?, rows::stream_entry(row)?);
    }
    Ok(entries)
}

impl SqliteStore {
    /// Appends `entries` to `key` on the caller's connection, inside their
    /// transaction if one is open (start it with [`SqliteStore::begin`]):
    /// the entries commit or roll back with it, and no group sees them before
    /// it commits. Otherwise as [`StreamStore::append`]. This process's
    /// blocked readers are woken at once, perhaps before the commit: one that
    /// finds nothing yet sees the entries within [`STREAM_POLL_INTERVAL`].
    pub async fn append_on(
        &self,
        conn: &mut SqliteConnection,
        key: &StreamKey,
        entries: &[NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        // The current span's trace context goes with entries that carry none.
        let traced = courier_core::entries_with_current_context(entries);
        let entries: &[NewStreamEntry] = &traced;
        let encoded = entries_json(entries)?;
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let ids = insert_entries(conn, key, encoded, entries.len()).await?;
        self.wake_streams();
        Ok(ids)
    }

    /// The lowest entry of `key` that relays outbox message `message_id`
    /// (its origin's message id), if one committed or was appended earlier in
    /// the caller's transaction on `conn`; looked up by index.
    pub async fn relayed_entry_on(
        &self,
        conn: &mut SqliteConnection,
        key: &StreamKey,
        message_id: uuid::Uuid,
    ) -> Result<Option<StreamEntryId>, StoreError> {
        let rowid: Option<i64> = sqlx::query_scalar(queries::STREAM_RELAYED_ENTRY)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(message_id.to_string())
            .fetch_optional(conn)
            .await
            .map_err(map)?;
        rowid.map(entry_id).transpose()
    }

    fn wake_streams(&self) {
        self.inner
            .stream_wake
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// One non-blocking group read (see [`StreamStore::read_new`]), in one
    /// write transaction.
    async fn read_new_once(
        &self,
        key: &StreamKey,
        read: &ReadNew,
    ) -> Result<Vec<DeliveredEntry>, StoreError> {
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        let cursor = group_cursor(&mut *tx, key, &read.group).await?;
        let fetched = sqlx::query(queries::STREAM_ENTRIES_AFTER)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(cursor)
            .bind(limit(read.count))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let mut rowids = Vec::with_capacity(fetched.len());
        let mut entries = Vec::with_capacity(fetched.len());
        for row in &fetched {
            rowids.push(get::<i64>(row, "id")?);
            entries.push(rows::stream_entry(row)?);
        }
        touch_consumer(&mut tx, key, &read.group, &read.consumer).await?;
        if let Some(&last) = rowids.last() {
            sqlx::query(queries::STREAM_GROUP_ADVANCE)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(&read.group)
                .bind(last)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            sqlx::query(queries::STREAM_PENDING_INSERT)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(&read.group)
                .bind(&read.consumer)
                .bind(rowids_json(rowids))
                .execute(&mut *tx)
                .await
                .map_err(map)?;
        }
        tx.commit().await.map_err(map)?;
        Ok(entries
            .into_iter()
            .map(|entry| DeliveredEntry {
                entry,
                deliveries: 1,
            })
            .collect())
    }

    /// Whether `group` has entries above its cursor (read-only).
    async fn has_new(&self, key: &StreamKey, group: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar(queries::STREAM_HAS_NEW)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)
    }
}

impl SqliteStore {
    /// Runs `sql` (`STREAM_TOUCH`, `STREAM_UNCOUNT`: an UPDATE of the rows
    /// of `ids` pending to `consumer` in `group`) under the write turn,
    /// after checking the names and the count; returns the rows changed.
    async fn update_own_pending(
        &self,
        sql: &'static str,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        courier_core::validate_own_pending(group, consumer, ids)?;
        let rowids: Vec<i64> = ids.iter().copied().filter_map(rowid).collect();
        if rowids.is_empty() {
            return Ok(0);
        }
        let _turn = self.write_turn().await?;
        let updated = sqlx::query(sql)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .bind(rowids_json(rowids))
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected();
        Ok(updated)
    }
}

impl StreamStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn append<'c>(
        &'c self,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        // One to MAX_STREAM_BATCH entries, as on every backend.
        validate_count("entries", entries.len())?;
        // The current span's trace context goes with entries that carry none.
        let traced = courier_core::entries_with_current_context(entries);
        let entries: &[NewStreamEntry] = &traced;
        let encoded = entries_json(entries)?;
        let ids = {
            let _turn = self.write_turn().await?;
            let mut tx = self.begin().await?;
            let ids = insert_entries(&mut tx, key, encoded, entries.len()).await?;
            tx.commit().await.map_err(map)?;
            ids
        };
        self.wake_streams();
        Ok(ids)
    }

    async fn ensure_group<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        start: GroupStart,
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let cursor = match start {
            GroupStart::Beginning => Some(0),
            // NULL: the stream's newest entry, read by the insert itself.
            GroupStart::End => None,
            GroupStart::After(id) => Some(rowid_above(id)),
        };
        let _turn = self.write_turn().await?;
        let created = sqlx::query(queries::STREAM_GROUP_CREATE)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(cursor)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(created.is_some())
    }

    async fn read_new<'c>(
        &'c self,
        key: &'c StreamKey,
        read: &'c ReadNew,
    ) -> Result<Vec<DeliveredEntry>, StoreError> {
        read.validate()?;
        let deadline = read.block.map(|block| Instant::now() + block);
        // Subscribed before the first look, so an append committed between
        // that look and the wait still wakes it.
        let mut appended = self.inner.stream_wake.subscribe();
        loop {
            let entries = self.read_new_once(key, read).await?;
            let Some(deadline) = deadline else {
                return Ok(entries);
            };
            if !entries.is_empty() {
                return Ok(entries);
            }
            loop {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(Vec::new());
                }
                let wait = (deadline - now).min(STREAM_POLL_INTERVAL);
                if let Ok(Err(_)) = tokio::time::timeout(wait, appended.changed()).await {
                    // The sender lives as long as the store; should it be
                    // gone, polling alone still finds the entries.
                    tokio::time::sleep(wait).await;
                }
                if self.has_new(key, &read.group).await? {
                    break;
                }
            }
        }
    }

    async fn read_pending<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        after: StreamEntryId,
        count: usize,
    ) -> Result<Vec<PendingEntry>, StoreError> {
        validate_name("group", group)?;
        validate_name("consumer", consumer)?;
        validate_count("count", count)?;
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        group_cursor(&mut *tx, key, group).await?;
        let reread = sqlx::query(queries::STREAM_PENDING_REREAD)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .bind(rowid_above(after))
            .bind(limit(count))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let delivered = delivered_rows(&reread)?;
        touch_consumer(&mut tx, key, group, consumer).await?;
        let mut entries =
            entries_by_rowid(&mut tx, key, delivered.iter().map(|&(id, _)| id)).await?;
        tx.commit().await.map_err(map)?;
        delivered
            .into_iter()
            .map(|(rowid, deliveries)| {
                Ok(match entries.remove(&rowid) {
                    Some(entry) => PendingEntry::Present(DeliveredEntry { entry, deliveries }),
                    None => PendingEntry::Deleted(entry_id(rowid)?),
                })
            })
            .collect()
    }

    async fn claim_idle<'c>(
        &'c self,
        key: &'c StreamKey,
        claim: &'c ClaimIdle,
    ) -> Result<ClaimedEntries, StoreError> {
        claim.validate()?;
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        group_cursor(&mut *tx, key, &claim.group).await?;
        let picked = sqlx::query(queries::STREAM_CLAIM_PICK)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(&claim.group)
            .bind(rowid_from(claim.cursor))
            .bind(millis(claim.min_idle))
            .bind(limit(claim.count))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let mut present = Vec::with_capacity(picked.len());
        let mut trimmed = Vec::new();
        let mut last = None;
        for row in &picked {
            let id: i64 = get(row, "entry_id")?;
            last = Some(id);
            if get::<bool>(row, "trimmed")? {
                trimmed.push(id);
            } else {
                present.push(id);
            }
        }
        let next = match last {
            Some(last) if picked.len() == claim.count => entry_id(last)?.successor(),
            _ => StreamEntryId::ZERO,
        };
        if !trimmed.is_empty() {
            sqlx::query(queries::STREAM_PENDING_REMOVE)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(&claim.group)
                .bind(rowids_json(trimmed.iter().copied()))
                .execute(&mut *tx)
                .await
                .map_err(map)?;
        }
        let delivered = if present.is_empty() {
            Vec::new()
        } else {
            let claimed = sqlx::query(queries::STREAM_CLAIM)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(&claim.group)
                .bind(&claim.consumer)
                .bind(rowids_json(present.iter().copied()))
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?;
            delivered_rows(&claimed)?
        };
        touch_consumer(&mut tx, key, &claim.group, &claim.consumer).await?;
        let mut entries = entries_by_rowid(&mut tx, key, present).await?;
        tx.commit().await.map_err(map)?;
        let entries = delivered
            .into_iter()
            .map(|(rowid, deliveries)| {
                // Picked under the write lock in this transaction: a trim
                // cannot have come between.
                let entry = entries.remove(&rowid).ok_or_else(|| {
                    StoreError::Corrupt(format!("claimed entry {rowid} vanished"))
                })?;
                Ok(DeliveredEntry { entry, deliveries })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(ClaimedEntries {
            entries,
            deleted: trimmed
                .into_iter()
                .map(entry_id)
                .collect::<Result<_, _>>()?,
            next,
        })
    }

    async fn touch<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        self.update_own_pending(queries::STREAM_TOUCH, key, group, consumer, ids)
            .await
    }

    async fn uncount_deliveries<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        self.update_own_pending(queries::STREAM_UNCOUNT, key, group, consumer, ids)
            .await
    }

    async fn ack<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        validate_name("group", group)?;
        if ids.len() > MAX_STREAM_BATCH {
            return Err(ValidationError::new(
                "ids",
                format!("has {} ids; the limit is {MAX_STREAM_BATCH}", ids.len()),
            )
            .into());
        }
        let rowids: Vec<i64> = ids.iter().copied().filter_map(rowid).collect();
        let acked = if rowids.is_empty() {
            0
        } else {
            let _turn = self.write_turn().await?;
            sqlx::query(queries::STREAM_PENDING_REMOVE)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(group)
                .bind(rowids_json(rowids))
                .execute(&self.inner.pool)
                .await
                .map_err(map)?
                .rows_affected()
        };
        if acked == 0 {
            // Only an existing group has pending rows; none removed, so say
            // whether the group is there at all.
            group_cursor(&self.inner.pool, key, group).await?;
        }
        Ok(acked)
    }

    async fn visibility_wait<'c>(
        &'c self,
        _key: &'c StreamKey,
    ) -> Result<Option<Duration>, StoreError> {
        // One writer: rowid order is commit order, and a committed entry is
        // readable at once.
        Ok(None)
    }

    async fn lag<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> Result<Option<u64>, StoreError> {
        validate_name("group", group)?;
        let lag: Option<i64> = sqlx::query_scalar(queries::STREAM_LAG)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        let lag = lag.ok_or_else(|| group_not_found(key, group))?;
        Ok(Some(u64::try_from(lag).unwrap_or(0)))
    }

    async fn pending_summary<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> Result<PendingSummary, StoreError> {
        validate_name("group", group)?;
        // A read transaction: the totals and the per-consumer counts come
        // from one snapshot.
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        group_cursor(&mut *tx, key, group).await?;
        let totals = sqlx::query(queries::STREAM_PENDING_SUMMARY)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let per_consumer = sqlx::query(queries::STREAM_PENDING_PER_CONSUMER)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        tx.commit().await.map_err(map)?;
        let count: i64 = get(&totals, "count")?;
        let lowest: Option<i64> = get(&totals, "lowest")?;
        let highest: Option<i64> = get(&totals, "highest")?;
        let mut consumers = BTreeMap::new();
        for row in &per_consumer {
            consumers.insert(get(row, "consumer")?, unsigned(row, "count")?);
        }
        Ok(PendingSummary {
            count: non_negative("count", count)?,
            lowest: lowest.map(entry_id).transpose()?,
            highest: highest.map(entry_id).transpose()?,
            consumers,
        })
    }

    async fn pending_detail<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        query: &'c PendingQuery,
    ) -> Result<Vec<PendingDetail>, StoreError> {
        validate_name("group", group)?;
        query.validate()?;
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        group_cursor(&mut *tx, key, group).await?;
        let fetched = sqlx::query(queries::STREAM_PENDING_DETAIL)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(rowid_above(query.after))
            .bind(limit(query.count))
            .bind(query.consumer.as_deref())
            .bind(query.min_idle.map(millis))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        tx.commit().await.map_err(map)?;
        fetched
            .iter()
            .map(|row| {
                Ok(PendingDetail {
                    id: rows::entry_id(row, "entry_id")?,
                    consumer: get(row, "consumer")?,
                    idle: Duration::from_millis(unsigned(row, "idle")?),
                    deliveries: unsigned(row, "deliveries")?,
                })
            })
            .collect()
    }

    async fn consumers<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> Result<Vec<ConsumerInfo>, StoreError> {
        validate_name("group", group)?;
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        group_cursor(&mut *tx, key, group).await?;
        let fetched = sqlx::query(queries::STREAM_CONSUMERS_LIST)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        tx.commit().await.map_err(map)?;
        fetched
            .iter()
            .map(|row| {
                Ok(ConsumerInfo {
                    name: get(row, "consumer")?,
                    pending: unsigned(row, "pending")?,
                    idle: Duration::from_millis(unsigned(row, "idle")?),
                })
            })
            .collect()
    }

    async fn delete_consumer<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
    ) -> Result<ConsumerRemoval, StoreError> {
        validate_name("group", group)?;
        validate_name("consumer", consumer)?;
        let _turn = self.write_turn().await?;
        // One write transaction: no read can make an entry pending for the
        // consumer between the count and the delete.
        let mut tx = self.begin().await?;
        group_cursor(&mut *tx, key, group).await?;
        let pending: i64 = sqlx::query_scalar(queries::STREAM_CONSUMER_PENDING)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        if pending > 0 {
            return Ok(ConsumerRemoval::HasPending(non_negative(
                "pending", pending,
            )?));
        }
        let deleted = sqlx::query(queries::STREAM_CONSUMER_DELETE)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .execute(&mut *tx)
            .await
            .map_err(map)?
            .rows_affected();
        tx.commit().await.map_err(map)?;
        Ok(if deleted == 0 {
            ConsumerRemoval::NotFound
        } else {
            ConsumerRemoval::Deleted
        })
    }

    async fn range<'c>(
        &'c self,
        key: &'c StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        validate_count("count", count)?;
        let fetched = sqlx::query(queries::STREAM_ENTRIES_AFTER)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(rowid_above(after))
            .bind(limit(count))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        fetched.iter().map(rows::stream_entry).collect()
    }

    async fn trim<'c>(&'c self, key: &'c StreamKey, bound: TrimBound) -> Result<u64, StoreError> {
        let (sql, bound) = match bound {
            TrimBound::MaxLen(keep) => (
                queries::STREAM_TRIM_MAX_LEN,
                i64::try_from(keep).unwrap_or(i64::MAX),
            ),
            TrimBound::MinId(id) => (queries::STREAM_TRIM_MIN_ID, rowid_from(id)),
        };
        let _turn = self.write_turn().await?;
        let removed = sqlx::query(sql)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(bound)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected();
        Ok(removed)
    }

    async fn dead_letter<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        entry: &'c DeliveredEntry,
        errors: &'c [String],
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let dead_letters = key.dead_letters()?;
        let encoded = dead_letter_json(&dead_letter_entry(key, entry, errors))?;
        {
            let _turn = self.write_turn().await?;
            let mut tx = self.begin().await?;
            group_cursor(&mut *tx, key, group).await?;
            let removed = match rowid(entry.entry.id) {
                None => 0,
                Some(rowid) => sqlx::query(queries::STREAM_PENDING_REMOVE)
                    .bind(key.tenant())
                    .bind(key.stream())
                    .bind(group)
                    .bind(rowids_json([rowid]))
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?
                    .rows_affected(),
            };
            if removed == 0 {
                // Dropping `tx` rolls back: nothing appended.
                return Ok(false);
            }
            insert_entries(&mut tx, &dead_letters, encoded, 1).await?;
            tx.commit().await.map_err(map)?;
        }
        self.wake_streams();
        Ok(true)
    }

    async fn list_streams<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StreamKey>,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        validate_tenants(tenants)?;
        let tenants = tenants.map(|tenants| Value::from(tenants.to_vec()).to_string());
        let listed = sqlx::query(queries::STREAM_LIST)
            .bind(tenants)
            .bind(after.map(StreamKey::tenant))
            .bind(after.map(StreamKey::stream))
            .bind(self::limit(limit.clamp(1, MAX_STREAM_PAGE)))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        stream_page(&listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_map_to_rowid_bounds() {
        assert_eq!(rowid_above(StreamEntryId::new(5, 0)), 5);
        assert_eq!(rowid_above(StreamEntryId::new(5, 3)), 5);
        assert_eq!(rowid_from(StreamEntryId::new(5, 0)), 5);
        assert_eq!(rowid_from(StreamEntryId::new(5, 1)), 6);
        assert_eq!(rowid_from(StreamEntryId::new(5, 0).successor()), 6);
        assert_eq!(rowid_above(StreamEntryId::new(u64::MAX, 0)), i64::MAX);
        assert_eq!(rowid_from(StreamEntryId::new(u64::MAX, 1)), i64::MAX);
        assert_eq!(rowid(StreamEntryId::new(7, 0)), Some(7));
        assert_eq!(rowid(StreamEntryId::new(7, 1)), None);
        assert_eq!(rowid(StreamEntryId::new(u64::MAX, 0)), None);
    }

    #[test]
    fn oversized_batches_and_entries_are_refused_naming_the_field() {
        let entry = NewStreamEntry::new(json!({"n": 1}));
        let batch = vec![entry; MAX_STREAM_BATCH + 1];
        let Err(StoreError::Invalid(err)) = entries_json(&batch) else {
            panic!("a batch over the limit was accepted");
        };
        assert_eq!(err.field, "entries");
        let mut headers = NewStreamEntry::new(json!({}));
        for n in 0..=courier_core::MAX_HEADERS {
            headers.headers.insert(format!("h{n}"), String::new());
        }
        let Err(StoreError::Invalid(err)) = entries_json(&[headers]) else {
            panic!("too many headers were accepted");
        };
        assert_eq!(err.field, "headers");
    }
}
