//! [`StoreFixture`] for the PostgreSQL store (a fresh schema) and the SQLite
//! store (a fresh file). The two dialects differ in how they keep time:
//! PostgreSQL `timestamptz`, SQLite INTEGER milliseconds since the epoch,
//! both compared with the database clock.

use std::time::Duration;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{EnqueueOutcome, NewMessage, OutboxStore};
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::ConnectOptions;

use super::helpers::literal;
use super::{HeldSnapshot, SnapshotConnection, StoreFixture};
use crate::{Backend, PgFixture, SqliteFixture};

fn millis(duration: Duration) -> u128 {
    duration.as_millis()
}

impl StoreFixture for PgFixture {
    type Store = PgStore;
    const MIGRATIONS_TABLE: &'static str = "schema_migrations";
    const SCHEMA_VERSION: i64 = courier::postgres::SCHEMA_VERSION;

    async fn fresh() -> anyhow::Result<Self> {
        PgFixture::new().await
    }

    fn store(&self) -> &PgStore {
        Backend::courier(self).store()
    }

    async fn open_store(&self, max_connections: u32) -> anyhow::Result<PgStore> {
        let pool = crate::pg_pool(&self.schema, max_connections).await?;
        Ok(PgStore::with_schema(pool, &self.schema)?)
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        Backend::execute(self, sql).await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Backend::scalar(self, sql).await
    }

    async fn texts(&self, sql: &str) -> anyhow::Result<Vec<String>> {
        Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
    }

    async fn enqueue_in_transaction(
        &self,
        messages: &[NewMessage],
        commit: bool,
    ) -> anyhow::Result<Vec<EnqueueOutcome>> {
        let mut tx = self.pool.begin().await?;
        let outcomes = self.store().enqueue_batch(&mut tx, messages).await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(outcomes)
    }

    fn expire_leases_sql(&self, subscription: &str) -> String {
        format!(
            "UPDATE {}.deliveries SET lease_expires_at = clock_timestamp() - interval '1 second'
             WHERE state = 'running' AND subscription = {}",
            self.schema,
            literal(subscription)
        )
    }

    async fn expire_leases(&self, subscription: &str) -> anyhow::Result<u64> {
        Backend::execute(self, &self.expire_leases_sql(subscription)).await
    }

    async fn pass_time(&self, by: Duration) -> anyhow::Result<()> {
        let by = format!("interval '{} milliseconds'", millis(by));
        let schema = &self.schema;
        Backend::execute(
            self,
            &format!(
                "UPDATE {schema}.deliveries SET available_at = available_at - {by},
                   lease_expires_at = lease_expires_at - {by}, dead_at = dead_at - {by};
                 UPDATE {schema}.messages SET created_at = created_at - {by};
                 UPDATE {schema}.receipts SET completed_at = completed_at - {by};"
            ),
        )
        .await?;
        Ok(())
    }

    async fn hold_snapshot(&self) -> anyhow::Result<HeldSnapshot> {
        let options: PgConnectOptions = crate::database_url().parse()?;
        let mut conn = options
            .options([("search_path", self.schema.as_str())])
            .connect()
            .await?;
        // The snapshot is taken by the transaction's first read.
        sqlx::Executor::execute(
            &mut conn,
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM deliveries",
        )
        .await?;
        Ok(HeldSnapshot {
            connection: SnapshotConnection::Postgres(conn),
        })
    }
}

impl StoreFixture for SqliteFixture {
    type Store = SqliteStore;
    const MIGRATIONS_TABLE: &'static str = "courier_schema_migrations";
    const SCHEMA_VERSION: i64 = courier::sqlite::SCHEMA_VERSION;

    async fn fresh() -> anyhow::Result<Self> {
        SqliteFixture::new().await
    }

    fn store(&self) -> &SqliteStore {
        Backend::courier(self).store()
    }

    async fn open_store(&self, max_connections: u32) -> anyhow::Result<SqliteStore> {
        let path = self
            .path
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))?;
        Ok(SqliteStore::new(
            courier::sqlite::connect(path, max_connections).await?,
        ))
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        Backend::execute(self, sql).await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Backend::scalar(self, sql).await
    }

    async fn texts(&self, sql: &str) -> anyhow::Result<Vec<String>> {
        Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
    }

    async fn enqueue_in_transaction(
        &self,
        messages: &[NewMessage],
        commit: bool,
    ) -> anyhow::Result<Vec<EnqueueOutcome>> {
        // BEGIN IMMEDIATE, as the store asks of producers.
        let mut tx = self.store().begin().await?;
        let outcomes = self.store().enqueue_batch(&mut tx, messages).await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(outcomes)
    }

    fn expire_leases_sql(&self, subscription: &str) -> String {
        // Times are INTEGER milliseconds on the database clock.
        format!(
            "UPDATE deliveries
             SET lease_expires_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - 1000
             WHERE state = 'running' AND subscription = {}",
            literal(subscription)
        )
    }

    async fn expire_leases(&self, subscription: &str) -> anyhow::Result<u64> {
        Backend::execute(self, &self.expire_leases_sql(subscription)).await
    }

    async fn pass_time(&self, by: Duration) -> anyhow::Result<()> {
        let by = millis(by);
        Backend::execute(
            self,
            &format!(
                "UPDATE deliveries SET available_at = available_at - {by},
                   lease_expires_at = lease_expires_at - {by}, dead_at = dead_at - {by};
                 UPDATE messages SET created_at = created_at - {by};
                 UPDATE receipts SET completed_at = completed_at - {by};"
            ),
        )
        .await?;
        Ok(())
    }

    async fn hold_snapshot(&self) -> anyhow::Result<HeldSnapshot> {
        let mut conn = SqliteConnectOptions::new()
            .filename(&self.path)
            .connect()
            .await?;
        // A deferred transaction's first read starts the snapshot.
        sqlx::Executor::execute(&mut conn, "BEGIN; SELECT count(*) FROM deliveries").await?;
        Ok(HeldSnapshot {
            connection: SnapshotConnection::Sqlite(conn),
        })
    }
}
