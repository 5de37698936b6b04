//! [`StreamFixture`] for the SQLite store: a fresh database file per test.
//! Pending entries' delivery times are INTEGER milliseconds on the database
//! clock, so aging them moves those times into the past.

use std::path::PathBuf;
use std::time::Duration;

use courier::sqlite::SqliteStore;
use courier::OutboxStore;
use courier_core::StreamKey;

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
