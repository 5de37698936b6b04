//! Versioned migrations shipped in this crate.
//!
//! All pending migrations and their bookkeeping run in one `BEGIN IMMEDIATE`
//! transaction: SQLite's DDL is transactional, so a failed migration leaves
//! the file as it was, and the write lock taken at `BEGIN` makes several
//! processes starting at once migrate exactly once (the others wait on the
//! busy timeout, then find nothing to do).
//!
//! `courier_schema_migrations` records each applied migration's checksum
//! (see [`courier_core::Migration`]). Before applying anything the runner
//! compares every recorded checksum with this build's and refuses, applying
//! nothing, when one differs ([`StoreError::MigrationChanged`]) or the file
//! records a version this build does not ship ([`StoreError::SchemaTooNew`]).
//! Rows an older build wrote without a checksum (it had no such column: the
//! runner adds it) get this build's first (trust on first use), in the same
//! transaction: a refusal rolls that back too.

use chrono::DateTime;
use courier_core::{AppliedMigration, Migration, MigrationStatus, StoreError};
use sqlx::{SqliteConnection, SqlitePool};

use crate::error::map;

/// The migrations this build ships, oldest first, each with the checksum
/// of its SQL text ([`Migration::checksum`]).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "snoozes",
        sql: include_str!("../migrations/0002_snoozes.sql"),
    },
    Migration {
        version: 3,
        name: "tenant_rate_limits",
        sql: include_str!("../migrations/0003_tenant_rate_limits.sql"),
    },
    Migration {
        version: 4,
        name: "maintenance_leader",
        sql: include_str!("../migrations/0004_maintenance_leader.sql"),
    },
    Migration {
        version: 5,
        name: "streams",
        sql: include_str!("../migrations/0005_streams.sql"),
    },
    Migration {
        version: 6,
        name: "listing_order_indexes",
        sql: include_str!("../migrations/0006_listing_order_indexes.sql"),
    },
    Migration {
        version: 7,
        name: "plain_completions",
        sql: include_str!("../migrations/0007_plain_completions.sql"),
    },
    Migration {
        version: 8,
        name: "removed_topics",
        sql: include_str!("../migrations/0008_removed_topics.sql"),
    },
    Migration {
        version: 9,
        name: "error_fingerprints",
        sql: include_str!("../migrations/0009_error_fingerprints.sql"),
    },
    Migration {
        version: 10,
        name: "priorities",
        sql: include_str!("../migrations/0010_priorities.sql"),
    },
    Migration {
        version: 11,
        name: "uncounted_deliveries",
        sql: include_str!("../migrations/0011_uncounted_deliveries.sql"),
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 11;

/// The bookkeeping table, named so that it cannot collide with an
/// application's own `schema_migrations` in a shared file. `checksum` is
/// NULL only for rows an older build wrote.
const BOOTSTRAP: &str = "CREATE TABLE IF NOT EXISTS courier_schema_migrations (
  version    INTEGER NOT NULL PRIMARY KEY,
  name       TEXT    NOT NULL,
  applied_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  checksum   TEXT
) STRICT";

/// Whether the table has the `checksum` column (an older build's has not;
/// SQLite has no `ADD COLUMN IF NOT EXISTS`).
const HAS_CHECKSUM: &str =
    "SELECT count(*) FROM pragma_table_info('courier_schema_migrations') WHERE name = 'checksum'";

/// Upgrades an older build's table; its rows keep a NULL checksum until
/// [`TRUST`] records this build's.
const ADD_CHECKSUM: &str = "ALTER TABLE courier_schema_migrations ADD COLUMN checksum TEXT";

/// Records this build's checksum ?2 for applied migration ?1 when none was
/// recorded (trust on first use); a recorded one is kept, so an edited
/// migration is still found.
const TRUST: &str =
    "UPDATE courier_schema_migrations SET checksum = ?2 WHERE version = ?1 AND checksum IS NULL";

/// Every applied migration, oldest first; `applied_at` in milliseconds since the epoch.
const APPLIED: &str = "SELECT version, name, checksum, applied_at
FROM courier_schema_migrations ORDER BY version";

/// [`APPLIED`] for an older build's table, which has no checksum column
/// (`courier migrate status` reads it without adding the column).
const APPLIED_WITHOUT_CHECKSUMS: &str = "SELECT version, name, NULL AS checksum, applied_at
FROM courier_schema_migrations ORDER BY version";

const SELECT_CURRENT: &str = "SELECT max(version) FROM courier_schema_migrations";

const RECORD: &str =
    "INSERT INTO courier_schema_migrations (version, name, checksum) VALUES (?1, ?2, ?3)";

const TABLE_EXISTS: &str =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'courier_schema_migrations'";

/// Applies every migration newer than the file's, in one `BEGIN IMMEDIATE`
/// transaction, after checking the applied ones (see the module doc).
pub(crate) async fn run(pool: &SqlitePool) -> Result<(), StoreError> {
    run_to(pool, SCHEMA_VERSION).await
}

/// Applies the migrations newer than the schema's up to `target` (at most
/// [`SCHEMA_VERSION`]), in one `BEGIN IMMEDIATE` transaction, after checking
/// every applied one (see the module doc).
pub(crate) async fn run_to(pool: &SqlitePool, target: i64) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(BOOTSTRAP))
        .await
        .map_err(map)?;
    if !has_checksum_column(&mut tx).await? {
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(ADD_CHECKSUM))
            .await
            .map_err(map)?;
    }
    for migration in MIGRATIONS {
        sqlx::query(TRUST)
            .bind(migration.version)
            .bind(migration.checksum())
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    let applied = applied(&mut tx, APPLIED).await?;
    // Dropping `tx` on a refusal rolls back the bootstrap and the trust.
    courier_core::check_applied(MIGRATIONS, &applied)?;
    for migration in MIGRATIONS {
        if migration.version > target || applied.iter().any(|a| a.version == migration.version) {
            continue;
        }
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(migration.sql))
            .await
            .map_err(map)?;
        sqlx::query(RECORD)
            .bind(migration.version)
            .bind(migration.name)
            .bind(migration.checksum())
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)
}

async fn has_checksum_column(conn: &mut SqliteConnection) -> Result<bool, StoreError> {
    let count: i64 = sqlx::query_scalar(HAS_CHECKSUM)
        .fetch_one(conn)
        .await
        .map_err(map)?;
    Ok(count > 0)
}

/// Every migration recorded, oldest first, read with `query` ([`APPLIED`]
/// or [`APPLIED_WITHOUT_CHECKSUMS`]).
async fn applied(
    conn: &mut SqliteConnection,
    query: &str,
) -> Result<Vec<AppliedMigration>, StoreError> {
    let rows: Vec<(i64, String, Option<String>, i64)> =
        sqlx::query_as(query).fetch_all(conn).await.map_err(map)?;
    rows.into_iter()
        .map(|(version, name, checksum, applied_at)| {
            let applied_at = DateTime::from_timestamp_millis(applied_at).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "migration {version} was applied at {applied_at} ms, out of range"
                ))
            })?;
            Ok(AppliedMigration {
                version,
                name,
                checksum,
                applied_at,
            })
        })
        .collect()
}

/// Every migration this build ships and every one the file records, with
/// its state. Reads only: a file never migrated lists every migration
/// pending, and nothing is created in it.
pub(crate) async fn status(pool: &SqlitePool) -> Result<Vec<MigrationStatus>, StoreError> {
    let mut conn = pool.acquire().await.map_err(map)?;
    let exists: i64 = sqlx::query_scalar(TABLE_EXISTS)
        .fetch_one(&mut *conn)
        .await
        .map_err(map)?;
    let applied = if exists == 0 {
        Vec::new()
    } else if has_checksum_column(&mut conn).await? {
        applied(&mut conn, APPLIED).await?
    } else {
        applied(&mut conn, APPLIED_WITHOUT_CHECKSUMS).await?
    };
    Ok(courier_core::migration_status(MIGRATIONS, &applied))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps_up_to_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        let expected: Vec<i64> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(versions, expected);
    }
}
