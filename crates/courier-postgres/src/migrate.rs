//! Versioned migrations shipped in this crate, applied under an advisory lock
//! so that several processes starting at once migrate exactly once.

use courier_core::StoreError;
use sqlx::PgPool;

use crate::error::map;

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
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 8;

pub(crate) async fn run(pool: &PgPool, schema: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(map)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("courier-migrate:{schema}"))
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let bootstrap = format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
           version bigint PRIMARY KEY,
           name text NOT NULL,
           applied_at timestamptz NOT NULL DEFAULT now());"
    );
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&bootstrap))
        .await
        .map_err(map)?;
    let select_current = format!("SELECT max(version) FROM {schema}.schema_migrations");
    let current: Option<i64> = sqlx::query_scalar(&select_current)
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
        if version <= current {
            continue;
        }
        tracing::info!(schema, version, name, "applying migration");
        let rendered = sql.replace("{schema}", schema);
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&rendered))
            .await
            .map_err(map)?;
        let record =
            format!("INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)");
        sqlx::query(&record)
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)
}

/// The schema version found in the database (0 when never migrated).
pub(crate) async fn current(pool: &PgPool, schema: &str) -> Result<i64, StoreError> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .map_err(map)?;
    if !exists {
        return Ok(0);
    }
    let version: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM {schema}.schema_migrations"
    ))
    .fetch_one(pool)
    .await
    .map_err(map)?;
    Ok(version.unwrap_or(0))
}
