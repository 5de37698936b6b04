//! What the stream cases share: keys, entries, reads, claims and the checks
//! on errors.

use std::time::Duration;

use courier_core::StoreError;
use courier_core::{
    ClaimIdle, ClaimedEntries, DeliveredEntry, NewStreamEntry, PendingEntry, PendingSummary,
    ReadNew, StreamEntry, StreamEntryId, StreamKey, StreamStore,
};
use serde_json::json;

/// The idle time claims in the cases ask for.
pub(super) const MIN_IDLE: Duration = Duration::from_secs(60);

/// How much [`StreamFixture::age_pending`](super::StreamFixture::age_pending)
/// ages entries that should be claimable: well past [`MIN_IDLE`].
pub(super) const AGED: Duration = Duration::from_secs(120);

/// The tenant every case's streams belong to.
pub(super) const TENANT: &str = "acme";

/// The case's stream `stream`.
pub(super) fn key(stream: &str) -> anyhow::Result<StreamKey> {
    Ok(StreamKey::new(TENANT, stream)?)
}

/// An entry whose payload is `{"n": n}`.
pub(super) fn entry(n: i64) -> NewStreamEntry {
    NewStreamEntry::new(json!({ "n": n }))
}

/// Entries numbered `from..to`.
pub(super) fn numbered(from: i64, to: i64) -> Vec<NewStreamEntry> {
    (from..to).map(entry).collect()
}

/// Appends entries numbered `from..to`; returns their ids.
pub(super) async fn append_numbered<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    from: i64,
    to: i64,
) -> anyhow::Result<Vec<StreamEntryId>> {
    Ok(store.append(key, &numbered(from, to)).await?)
}

/// A non-blocking read of up to `count` new entries.
pub(super) fn read(group: &str, consumer: &str, count: usize) -> ReadNew {
    ReadNew {
        group: group.to_owned(),
        consumer: consumer.to_owned(),
        count,
        block: None,
    }
}

/// Reads up to `count` new entries for `consumer`.
pub(super) async fn read_new<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    group: &str,
    consumer: &str,
    count: usize,
) -> anyhow::Result<Vec<DeliveredEntry>> {
    Ok(store.read_new(key, &read(group, consumer, count)).await?)
}

/// A claim from the start of up to `count` entries idle [`MIN_IDLE`].
pub(super) fn claim(group: &str, consumer: &str, count: usize) -> ClaimIdle {
    ClaimIdle {
        group: group.to_owned(),
        consumer: consumer.to_owned(),
        min_idle: MIN_IDLE,
        cursor: StreamEntryId::ZERO,
        count,
    }
}

/// Claims from the start for `consumer`, following `next` until the scan
/// ends (at most `max_calls` calls); returns every answer.
pub(super) async fn claim_all<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    mut params: ClaimIdle,
    max_calls: usize,
) -> anyhow::Result<Vec<ClaimedEntries>> {
    let mut answers = Vec::new();
    for _ in 0..max_calls {
        let answer = store.claim_idle(key, &params).await?;
        let next = answer.next;
        answers.push(answer);
        if next == StreamEntryId::ZERO {
            return Ok(answers);
        }
        anyhow::ensure!(
            next > params.cursor,
            "a claim's next {next} does not move past its cursor {}",
            params.cursor
        );
        params.cursor = next;
    }
    anyhow::bail!("claims did not reach the end of the pending list in {max_calls} calls")
}

/// The ids of delivered entries, in their order.
pub(super) fn ids(delivered: &[DeliveredEntry]) -> Vec<StreamEntryId> {
    delivered.iter().map(|d| d.entry.id).collect()
}

/// The ids of stored entries, in their order.
pub(super) fn entry_ids(entries: &[StreamEntry]) -> Vec<StreamEntryId> {
    entries.iter().map(|e| e.id).collect()
}

/// The ids of a re-read, in its order.
pub(super) fn pending_ids(entries: &[PendingEntry]) -> Vec<StreamEntryId> {
    entries.iter().map(PendingEntry::id).collect()
}

/// The delivery counts of delivered entries, in their order.
pub(super) fn deliveries(delivered: &[DeliveredEntry]) -> Vec<u64> {
    delivered.iter().map(|d| d.deliveries).collect()
}

/// The group's pending summary.
pub(super) async fn summary<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    group: &str,
) -> anyhow::Result<PendingSummary> {
    Ok(store.pending_summary(key, group).await?)
}

/// Every entry of the stream (up to 10,000).
pub(super) async fn all_entries<S: StreamStore>(
    store: &S,
    key: &StreamKey,
) -> anyhow::Result<Vec<StreamEntry>> {
    Ok(store
        .range(key, StreamEntryId::ZERO, courier_core::MAX_STREAM_BATCH)
        .await?)
}

/// Checks that `result` is a refusal of `field`.
pub(super) fn assert_invalid<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    field: &str,
    what: &str,
) -> anyhow::Result<()> {
    match result {
        Err(StoreError::Invalid(err)) => {
            anyhow::ensure!(
                err.field == field,
                "{what}: refused naming {:?}, not {field:?} ({})",
                err.field,
                err.reason
            );
            Ok(())
        }
        other => anyhow::bail!("{what}: expected a refusal of {field:?}, got {other:?}"),
    }
}

/// Checks that `result` is a refusal (of whatever field the backend names).
pub(super) fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    what: &str,
) -> anyhow::Result<()> {
    match result {
        Err(StoreError::Invalid(_)) => Ok(()),
        other => anyhow::bail!("{what}: expected a refusal, got {other:?}"),
    }
}

/// Checks that `result` is [`StoreError::NotFound`].
pub(super) fn assert_not_found<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    what: &str,
) -> anyhow::Result<()> {
    match result {
        Err(StoreError::NotFound { .. }) => Ok(()),
        other => anyhow::bail!("{what}: expected NotFound, got {other:?}"),
    }
}
