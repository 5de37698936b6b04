//! Versioned migrations shipped in this crate.
//!
//! All pending migrations and their bookkeeping run in one `BEGIN IMMEDIATE`
//! transaction: SQLite's DDL is transactional, so a failed migration leaves
//! the file as it was, and the write lock taken at `BEGIN` makes several
//! processes starting at once migrate exactly once (the others wait on the
//! busy timeout, then find nothing to do).

use courier_core::StoreError;
use sqlx::SqlitePool;

use crate::error::map;

/// (version, name, SQL), oldest first.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "outbox", include_str!("../migrations/0001_outbox.sql")),
    (2, "snoozes", include_str!("../migrations/0002_snoozes.sql")),
    (
        3,
        "tenant_rate_limits",
        include_str!("../migrations/0003_tenant_rate_limits.sql"),
    ),
    (
        4,
        "maintenance_leader",
        include_str!("../migrations/0004_maintenance_leader.sql"),
    ),
    (5, "streams", include_str!("../migrations/0005_streams.sql")),
    (
        6,
        "listing_order_indexes",
        include_str!("../migrations/0006_listing_order_indexes.sql"),
    ),
    (
        7,
        "plain_completions",
        include_str!("../migrations/0007_plain_completions.sql"),
    ),
    (
        8,
        "removed_topics",
        include_str!("../migrations/0008_removed_topics.sql"),
    ),
    (
        9,
        "error_fingerprints",
        include_str!("../migrations/0009_error_fingerprints.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 9;

/// The bookkeeping table, named so that it cannot collide with an
/// application's own `schema_migrations` in a shared file.
const BOOTSTRAP: &str = "CREATE TABLE IF NOT EXISTS courier_schema_migrations (
  version    INTEGER NOT NULL PRIMARY KEY,
  name       TEXT    NOT NULL,
  applied_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
) STRICT";

const SELECT_CURRENT: &str = "SELECT max(version) FROM courier_schema_migrations";

const RECORD: &str = "INSERT INTO courier_schema_migrations (version, name) VALUES (?1, ?2)";

const TABLE_EXISTS: &str =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'courier_schema_migrations'";

pub(crate) async fn run(pool: &SqlitePool) -> Result<(), StoreError> {
    run_to(pool, SCHEMA_VERSION).await
}

/// Applies the migrations newer than the schema's up to `target` (at most
/// [`SCHEMA_VERSION`]), in one `BEGIN IMMEDIATE` transaction.
pub(crate) async fn run_to(pool: &SqlitePool, target: i64) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(BOOTSTRAP))
        .await
        .map_err(map)?;
    let current: Option<i64> = sqlx::query_scalar(SELECT_CURRENT)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        // Dropping `tx` rolls back the (empty) transaction.
        return Err(StoreError::SchemaTooNew {
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for &(version, name, sql) in MIGRATIONS {
        if version <= current || version > target {
            continue;
        }
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(sql))
            .await
            .map_err(map)?;
        sqlx::query(RECORD)
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)
}

/// The schema version found in the database (0 when never migrated).
pub(crate) async fn current(pool: &SqlitePool) -> Result<i64, StoreError> {
    let exists: i64 = sqlx::query_scalar(TABLE_EXISTS)
        .fetch_one(pool)
        .await
        .map_err(map)?;
    if exists == 0 {
        return Ok(0);
    }
    let version: Option<i64> = sqlx::query_scalar(SELECT_CURRENT)
        .fetch_one(pool)
        .await
        .map_err(map)?;
    Ok(version.unwrap_or(0))
}
