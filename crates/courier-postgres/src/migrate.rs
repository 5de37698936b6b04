//! Versioned migrations shipped in this crate, applied under an advisory lock
//! so that several processes starting at once migrate exactly once. The
//! runner's own SQL (the lock, the `schema_migrations` table) is in
//! `queries/migrate_*.sql`.
//!
//! `schema_migrations` records each applied migration's checksum (see
//! [`courier_core::Migration`]). Before applying anything the runner
//! compares every recorded checksum with this build's and refuses, applying
//! nothing, when one differs ([`StoreError::MigrationChanged`]) or the
//! database records a version this build does not ship
//! ([`StoreError::SchemaTooNew`]). Rows an older build wrote without a
//! checksum get this build's first (trust on first use), in the same
//! transaction: a refusal rolls that back too.

use chrono::{DateTime, Utc};
use courier_core::{AppliedMigration, Migration, MigrationStatus, StoreError};
use sqlx::{PgConnection, PgPool};

use crate::error::map;
use crate::queries::Queries;

/// The migrations this build ships, oldest first: their SQL has `{schema}`
/// placeholders, and their checksums ([`Migration::checksum`]) are taken
/// of that text, so they are the same for every schema.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "fast_name_checks",
        sql: include_str!("../migrations/0002_fast_name_checks.sql"),
    },
    Migration {
        version: 3,
        name: "idle_workers",
        sql: include_str!("../migrations/0003_idle_workers.sql"),
    },
    Migration {
        version: 4,
        name: "ordering_locks",
        sql: include_str!("../migrations/0004_ordering_locks.sql"),
    },
    Migration {
        version: 5,
        name: "lock_namespaces",
        sql: include_str!("../migrations/0005_lock_namespaces.sql"),
    },
    Migration {
        version: 6,
        name: "tenant_rate_limits",
        sql: include_str!("../migrations/0006_tenant_rate_limits.sql"),
    },
    Migration {
        version: 7,
        name: "fan_out_in_commit_order",
        sql: include_str!("../migrations/0007_fan_out_in_commit_order.sql"),
    },
    Migration {
        version: 8,
        name: "maintenance_leader",
        sql: include_str!("../migrations/0008_maintenance_leader.sql"),
    },
    Migration {
        version: 9,
        name: "claim_marks",
        sql: include_str!("../migrations/0009_claim_marks.sql"),
    },
    Migration {
        version: 10,
        name: "streams",
        sql: include_str!("../migrations/0010_streams.sql"),
    },
    Migration {
        version: 11,
        name: "stream_entry_origin",
        sql: include_str!("../migrations/0011_stream_entry_origin.sql"),
    },
    Migration {
        version: 12,
        name: "listing_order_indexes",
        sql: include_str!("../migrations/0012_listing_order_indexes.sql"),
    },
    Migration {
        version: 13,
        name: "plain_completions",
        sql: include_str!("../migrations/0013_plain_completions.sql"),
    },
    Migration {
        version: 14,
        name: "owed_by_fan_out_time",
        sql: include_str!("../migrations/0014_owed_by_fan_out_time.sql"),
    },
    Migration {
        version: 15,
        name: "error_fingerprints",
        sql: include_str!("../migrations/0015_error_fingerprints.sql"),
    },
    Migration {
        version: 16,
        name: "priorities",
        sql: include_str!("../migrations/0016_priorities.sql"),
    },
    Migration {
        version: 17,
        name: "stream_receipt_runs",
        sql: include_str!("../migrations/0017_stream_receipt_runs.sql"),
    },
    Migration {
        version: 18,
        name: "relayed_entries",
        sql: include_str!("../migrations/0018_relayed_entries.sql"),
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 18;

/// Applies every migration newer than the schema's, in one transaction under
/// the migration lock, after checking the applied ones (see the module doc).
pub(crate) async fn run(pool: &PgPool, queries: &Queries, schema: &str) -> Result<(), StoreError> {
    run_to(pool, queries, schema, SCHEMA_VERSION).await
}

/// Applies the migrations newer than the schema's up to `target` (at most
/// [`SCHEMA_VERSION`]), in one transaction under the migration lock, after
/// checking every applied one (see the module doc).
pub(crate) async fn run_to(
    pool: &PgPool,
    queries: &Queries,
    schema: &str,
    target: i64,
) -> Result<(), StoreError> {
    let mut tx = crate::outbox::begin(pool, None).await?;
    sqlx::query(&queries.migrate_timeouts_off)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    sqlx::query(&queries.migrate_lock)
        .bind(format!("courier-migrate:{schema}"))
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&queries.migrate_bootstrap))
        .await
        .map_err(map)?;
    let (versions, checksums): (Vec<i64>, Vec<String>) =
        MIGRATIONS.iter().map(|m| (m.version, m.checksum())).unzip();
    sqlx::query(&queries.migrate_trust)
        .bind(&versions)
        .bind(&checksums)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let applied = applied(&mut tx, queries).await?;
    // Dropping `tx` on a refusal rolls back the bootstrap and the trust.
    courier_core::check_applied(MIGRATIONS, &applied)?;
    for migration in MIGRATIONS {
        if migration.version > target || applied.iter().any(|a| a.version == migration.version) {
            continue;
        }
        let (version, name) = (migration.version, migration.name);
        tracing::info!(schema, version, name, "applying migration");
        let rendered = migration.sql.replace("{schema}", schema);
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&rendered))
            .await
            .map_err(map)?;
        sqlx::query(&queries.migrate_record)
            .bind(version)
            .bind(name)
            .bind(migration.checksum())
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)
}

/// Every migration recorded in `schema_migrations`, oldest first.
async fn applied(
    conn: &mut PgConnection,
    queries: &Queries,
) -> Result<Vec<AppliedMigration>, StoreError> {
    let rows: Vec<(i64, String, Option<String>, DateTime<Utc>)> =
        sqlx::query_as(&queries.migrate_applied)
            .fetch_all(conn)
            .await
            .map_err(map)?;
    Ok(rows
        .into_iter()
        .map(|(version, name, checksum, applied_at)| AppliedMigration {
            version,
            name,
            checksum,
            applied_at,
        })
        .collect())
}

/// Every migration this build ships and every one the schema records, with
/// its state. Reads only: a schema never migrated (or missing) lists every
/// migration pending and is not created.
pub(crate) async fn status(
    pool: &PgPool,
    queries: &Queries,
    schema: &str,
) -> Result<Vec<MigrationStatus>, StoreError> {
    let exists: bool = sqlx::query_scalar(&queries.migrate_table_exists)
        .bind(schema)
        .fetch_one(pool)
        .await
        .map_err(map)?;
    let applied = if exists {
        let mut conn = pool.acquire().await.map_err(map)?;
        applied(&mut conn, queries).await?
    } else {
        Vec::new()
    };
    Ok(courier_core::migration_status(MIGRATIONS, &applied))
}

/// The schema version found in the database (0 when never migrated).
pub(crate) async fn current(
    pool: &PgPool,
    queries: &Queries,
    schema: &str,
) -> Result<i64, StoreError> {
    let exists: bool = sqlx::query_scalar(&queries.migrate_table_exists)
        .bind(schema)
        .fetch_one(pool)
        .await
        .map_err(map)?;
    if !exists {
        return Ok(0);
    }
    let version: Option<i64> = sqlx::query_scalar(&queries.migrate_version)
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
