//! [`StreamFixture`] for the SQLite store (a fresh database file per test)
//! and the PostgreSQL store (a fresh schema).
//! Pending entries' delivery times are INTEGER milliseconds on the database
//! clock, so aging them moves those times into the past.

use std::path::PathBuf;
use std::time::Duration;

use std::future::Future;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::OutboxStore;
use courier_core::{
    ClaimIdle, ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry, GroupStart,
    NewStreamEntry, PendingDetail, PendingEntry, PendingQuery, PendingSummary, ReadNew, StoreError,
    StreamEntry, StreamEntryId, StreamKey, StreamPage, StreamStore, TrimBound,
};

use super::StreamFixture;

/// The SQLite store over a fresh, migrated database file in a temporary
/// directory (removed when the fixture is dropped).
pub struct SqliteStreamFixture {
    store: SqliteStore,
    /// The database file.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SqliteStreamFixture {
    fn path_text(&self) -> anyhow::Result<&str> {
        self.path
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))
    }
}

impl StreamFixture for SqliteStreamFixture {
    type Store = SqliteStore;

    async fn fresh() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("courier.db");
        let path_text = path
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))?;
        let store = SqliteStore::new(courier::sqlite::connect(path_text, 8).await?);
        store.migrate().await?;
        Ok(Self {
            store,
            path,
            _dir: dir,
        })
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    async fn open_store(&self) -> anyhow::Result<SqliteStore> {
        Ok(SqliteStore::new(
            courier::sqlite::connect(self.path_text()?, 4).await?,
        ))
    }

    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        let by = i64::try_from(by.as_millis())?;
        sqlx::query(
            "UPDATE stream_pending SET delivered_at = delivered_at - ?4
             WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3",
        )
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .bind(by)
        .execute(self.store.pool())
        .await?;
        Ok(())
    }
}

/// The PostgreSQL store as the suite sees it: appends return once their
/// entries are readable.
///
/// On PostgreSQL an entry becomes readable once no writing transaction older
/// than its appender is open anywhere on the server (see the 0010 migration),
/// and the suite runs beside other tests that hold transactions open. Its
/// cases are written for read-after-write, as Redis and SQLite give it, so
/// this store waits ([`PgStore::wait_until_readable`], at most 30 s) after
/// each append and dead letter; everything else goes straight to the store. The delay itself
/// is tested in `tests/pg_streams.rs`.
#[derive(Clone, Debug)]
pub struct ReadablePgStore(pub PgStore);

/// How long an append of the suite waits to become readable.
const READABLE_WITHIN: Duration = Duration::from_secs(30);

impl StreamStore for ReadablePgStore {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }

    fn reads_ahead(&self) -> usize {
        self.0.reads_ahead()
    }

    async fn append<'c>(
        &'c self,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        let ids = self.0.append(key, entries).await?;
        if let Some(last) = ids.last() {
            if !self.0.wait_until_readable(*last, READABLE_WITHIN).await? {
                return Err(StoreError::Corrupt(format!(
                    "entry {last} was not readable within {READABLE_WITHIN:?}"
                )));
            }
        }
        Ok(ids)
    }

    fn touch<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c {
        self.0.touch(key, group, consumer, ids)
    }

    fn uncount_deliveries<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c {
        self.0.uncount_deliveries(key, group, consumer, ids)
    }

    fn ensure_group<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        start: GroupStart,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c {
        self.0.ensure_group(key, group, start)
    }

    fn read_new<'c>(
        &'c self,
        key: &'c StreamKey,
        read: &'c ReadNew,
    ) -> impl Future<Output = Result<Vec<DeliveredEntry>, StoreError>> + Send + 'c {
        self.0.read_new(key, read)
    }

    fn read_pending<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        after: StreamEntryId,
        count: usize,
    ) -> impl Future<Output = Result<Vec<PendingEntry>, StoreError>> + Send + 'c {
        self.0.read_pending(key, group, consumer, after, count)
    }

    fn claim_idle<'c>(
        &'c self,
        key: &'c StreamKey,
        claim: &'c ClaimIdle,
    ) -> impl Future<Output = Result<ClaimedEntries, StoreError>> + Send + 'c {
        self.0.claim_idle(key, claim)
    }

    fn ack<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c {
        self.0.ack(key, group, ids)
    }

    fn lag<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl std::future::Future<Output = Result<Option<u64>, StoreError>> + Send + 'c {
        self.0.lag(key, group)
    }

    fn visibility_wait<'c>(
        &'c self,
        key: &'c StreamKey,
    ) -> impl std::future::Future<Output = Result<Option<Duration>, StoreError>> + Send + 'c {
        self.0.visibility_wait(key)
    }

    fn pending_summary<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl Future<Output = Result<PendingSummary, StoreError>> + Send + 'c {
        self.0.pending_summary(key, group)
    }

    fn pending_detail<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        query: &'c PendingQuery,
    ) -> impl Future<Output = Result<Vec<PendingDetail>, StoreError>> + Send + 'c {
        self.0.pending_detail(key, group, query)
    }

    fn consumers<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl Future<Output = Result<Vec<ConsumerInfo>, StoreError>> + Send + 'c {
        self.0.consumers(key, group)
    }

    fn delete_consumer<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
    ) -> impl Future<Output = Result<ConsumerRemoval, StoreError>> + Send + 'c {
        self.0.delete_consumer(key, group, consumer)
    }

    fn range<'c>(
        &'c self,
        key: &'c StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send + 'c {
        self.0.range(key, after, count)
    }

    fn trim<'c>(
        &'c self,
        key: &'c StreamKey,
        bound: TrimBound,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c {
        self.0.trim(key, bound)
    }

    async fn dead_letter<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        entry: &'c DeliveredEntry,
        errors: &'c [String],
    ) -> Result<bool, StoreError> {
        let dead = self.0.dead_letter(key, group, entry, errors).await?;
        // The dead letter is an append too: wait for the newest entry.
        let newest: i64 = sqlx::query_scalar(&format!(
            "SELECT coalesce(max(major), 0) FROM {}.stream_entries",
            self.0.schema()
        ))
        .fetch_one(self.0.pool())
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let newest = StreamEntryId::new(u64::try_from(newest).unwrap_or(0), 0);
        if !self.0.wait_until_readable(newest, READABLE_WITHIN).await? {
            return Err(StoreError::Corrupt(format!(
                "entry {newest} was not readable within {READABLE_WITHIN:?}"
            )));
        }
        Ok(dead)
    }

    fn list_streams<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StreamKey>,
        limit: usize,
    ) -> impl Future<Output = Result<StreamPage, StoreError>> + Send + 'c {
        self.0.list_streams(tenants, after, limit)
    }
}

/// The PostgreSQL store over a fresh, migrated schema of its own.
pub struct PgStreamFixture {
    store: ReadablePgStore,
    /// The schema the store's tables are in.
    pub schema: String,
}

impl StreamFixture for PgStreamFixture {
    type Store = ReadablePgStore;

    async fn fresh() -> anyhow::Result<Self> {
        let fixture = crate::PgFixture::new().await?;
        let store = crate::Backend::courier(&fixture).store().clone();
        Ok(Self {
            store: ReadablePgStore(store),
            schema: fixture.schema.clone(),
        })
    }

    fn store(&self) -> &ReadablePgStore {
        &self.store
    }

    async fn open_store(&self) -> anyhow::Result<ReadablePgStore> {
        let pool = crate::pg_pool(&self.schema, 4).await?;
        Ok(ReadablePgStore(PgStore::with_schema(pool, &self.schema)?))
    }

    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        let by = i64::try_from(by.as_millis())?;
        sqlx::query(&format!(
            "UPDATE {}.stream_pending
             SET delivered_at = delivered_at - $4::bigint * interval '1 millisecond'
             WHERE tenant = $1 AND stream = $2 AND grp = $3",
            self.schema
        ))
        .bind(key.tenant())
        .bind(key.stream())
        .bind(group)
        .bind(by)
        .execute(self.store.0.pool())
        .await?;
        Ok(())
    }
}

/// The Redis server tests use: `REDIS_URL`, or the project machines' default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The Redis store under a fresh key prefix (`t_{random}:`) of its own, so
/// tests share the server without sharing keys.
pub struct RedisStreamFixture {
    store: courier::redis::RedisStreamStore,
    /// The key prefix every stream of the test lives under.
    pub prefix: String,
}

impl StreamFixture for RedisStreamFixture {
    type Store = courier::redis::RedisStreamStore;

    async fn fresh() -> anyhow::Result<Self> {
        let prefix = format!("t_{}:", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        let store = courier::redis::RedisStreamStore::connect(&redis_url(), &prefix).await?;
        Ok(Self { store, prefix })
    }

    fn store(&self) -> &courier::redis::RedisStreamStore {
        &self.store
    }

    async fn open_store(&self) -> anyhow::Result<courier::redis::RedisStreamStore> {
        Ok(courier::redis::RedisStreamStore::connect(&redis_url(), &self.prefix).await?)
    }

    /// Sets each pending entry's idle time to `by` (Redis keeps idle as a
    /// delivery time it can only set, with `XCLAIM … IDLE … JUSTID`, to the
    /// entry's own consumer: neither owner nor delivery count changes).
    async fn age_pending(&self, key: &StreamKey, group: &str, by: Duration) -> anyhow::Result<()> {
        use courier::redis::redis;
        let mut conn = self.store.connection();
        let redis_key = self.store.redis_key(key);
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&redis_key)
            .arg(group)
            .arg("-")
            .arg("+")
            .arg(100_000)
            .query_async(&mut conn)
            .await?;
        for (id, consumer, _idle, _deliveries) in pending {
            let _: redis::Value = redis::cmd("XCLAIM")
                .arg(&redis_key)
                .arg(group)
                .arg(&consumer)
                .arg(0)
                .arg(&id)
                .arg("IDLE")
                .arg(u64::try_from(by.as_millis())?)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }
}
