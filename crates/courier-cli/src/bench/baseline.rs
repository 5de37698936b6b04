//! The baseline: the same enqueue and drain work as minimal hand-written SQL
//! (`sql/*_baseline_*.sql`), run in the same process on the same database
//! right before Courier, so Courier's numbers read as a ratio to what this
//! machine can do now rather than to a figure from elsewhere.
//!
//! Drain: two connections, each claiming the worker's default batch size of rows at a time with
//! one `DELETE ... RETURNING` statement (on PostgreSQL over
//! `FOR UPDATE SKIP LOCKED`) until the table is empty.

use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{PgPool, SqlitePool};

use super::measure::Counter;
use super::Throughput;

/// Rows one baseline claim takes: 100 (the engine's `WorkerConfig` default
/// batch size), as in every earlier run of the bench so that ratios compare
/// across runs. `Courier::worker` claims 256 on PostgreSQL; the issue's own
/// hand-written figures are for 100 (~58,000/s) and 1,000 (~107,000/s).
fn claim_size() -> i64 {
    i64::try_from(courier::WorkerConfig::default().batch_size).unwrap_or(100)
}

/// Connections draining the baseline queue at once.
pub(crate) const DRAIN_CONNECTIONS: usize = 2;

/// The hand-written queue on one database.
#[derive(Clone)]
pub(crate) enum Baseline {
    /// On PostgreSQL, in the bench schema.
    Postgres {
        /// The bench pool.
        pool: PgPool,
        /// SQL rendered for the bench schema: create, insert one, insert batch, claim.
        sql: [String; 4],
    },
    /// On SQLite, in the bench file.
    Sqlite {
        /// The bench pool.
        pool: SqlitePool,
    },
}

impl Baseline {
    pub(crate) fn postgres(pool: PgPool, schema: &str) -> Self {
        let render = |sql: &str| sql.replace("{schema}", schema);
        Self::Postgres {
            pool,
            sql: [
                render(include_str!("sql/pg_baseline_create.sql")),
                render(include_str!("sql/pg_baseline_insert_one.sql")),
                render(include_str!("sql/pg_baseline_insert_batch.sql")),
                render(include_str!("sql/pg_baseline_claim.sql")),
            ],
        }
    }

    pub(crate) fn sqlite(pool: SqlitePool) -> Self {
        Self::Sqlite { pool }
    }

    /// Creates the baseline table.
    pub(crate) async fn create(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres { pool, sql } => {
                sqlx::query(&sql[0]).execute(pool).await?;
            }
            Self::Sqlite { pool } => {
                sqlx::query(include_str!("sql/sqlite_baseline_create.sql"))
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// Inserts one row in a transaction of its own.
    pub(crate) async fn insert_one(
        &self,
        tenant: &str,
        topic: &str,
        payload: &str,
    ) -> anyhow::Result<()> {
        match self {
            Self::Postgres { pool, sql } => {
                let mut tx = pool.begin().await?;
                sqlx::query(&sql[1])
                    .bind(tenant)
                    .bind(topic)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Self::Sqlite { pool } => {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query(include_str!("sql/sqlite_baseline_insert_one.sql"))
                    .bind(tenant)
                    .bind(topic)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Inserts `rows` (tenant, topic, payload) in one statement and transaction.
    pub(crate) async fn insert_batch(
        &self,
        rows: &[(String, String, String)],
    ) -> anyhow::Result<()> {
        match self {
            Self::Postgres { pool, sql } => {
                let mut tenants = Vec::with_capacity(rows.len());
                let mut topics = Vec::with_capacity(rows.len());
                let mut payloads = Vec::with_capacity(rows.len());
                for (tenant, topic, payload) in rows {
                    tenants.push(tenant.as_str());
                    topics.push(topic.as_str());
                    payloads.push(payload.as_str());
                }
                let mut tx = pool.begin().await?;
                sqlx::query(&sql[2])
                    .bind(&tenants)
                    .bind(&topics)
                    .bind(&payloads)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Self::Sqlite { pool } => {
                let triples = serde_json::to_string(rows).context("encoding a baseline batch")?;
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query(include_str!("sql/sqlite_baseline_insert_batch.sql"))
                    .bind(triples)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Claims and removes up to the worker's default batch size of rows; returns how many.
    async fn claim(&self) -> anyhow::Result<u64> {
        let claimed = match self {
            Self::Postgres { pool, sql } => sqlx::query(&sql[3])
                .bind(claim_size())
                .fetch_all(pool)
                .await?
                .len(),
            Self::Sqlite { pool } => sqlx::query(include_str!("sql/sqlite_baseline_claim.sql"))
                .bind(claim_size())
                .fetch_all(pool)
                .await?
                .len(),
        };
        Ok(u64::try_from(claimed).unwrap_or(u64::MAX))
    }

    /// Drains the queue from [`DRAIN_CONNECTIONS`] connections; `counter`
    /// counts rows as they go.
    pub(crate) async fn drain(
        &self,
        counter: &std::sync::Arc<Counter>,
        timeout: Duration,
    ) -> anyhow::Result<Throughput> {
        let started = Instant::now();
        let mut drainers = tokio::task::JoinSet::new();
        for _ in 0..DRAIN_CONNECTIONS {
            let baseline = self.clone();
            let counter = std::sync::Arc::clone(counter);
            drainers.spawn(async move {
                loop {
                    let claimed = baseline.claim().await?;
                    if claimed == 0 {
                        return anyhow::Ok(());
                    }
                    counter.add(claimed);
                }
            });
        }
        let joined = tokio::time::timeout(timeout, async {
            while let Some(result) = drainers.join_next().await {
                result.context("a baseline drainer panicked")??;
            }
            anyhow::Ok(())
        })
        .await;
        match joined {
            Ok(result) => result?,
            Err(_) => anyhow::bail!("the baseline drain did not finish within {timeout:?}"),
        }
        Ok(Throughput::new(counter.count(), started.elapsed()))
    }
}
