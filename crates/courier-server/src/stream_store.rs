//! The stream operations the API and the CLI need, behind one object-safe
//! trait, so the router, its handlers and the CLI's verbs are not generic
//! over the stream backend (Redis, or the outbox database's native streams).

use courier::{
    ClaimIdle, ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry, GroupStart,
    NewStreamEntry, PendingDetail, PendingQuery, PendingSummary, ReadNew, StoreError, StreamEntry,
    StreamEntryId, StreamKey, StreamPage, StreamStore, TrimBound,
};
use futures_util::future::BoxFuture;

type StreamFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// What the HTTP API asks of a stream backend; implemented for every
/// [`StreamStore`] (`PgStore`, `SqliteStore`, `RedisStreamStore`).
pub trait ApiStreams: Send + Sync + 'static {
    /// The backend's name (`redis`, `postgres`, `sqlite`).
    fn backend(&self) -> &'static str;
    /// Appends entries in order, all or nothing.
    fn append(
        &self,
        key: StreamKey,
        entries: Vec<NewStreamEntry>,
    ) -> StreamFuture<'_, Vec<StreamEntryId>>;
    /// Creates a group unless it exists; whether it was created.
    fn ensure_group(
        &self,
        key: StreamKey,
        group: String,
        start: GroupStart,
    ) -> StreamFuture<'_, bool>;
    /// Hands a consumer entries its group has not handed out.
    fn read_new(&self, key: StreamKey, read: ReadNew) -> StreamFuture<'_, Vec<DeliveredEntry>>;
    /// Takes over idle pending entries.
    fn claim_idle(&self, key: StreamKey, claim: ClaimIdle) -> StreamFuture<'_, ClaimedEntries>;
    /// Acknowledges entries; how many were pending.
    fn ack(&self, key: StreamKey, group: String, ids: Vec<StreamEntryId>) -> StreamFuture<'_, u64>;
    /// The group's pending entries, summed up.
    fn pending_summary(&self, key: StreamKey, group: String) -> StreamFuture<'_, PendingSummary>;
    /// A page of the group's pending entries.
    fn pending_detail(
        &self,
        key: StreamKey,
        group: String,
        query: PendingQuery,
    ) -> StreamFuture<'_, Vec<PendingDetail>>;
    /// The group's consumers.
    fn consumers(&self, key: StreamKey, group: String) -> StreamFuture<'_, Vec<ConsumerInfo>>;
    /// Deletes a consumer unless it has pending entries.
    fn delete_consumer(
        &self,
        key: StreamKey,
        group: String,
        consumer: String,
    ) -> StreamFuture<'_, ConsumerRemoval>;
    /// Entries above an id, outside any group.
    fn range(
        &self,
        key: StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> StreamFuture<'_, Vec<StreamEntry>>;
    /// Removes the oldest entries down to a bound; how many.
    fn trim(&self, key: StreamKey, bound: TrimBound) -> StreamFuture<'_, u64>;
    /// A page of the streams of some tenants (`None`: all) after a stream,
    /// by (tenant, stream) in byte order, with their groups.
    fn list_streams(
        &self,
        tenants: Option<Vec<String>>,
        after: Option<StreamKey>,
        limit: usize,
    ) -> StreamFuture<'_, StreamPage>;
}

impl<S: StreamStore> ApiStreams for S {
    fn backend(&self) -> &'static str {
        StreamStore::backend(self)
    }

    fn append(
        &self,
        key: StreamKey,
        entries: Vec<NewStreamEntry>,
    ) -> StreamFuture<'_, Vec<StreamEntryId>> {
        Box::pin(async move { StreamStore::append(self, &key, &entries).await })
    }

    fn ensure_group(
        &self,
        key: StreamKey,
        group: String,
        start: GroupStart,
    ) -> StreamFuture<'_, bool> {
        Box::pin(async move { StreamStore::ensure_group(self, &key, &group, start).await })
    }

    fn read_new(&self, key: StreamKey, read: ReadNew) -> StreamFuture<'_, Vec<DeliveredEntry>> {
        Box::pin(async move { StreamStore::read_new(self, &key, &read).await })
    }

    fn claim_idle(&self, key: StreamKey, claim: ClaimIdle) -> StreamFuture<'_, ClaimedEntries> {
        Box::pin(async move { StreamStore::claim_idle(self, &key, &claim).await })
    }

    fn ack(&self, key: StreamKey, group: String, ids: Vec<StreamEntryId>) -> StreamFuture<'_, u64> {
        Box::pin(async move { StreamStore::ack(self, &key, &group, &ids).await })
    }

    fn pending_summary(&self, key: StreamKey, group: String) -> StreamFuture<'_, PendingSummary> {
        Box::pin(async move { StreamStore::pending_summary(self, &key, &group).await })
    }

    fn pending_detail(
        &self,
        key: StreamKey,
        group: String,
        query: PendingQuery,
    ) -> StreamFuture<'_, Vec<PendingDetail>> {
        Box::pin(async move { StreamStore::pending_detail(self, &key, &group, &query).await })
    }

    fn consumers(&self, key: StreamKey, group: String) -> StreamFuture<'_, Vec<ConsumerInfo>> {
        Box::pin(async move { StreamStore::consumers(self, &key, &group).await })
    }

    fn delete_consumer(
        &self,
        key: StreamKey,
        group: String,
        consumer: String,
    ) -> StreamFuture<'_, ConsumerRemoval> {
        Box::pin(async move { StreamStore::delete_consumer(self, &key, &group, &consumer).await })
    }

    fn range(
        &self,
        key: StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> StreamFuture<'_, Vec<StreamEntry>> {
        Box::pin(async move { StreamStore::range(self, &key, after, count).await })
    }

    fn trim(&self, key: StreamKey, bound: TrimBound) -> StreamFuture<'_, u64> {
        Box::pin(async move { StreamStore::trim(self, &key, bound).await })
    }

    fn list_streams(
        &self,
        tenants: Option<Vec<String>>,
        after: Option<StreamKey>,
        limit: usize,
    ) -> StreamFuture<'_, StreamPage> {
        Box::pin(async move {
            StreamStore::list_streams(self, tenants.as_deref(), after.as_ref(), limit).await
        })
    }
}
