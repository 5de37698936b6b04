//! [`StreamStore`] for PostgreSQL: native streams with consumer groups.
//!
//! Entries, groups, consumers and pending entries are tables of the store's
//! schema (migration 0010). An entry's id is (appending transaction, sequence
//! value); groups hand out only entries of transactions below the reading
//! snapshot's xmin, so no entry is ever skipped although transactions commit
//! out of id order (see the migration's notes). Every operation is one
//! statement, atomic on its own.
//!
//! A blocked read waits for a notification naming its stream on
//! `{schema}.streams` (reads blocked on other streams are not woken), which an
//! append sends only while a reader has registered as waiting on its stream
//! (NOTIFY serialises committing transactions, so appends do not pay for it
//! otherwise), and re-reads at least every [`POLL_INTERVAL`]: an entry that
//! committed but is not yet below the xmin horizon, or an append that raced
//! the registration, is found by the next poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    dead_letter_entry, group_not_found, validate_count, validate_name, validate_tenants, ClaimIdle,
    ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry, EntryOrigin, GroupStart,
    GroupSummary, NewStreamEntry, PendingDetail, PendingEntry, PendingQuery, PendingSummary,
    ReadNew, StoreError, StreamEntry, StreamEntryId, StreamKey, StreamPage, StreamStore,
    StreamSummary, TrimBound, ValidationError, MAX_PAYLOAD_BYTES, MAX_STREAM_PAGE,
};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::Row;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::map;
use crate::rows::parse_headers;
use crate::{millis, PgStore};

/// How often a blocked read looks again without a notification.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How soon a blocked read that was woken but found nothing visible yet
/// (an older writing transaction still open) looks again; doubled up to
/// [`POLL_INTERVAL`].
const VISIBILITY_RETRY: Duration = Duration::from_millis(2);

/// The store's listener for stream notifications, started by the first
/// blocked read and stopped when the last clone of the store is dropped.
/// An append names its stream in the notification, and only the reads
/// blocked on that stream are woken; a reconnect (notifications may have
/// been lost) and a notification naming no stream wake every one.
pub(crate) struct StreamWakeups {
    streams: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
    _stop: tokio_util::sync::DropGuard,
}

/// The notification payload that names `key`'s stream (names cannot hold a
/// newline).
fn wakeup_name(tenant: &str, stream: &str) -> String {
    format!("{tenant}\n{stream}")
}

/// Wakes the reads waiting on the stream `payload` names, or on every
/// stream for an empty payload.
fn wake_named(streams: &Mutex<HashMap<String, watch::Sender<u64>>>, payload: &str) {
    let streams = streams
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if payload.is_empty() {
        for sender in streams.values() {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    } else if let Some(sender) = streams.get(payload) {
        sender.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl StreamWakeups {
    fn start(store: &PgStore) -> Self {
        let streams: Arc<Mutex<HashMap<String, watch::Sender<u64>>>> = Arc::default();
        let cancel = CancellationToken::new();
        let pool = store.pool().clone();
        let channel = format!("{}.streams", store.schema());
        let stop = cancel.clone();
        let woken = Arc::clone(&streams);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            while !stop.is_cancelled() {
                if let Err(error) = listen(&pool, &channel, &woken, &stop).await {
                    tracing::warn!(%error, channel, "stream LISTEN connection failed; reconnecting");
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                } else {
                    backoff = Duration::from_millis(50);
                }
                // Anything sent while nobody listened is lost: everyone looks.
                wake_named(&woken, "");
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        });
        Self {
            streams,
            _stop: cancel.drop_guard(),
        }
    }

    /// A receiver that changes when an append to `tenant`'s `stream` is
    /// notified (or on a reconnect).
    fn subscribe(&self, tenant: &str, stream: &str) -> watch::Receiver<u64> {
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Forget streams nobody waits on any more.
        streams.retain(|_, sender| sender.receiver_count() > 0);
        streams
            .entry(wakeup_name(tenant, stream))
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }
}

async fn listen(
    pool: &sqlx::PgPool,
    channel: &str,
    streams: &Mutex<HashMap<String, watch::Sender<u64>>>,
    stop: &CancellationToken,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    // Appends committed before LISTEN took effect were not heard.
    wake_named(streams, "");
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            notification = listener.recv() => {
                wake_named(streams, notification?.payload());
            }
        }
    }
}

/// Whether `error` is a foreign-key violation (SQLSTATE 23503): a row that
/// names a group refers to one deleted meanwhile.
fn is_foreign_key_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("23503"))
}

/// The columns of `id` when it can name an entry: ids are (xid, n) pairs
/// of `bigint`s, so one with a part above `i64::MAX` names none.
fn id_parts(id: StreamEntryId) -> Option<(i64, i64)> {
    Some((i64::try_from(id.major).ok()?, i64::try_from(id.minor).ok()?))
}

/// The columns of an exclusive bound ("above `id`": after, group start)
/// equivalent to `id`: every client-written id is a valid bound, and one
/// past what the columns hold is above every entry, as `(i64::MAX,
/// i64::MAX)` is.
fn id_bound(id: StreamEntryId) -> (i64, i64) {
    match i64::try_from(id.major) {
        Ok(major) => (major, i64::try_from(id.minor).unwrap_or(i64::MAX)),
        Err(_) => (i64::MAX, i64::MAX),
    }
}

/// The columns of an inclusive bound ("at or above `id`": claim cursor,
/// trim's min id) equivalent to `id`: a minor part past the columns starts
/// at the next major.
fn id_bound_from(id: StreamEntryId) -> (i64, i64) {
    match (i64::try_from(id.major), i64::try_from(id.minor)) {
        (Ok(major), Ok(minor)) => (major, minor),
        (Ok(major), Err(_)) if major < i64::MAX => (major + 1, 0),
        _ => (i64::MAX, i64::MAX),
    }
}

fn id_from(major: i64, minor: i64) -> Result<StreamEntryId, StoreError> {
    match (u64::try_from(major), u64::try_from(minor)) {
        (Ok(major), Ok(minor)) => Ok(StreamEntryId::new(major, minor)),
        _ => Err(StoreError::Corrupt(format!(
            "stream entry id {major}-{minor} is negative"
        ))),
    }
}

fn count_param(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The entry id in columns `major_column` and `minor_column` of `row`;
/// `None` when they are NULL (the one row a statement returns to say it
/// found the group but nothing else).
fn id_columns(
    row: &PgRow,
    major_column: &str,
    minor_column: &str,
) -> Result<Option<StreamEntryId>, StoreError> {
    let major: Option<i64> = row.try_get(major_column).map_err(map)?;
    let minor: Option<i64> = row.try_get(minor_column).map_err(map)?;
    major
        .zip(minor)
        .map(|(major, minor)| id_from(major, minor))
        .transpose()
}

/// A row of `query` that must carry an entry id came without one.
fn no_id(query: &str) -> StoreError {
    StoreError::Corrupt(format!("a {query} row has no entry id"))
}

/// The entry id in columns `major` and `minor` of `row`, if any.
fn row_id(row: &PgRow) -> Result<Option<StreamEntryId>, StoreError> {
    id_columns(row, "major", "minor")
}

fn entry_from_row(row: &PgRow, id: StreamEntryId) -> Result<StreamEntry, StoreError> {
    let payload: serde_json::Value = row.try_get("payload").map_err(map)?;
    let headers: serde_json::Value = row.try_get("headers").map_err(map)?;
    let message_id: Option<uuid::Uuid> = row.try_get("message_id").map_err(map)?;
    let origin = match message_id {
        Some(message_id) => Some(EntryOrigin {
            message_id,
            tenant: row
                .try_get::<Option<String>, _>("origin_tenant")
                .map_err(map)?
                .unwrap_or_default(),
            topic: row
                .try_get::<Option<String>, _>("topic")
                .map_err(map)?
                .unwrap_or_default(),
            schema_version: row
                .try_get::<Option<i32>, _>("schema_version")
                .map_err(map)?
                .unwrap_or(1),
        }),
        None => None,
    };
    Ok(StreamEntry {
        id,
        payload,
        headers: parse_headers(&headers.to_string())?,
        origin,
    })
}

fn deliveries(row: &PgRow) -> Result<u64, StoreError> {
    let n: i32 = row.try_get("deliveries").map_err(map)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A count column, which is never negative.
fn count_column(row: &PgRow, column: &str) -> Result<u64, StoreError> {
    let count: i64 = row.try_get(column).map_err(map)?;
    u64::try_from(count).map_err(|_| StoreError::Corrupt(format!("{column} is {count}")))
}

/// The page `stream_list.sql`'s rows describe: one row per (stream, group),
/// in listing order, a stream without groups with NULL group columns.
fn stream_page(rows: &[PgRow]) -> Result<StreamPage, StoreError> {
    let mut page = StreamPage::default();
    let mut more = false;
    for row in rows {
        more = row.try_get("more").map_err(map)?;
        let tenant: String = row.try_get("tenant").map_err(map)?;
        let stream: String = row.try_get("stream").map_err(map)?;
        let same = page
            .items
            .last()
            .is_some_and(|last| last.tenant == tenant && last.stream == stream);
        if !same {
            page.items.push(StreamSummary {
                tenant,
                stream,
                length: count_column(row, "length")?,
                last_id: id_columns(row, "last_major", "last_minor")?,
                groups: Vec::new(),
            });
        }
        let Some(name) = row.try_get::<Option<String>, _>("grp").map_err(map)? else {
            continue;
        };
        let group = GroupSummary {
            name,
            consumers: count_column(row, "consumers")?,
            pending: count_column(row, "pending")?,
            last_delivered: id_columns(row, "group_major", "group_minor")?
                .ok_or_else(|| no_id("stream_list group"))?,
            lag: Some(count_column(row, "lag")?),
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

fn found(rows: &[PgRow], key: &StreamKey, group: &str) -> Result<(), StoreError> {
    let found = match rows.first() {
        Some(row) => row.try_get::<bool, _>("found").map_err(map)?,
        None => false,
    };
    if found {
        Ok(())
    } else {
        Err(group_not_found(key, group))
    }
}

impl PgStore {
    /// Appends `entries` to `key` on the caller's connection, inside their
    /// transaction if one is open: the entries commit or roll back with it,
    /// and no group sees them before it commits. Otherwise as
    /// [`StreamStore::append`].
    pub async fn append_on(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &StreamKey,
        entries: &[NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        self.append_with(conn, key, entries).await
    }

    /// Appends `entry`, which relays an outbox message (its
    /// [`EntryOrigin`]), to `key` in the caller's transaction on `conn`,
    /// unless `key` already holds an entry of that message that committed
    /// or was appended earlier in that transaction — in one round trip,
    /// looked up by index (migration 0011), never by scanning the stream.
    /// Another transaction relaying the same message to `key` at the same
    /// time makes this one wait until it ends, then find its entry if it
    /// committed (migration 0018): the message is stored once. (In a
    /// `REPEATABLE READ` or `SERIALIZABLE` transaction the entry committed
    /// meanwhile cannot be read: that is a serialization failure to retry.)
    /// Returns the new entry's id and `false`, or the lowest existing
    /// entry's and `true`.
    /// An entry without an origin is refused.
    pub async fn relay_append_on(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &StreamKey,
        entry: &NewStreamEntry,
    ) -> Result<(StreamEntryId, bool), StoreError> {
        let Some(origin) = entry.origin.as_ref() else {
            return Err(StoreError::Invalid(ValidationError::new(
                "origin",
                "a relayed entry names the message it relays",
            )));
        };
        // The current span's trace context goes with an entry that carries none.
        let traced = courier_core::entries_with_current_context(std::slice::from_ref(entry));
        let entry = &traced[0];
        let payload = entry.validate(0, MAX_PAYLOAD_BYTES)?;
        let headers = serde_json::to_string(&entry.headers)
            .map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
        let row = sqlx::query(&self.q().stream_relay_append)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(payload)
            .bind(headers)
            .bind(origin.message_id)
            .bind(&origin.tenant)
            .bind(&origin.topic)
            .bind(origin.schema_version)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        if let Some(row) = row {
            let id = row_id(&row)?.ok_or_else(|| no_id("relay append"))?;
            let duplicate: bool = row.try_get("duplicate").map_err(map)?;
            return Ok((id, duplicate));
        }
        // A transaction relaying the same message at the same time appended
        // it and committed after the statement began: its entry, as a new
        // snapshot sees it.
        let row = sqlx::query(&self.q().stream_relayed_entry)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(origin.message_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        let id = match row {
            Some(row) => row_id(&row)?,
            None => None,
        }
        .ok_or_else(|| no_id("relay append"))?;
        Ok((id, true))
    }

    async fn append_with<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        key: &StreamKey,
        entries: &[NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        validate_count("entries", entries.len())?;
        // The current span's trace context goes with entries that carry none.
        let traced = courier_core::entries_with_current_context(entries);
        let entries: &[NewStreamEntry] = &traced;
        let mut payloads = Vec::with_capacity(entries.len());
        let mut headers = Vec::with_capacity(entries.len());
        let mut message_ids = Vec::with_capacity(entries.len());
        let mut tenants = Vec::with_capacity(entries.len());
        let mut topics = Vec::with_capacity(entries.len());
        let mut versions = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            payloads.push(entry.validate(index, MAX_PAYLOAD_BYTES)?);
            headers.push(
                serde_json::to_string(&entry.headers)
                    .map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?,
            );
            message_ids.push(entry.origin.as_ref().map(|o| o.message_id));
            tenants.push(entry.origin.as_ref().map(|o| o.tenant.clone()));
            topics.push(entry.origin.as_ref().map(|o| o.topic.clone()));
            versions.push(entry.origin.as_ref().map(|o| o.schema_version));
        }
        let rows = sqlx::query(&self.q().stream_append)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(&payloads)
            .bind(&headers)
            .bind(&message_ids)
            .bind(&tenants)
            .bind(&topics)
            .bind(&versions)
            .fetch_all(executor)
            .await
            .map_err(map)?;
        let mut ids = rows
            .iter()
            .map(|row| row_id(row)?.ok_or_else(|| no_id("append")))
            .collect::<Result<Vec<_>, _>>()?;
        // Sequence values were handed out in input order (see the query).
        ids.sort_unstable();
        Ok(ids)
    }

    /// Waits until entry `id` (and every entry below it) is readable, that
    /// is until every transaction that took its id before `id`'s appender
    /// has ended, or `timeout` passed; returns whether it is readable. An
    /// append is readable at once unless a writing transaction older than it
    /// is open anywhere on the server. For producers that need to read their
    /// own appends (an HTTP `wait`, a test).
    pub async fn wait_until_readable(
        &self,
        id: StreamEntryId,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let (major, _) = id_bound(id);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = VISIBILITY_RETRY;
        loop {
            let horizon: i64 = sqlx::query_scalar(&self.q().stream_horizon)
                .fetch_one(self.pool())
                .await
                .map_err(map)?;
            if major < horizon {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(POLL_INTERVAL);
        }
    }

    /// Wake-ups of reads blocked on `key`'s stream.
    fn stream_wakeups(&self, key: &StreamKey) -> watch::Receiver<u64> {
        self.inner
            .stream_wakeups
            .get_or_init(|| Arc::new(StreamWakeups::start(self)))
            .subscribe(key.tenant(), key.stream())
    }

    async fn read_new_once(
        &self,
        key: &StreamKey,
        read: &ReadNew,
    ) -> Result<Vec<DeliveredEntry>, StoreError> {
        let rows = sqlx::query(&self.q().stream_read_new)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(&read.group)
            .bind(&read.consumer)
            .bind(count_param(read.count))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, &read.group)?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(id) = row_id(row)? {
                entries.push(DeliveredEntry {
                    entry: entry_from_row(row, id)?,
                    deliveries: 1,
                });
            }
        }
        Ok(entries)
    }
}

/// The parts of those of `ids` that can name an entry (the others are
/// unknown) as two arrays, in id order: statements that lock several
/// pending rows (ack, touch) take them in the same order, so two of them
/// running at once (a subscription's touch beside its ack) cannot deadlock.
fn sorted_id_parts(ids: &[StreamEntryId]) -> (Vec<i64>, Vec<i64>) {
    let mut parts: Vec<(i64, i64)> = ids.iter().filter_map(|id| id_parts(*id)).collect();
    parts.sort_unstable();
    parts.into_iter().unzip()
}

impl PgStore {
    /// Runs `sql` (`stream_touch`, `stream_uncount`: an UPDATE of the rows
    /// of `ids` pending to `consumer` in `group`, taken in id order, that
    /// returns their count) after checking the names and the count.
    async fn update_own_pending(
        &self,
        sql: &str,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        courier_core::validate_own_pending(group, consumer, ids)?;
        let (majors, minors) = sorted_id_parts(ids);
        let updated: i64 = sqlx::query_scalar(sql)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .bind(&majors)
            .bind(&minors)
            .fetch_one(self.pool())
            .await
            .map_err(map)?;
        Ok(u64::try_from(updated).unwrap_or(0))
    }
}

impl StreamStore for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn append<'c>(
        &'c self,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        self.append_with(self.pool(), key, entries).await
    }

    async fn ensure_group<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        start: GroupStart,
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let (kind, (major, minor)) = match start {
            GroupStart::Beginning => ("beginning", (0, 0)),
            GroupStart::End => ("end", (0, 0)),
            GroupStart::After(id) => ("after", id_bound(id)),
        };
        let rows = sqlx::query(&self.q().stream_group_ensure)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(kind)
            .bind(major)
            .bind(minor)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        Ok(!rows.is_empty())
    }

    async fn read_new<'c>(
        &'c self,
        key: &'c StreamKey,
        read: &'c ReadNew,
    ) -> Result<Vec<DeliveredEntry>, StoreError> {
        read.validate()?;
        let entries = self.read_new_once(key, read).await?;
        let Some(block) = read.block.filter(|b| !b.is_zero()) else {
            return Ok(entries);
        };
        if !entries.is_empty() {
            return Ok(entries);
        }
        let deadline = tokio::time::Instant::now() + block;
        let mut wake = self.stream_wakeups(key);
        sqlx::query(&self.q().stream_wait)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(millis(block + POLL_INTERVAL))
            .execute(self.pool())
            .await
            .map_err(map)?;
        wake.borrow_and_update();
        // An append may have committed before the registration was visible.
        let mut retry = POLL_INTERVAL;
        loop {
            let entries = self.read_new_once(key, read).await?;
            if !entries.is_empty() {
                return Ok(entries);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(entries);
            }
            let pause = retry.min(deadline - now);
            tokio::select! {
                changed = wake.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(pause).await;
                    }
                    // Woken: the entry may not be below the xmin horizon yet.
                    retry = VISIBILITY_RETRY;
                }
                () = tokio::time::sleep(pause) => {
                    retry = (retry * 2).min(POLL_INTERVAL);
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
        let (major, minor) = id_bound(after);
        let rows = sqlx::query(&self.q().stream_read_pending)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .bind(major)
            .bind(minor)
            .bind(count_param(count))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(id) = row_id(row)? else {
                continue;
            };
            let redelivered: Option<i32> = row.try_get("deliveries").map_err(map)?;
            entries.push(match redelivered {
                Some(_) => PendingEntry::Present(DeliveredEntry {
                    entry: entry_from_row(row, id)?,
                    deliveries: deliveries(row)?,
                }),
                None => PendingEntry::Deleted(id),
            });
        }
        Ok(entries)
    }

    async fn claim_idle<'c>(
        &'c self,
        key: &'c StreamKey,
        claim: &'c ClaimIdle,
    ) -> Result<ClaimedEntries, StoreError> {
        claim.validate()?;
        let (major, minor) = id_bound_from(claim.cursor);
        let rows = sqlx::query(&self.q().stream_claim_idle)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(&claim.group)
            .bind(&claim.consumer)
            .bind(major)
            .bind(minor)
            .bind(millis(claim.min_idle))
            .bind(count_param(claim.count))
            .fetch_all(self.pool())
            .await
            .map_err(|error| {
                // The group was deleted after this claim read it (by hand:
                // Courier deletes no group): as if it had gone first.
                if is_foreign_key_violation(&error) {
                    group_not_found(key, &claim.group)
                } else {
                    map(error)
                }
            })?;
        let group_row = rows.iter().find(|row| {
            row.try_get::<String, _>("kind")
                .is_ok_and(|kind| kind == "group")
        });
        if !group_row.is_some_and(|row| row.try_get::<bool, _>("found").unwrap_or(false)) {
            return Err(group_not_found(key, &claim.group));
        }
        let mut claimed = ClaimedEntries::default();
        for row in &rows {
            let kind: String = row.try_get("kind").map_err(map)?;
            let Some(id) = row_id(row)? else {
                continue;
            };
            match kind.as_str() {
                "claimed" => claimed.entries.push(DeliveredEntry {
                    entry: entry_from_row(row, id)?,
                    deliveries: deliveries(row)?,
                }),
                "deleted" => claimed.deleted.push(id),
                "next" => claimed.next = id,
                _ => {}
            }
        }
        claimed.entries.sort_by_key(|d| d.entry.id);
        claimed.deleted.sort_unstable();
        Ok(claimed)
    }

    async fn touch<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        self.update_own_pending(&self.q().stream_touch, key, group, consumer, ids)
            .await
    }

    async fn uncount_deliveries<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        self.update_own_pending(&self.q().stream_uncount, key, group, consumer, ids)
            .await
    }

    async fn ack<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        ids: &'c [StreamEntryId],
    ) -> Result<u64, StoreError> {
        validate_name("group", group)?;
        validate_count("ids", ids.len())?;
        let (majors, minors) = sorted_id_parts(ids);
        let rows = sqlx::query(&self.q().stream_ack)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(&majors)
            .bind(&minors)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let acked: i64 = rows
            .first()
            .map(|row| row.try_get("acked"))
            .transpose()
            .map_err(map)?
            .unwrap_or(0);
        Ok(u64::try_from(acked).unwrap_or(0))
    }

    async fn visibility_wait<'c>(
        &'c self,
        key: &'c StreamKey,
    ) -> Result<Option<Duration>, StoreError> {
        let waited: Option<i64> = sqlx::query_scalar(&self.q().stream_visibility_wait)
            .bind(key.tenant())
            .bind(key.stream())
            .fetch_one(self.pool())
            .await
            .map_err(map)?;
        let millis = waited.map_or(0, |ms| u64::try_from(ms).unwrap_or(0));
        Ok(Some(Duration::from_millis(millis)))
    }

    async fn lag<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> Result<Option<u64>, StoreError> {
        validate_name("group", group)?;
        let lag: Option<i64> = sqlx::query_scalar(&self.q().stream_lag)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_optional(self.pool())
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
        let rows = sqlx::query(&self.q().stream_pending_summary)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let mut summary = PendingSummary::default();
        for row in &rows {
            summary.lowest = id_columns(row, "low_major", "low_minor")?;
            summary.highest = id_columns(row, "high_major", "high_minor")?;
            let consumer: Option<String> = row.try_get("consumer").map_err(map)?;
            let pending: Option<i64> = row.try_get("pending").map_err(map)?;
            if let (Some(consumer), Some(pending)) = (consumer, pending) {
                let pending = u64::try_from(pending).unwrap_or(0);
                summary.count += pending;
                summary.consumers.insert(consumer, pending);
            }
        }
        Ok(summary)
    }

    async fn pending_detail<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        query: &'c PendingQuery,
    ) -> Result<Vec<PendingDetail>, StoreError> {
        validate_name("group", group)?;
        query.validate()?;
        let (major, minor) = id_bound(query.after);
        let rows = sqlx::query(&self.q().stream_pending_detail)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(major)
            .bind(minor)
            .bind(count_param(query.count))
            .bind(&query.consumer)
            .bind(query.min_idle.map(millis))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let mut details = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(id) = row_id(row)? else {
                continue;
            };
            let idle: i64 = row.try_get("idle_ms").map_err(map)?;
            details.push(PendingDetail {
                id,
                consumer: row.try_get("consumer").map_err(map)?,
                idle: Duration::from_millis(u64::try_from(idle).unwrap_or(0)),
                deliveries: deliveries(row)?,
            });
        }
        Ok(details)
    }

    async fn consumers<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> Result<Vec<ConsumerInfo>, StoreError> {
        validate_name("group", group)?;
        let rows = sqlx::query(&self.q().stream_consumers)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let mut consumers = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(name) = row.try_get::<Option<String>, _>("consumer").map_err(map)? else {
                continue;
            };
            let pending: i64 = row.try_get("pending").map_err(map)?;
            let idle: i64 = row.try_get("idle_ms").map_err(map)?;
            consumers.push(ConsumerInfo {
                name,
                pending: u64::try_from(pending).unwrap_or(0),
                idle: Duration::from_millis(u64::try_from(idle).unwrap_or(0)),
            });
        }
        Ok(consumers)
    }

    async fn delete_consumer<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
    ) -> Result<ConsumerRemoval, StoreError> {
        validate_name("group", group)?;
        validate_name("consumer", consumer)?;
        let rows = sqlx::query(&self.q().stream_consumer_delete)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(consumer)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        let Some(row) = rows.first() else {
            return Err(group_not_found(key, group));
        };
        let existed: bool = row.try_get("existed").map_err(map)?;
        let pending: i64 = row.try_get("pending").map_err(map)?;
        let deleted: bool = row.try_get("deleted").map_err(map)?;
        Ok(if deleted {
            ConsumerRemoval::Deleted
        } else if pending > 0 {
            ConsumerRemoval::HasPending(u64::try_from(pending).unwrap_or(0))
        } else if existed {
            // Only a race with a concurrent deletion gets here.
            ConsumerRemoval::Deleted
        } else {
            ConsumerRemoval::NotFound
        })
    }

    async fn range<'c>(
        &'c self,
        key: &'c StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        validate_count("count", count)?;
        let (major, minor) = id_bound(after);
        let rows = sqlx::query(&self.q().stream_range)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(major)
            .bind(minor)
            .bind(count_param(count))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        rows.iter()
            .map(|row| entry_from_row(row, row_id(row)?.ok_or_else(|| no_id("range"))?))
            .collect()
    }

    async fn trim<'c>(&'c self, key: &'c StreamKey, bound: TrimBound) -> Result<u64, StoreError> {
        let removed: i64 = match bound {
            TrimBound::MaxLen(len) => sqlx::query_scalar(&self.q().stream_trim_maxlen)
                .bind(key.tenant())
                .bind(key.stream())
                .bind(i64::try_from(len).unwrap_or(i64::MAX))
                .fetch_one(self.pool())
                .await
                .map_err(map)?,
            TrimBound::MinId(id) => {
                let (major, minor) = id_bound_from(id);
                sqlx::query_scalar(&self.q().stream_trim_minid)
                    .bind(key.tenant())
                    .bind(key.stream())
                    .bind(major)
                    .bind(minor)
                    .fetch_one(self.pool())
                    .await
                    .map_err(map)?
            }
        };
        Ok(u64::try_from(removed).unwrap_or(0))
    }

    async fn dead_letter<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        entry: &'c DeliveredEntry,
        errors: &'c [String],
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let dead_key = key.dead_letters()?;
        let dead = dead_letter_entry(key, entry, errors);
        let payload = dead.validate_dead_letter()?;
        let headers = serde_json::to_string(&dead.headers)
            .map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
        // An id past the columns names no entry: nothing is pending there.
        let (major, minor) = id_parts(entry.entry.id).unwrap_or((i64::MAX, i64::MAX));
        let origin = dead.origin.as_ref();
        let rows = sqlx::query(&self.q().stream_dead_letter)
            .bind(key.tenant())
            .bind(key.stream())
            .bind(group)
            .bind(major)
            .bind(minor)
            .bind(dead_key.stream())
            .bind(payload)
            .bind(headers)
            .bind(origin.map(|o| o.message_id))
            .bind(origin.map(|o| o.tenant.clone()))
            .bind(origin.map(|o| o.topic.clone()))
            .bind(origin.map(|o| o.schema_version))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        found(&rows, key, group)?;
        Ok(rows
            .first()
            .map(|row| row.try_get::<bool, _>("dead_lettered"))
            .transpose()
            .map_err(map)?
            .unwrap_or(false))
    }

    async fn list_streams<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StreamKey>,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        validate_tenants(tenants)?;
        let rows = sqlx::query(&self.q().stream_list)
            .bind(tenants)
            .bind(after.map(StreamKey::tenant))
            .bind(after.map(StreamKey::stream))
            .bind(count_param(limit.clamp(1, MAX_STREAM_PAGE)))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        stream_page(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_past_the_columns_name_no_entry_and_bound_above_every_entry() {
        assert_eq!(id_parts(StreamEntryId::new(7, 3)), Some((7, 3)));
        assert_eq!(id_parts(StreamEntryId::new(1 << 63, 0)), None);
        assert_eq!(id_parts(StreamEntryId::new(7, u64::MAX)), None);
        assert_eq!(id_bound(StreamEntryId::new(7, 3)), (7, 3));
        assert_eq!(id_bound(StreamEntryId::new(7, u64::MAX)), (7, i64::MAX));
        assert_eq!(
            id_bound(StreamEntryId::new(u64::MAX, 0)),
            (i64::MAX, i64::MAX)
        );
        assert_eq!(id_bound_from(StreamEntryId::new(7, 3)), (7, 3));
        assert_eq!(id_bound_from(StreamEntryId::new(7, u64::MAX)), (8, 0));
        assert_eq!(
            id_bound_from(StreamEntryId::new(i64::MAX as u64, u64::MAX)),
            (i64::MAX, i64::MAX)
        );
        assert_eq!(
            id_bound_from(StreamEntryId::new(u64::MAX, 0)),
            (i64::MAX, i64::MAX)
        );
        let ids = [
            StreamEntryId::new(9, 1),
            StreamEntryId::new(u64::MAX, u64::MAX),
            StreamEntryId::new(2, 5),
        ];
        assert_eq!(sorted_id_parts(&ids), (vec![2, 9], vec![5, 1]));
    }
}
