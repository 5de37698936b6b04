//! Versioned migrations shipped in this crate, applied under an advisory lock
//! so that several processes starting at once migrate exactly once. The
//! runner's own SQL (the lock, the `schema_migrations` table) is in
//! `queries/migrate_*.sql`.

use courier_core::StoreError;
use sqlx::PgPool;

use crate::error::map;
use crate::queries::Queries;

/// (version, name, SQL with `{schema}` placeholders), oldest first.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "outbox", include_str!("../migrations/0001_outbox.sql")),
    (
        2,
        "fast_name_checks",
        include_str!("../migrations/0002_fast_name_checks.sql"),
    ),
    (
        3,
        "idle_workers",
        include_str!("../migrations/0003_idle_workers.sql"),
    ),
    (
        4,
        "ordering_locks",
        include_str!("../migrations/0004_ordering_locks.sql"),
    ),
    (
        5,
        "lock_namespaces",
        include_str!("../migrations/0005_lock_namespaces.sql"),
    ),
    (
        6,
        "tenant_rate_limits",
        include_str!("../migrations/0006_tenant_rate_limits.sql"),
    ),
    (
        7,
        "fan_out_in_commit_order",
        include_str!("../migrations/0007_fan_out_in_commit_order.sql"),
    ),
    (
        8,
        "maintenance_leader",
        include_str!("../migrations/0008_maintenance_leader.sql"),
    ),
    (
        9,
        "claim_marks",
        include_str!("../migrations/0009_claim_marks.sql"),
    ),
    (
        10,
        "streams",
        include_str!("../migrations/0010_streams.sql"),
    ),
    (
        11,
        "stream_entry_origin",
        include_str!("../migrations/0011_stream_entry_origin.sql"),
    ),
    (
        12,
        "listing_order_indexes",
        include_str!("../migrations/0012_listing_order_indexes.sql"),
    ),
    (
        13,
        "plain_completions",
        include_str!("../migrations/0013_plain_completions.sql"),
    ),
    (
        14,
        "owed_by_fan_out_time",
        include_str!("../migrations/0014_owed_by_fan_out_time.sql"),
    ),
    (
        15,
        "error_fingerprints",
        include_str!("../migrations/0015_error_fingerprints.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 15;

/// Applies every migration newer than the schema's, in one transaction under
/// the migration lock.
pub(crate) async fn run(pool: &PgPool, queries: &Queries, schema: &str) -> Result<(), StoreError> {
    run_to(pool, queries, schema, SCHEMA_VERSION).await
}

/// Applies the migrations newer than the schema's up to `target` (at most
/// [`SCHEMA_VERSION`]), in one transaction under the migration lock.
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
    let current: Option<i64> = sqlx::query_scalar(&queries.migrate_version)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for &(version, name, sql) in MIGRATIONS {
        if version <= current || version > target {
            continue;
        }
        tracing::info!(schema, version, name, "applying migration");
        let rendered = sql.replace("{schema}", schema);
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&rendered))
            .await
            .map_err(map)?;
        sqlx::query(&queries.migrate_record)
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)
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
