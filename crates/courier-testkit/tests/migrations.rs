//! Migrations you can see, on both backends: `migration_status` lists
//! applied and pending migrations with their checksums (the SHA-256 of each
//! migration's SQL as shipped) and creates nothing; a migration run records
//! the checksums, refuses a database whose recorded checksum of an applied
//! migration differs from the binary's (naming it, applying nothing), and
//! records the binary's for rows an older build wrote without one (trust on
//! first use). Each case runs once against a PostgreSQL schema that does not
//! exist yet and once against a fresh SQLite file.

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{Migration, MigrationState, MigrationStatus, OutboxStore, StoreError};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// A database no migration ran on yet, and its backend's raw SQL.
trait Fresh: Sized {
    type Store: OutboxStore;
    /// The bookkeeping table's name.
    const TABLE: &'static str;
    /// The backend's migrations, as shipped.
    const SHIPPED: &'static [Migration];
    /// The SQL file of migration 3, read here from the crate's source tree.
    const THIRD_FILE: &'static str;

    async fn fresh() -> anyhow::Result<Self>;
    fn store(&self) -> &Self::Store;
    async fn status(&self) -> Result<Vec<MigrationStatus>, StoreError>;
    async fn migrate_to(&self, version: i64) -> Result<(), StoreError>;
    async fn schema_version(&self) -> Result<i64, StoreError>;
    async fn execute(&self, sql: &str) -> anyhow::Result<()>;
    async fn text(&self, sql: &str) -> anyhow::Result<Option<String>>;
    /// How many objects (schema, tables, …) exist where Courier's would.
    async fn objects(&self) -> anyhow::Result<i64>;
    async fn finish(self) -> anyhow::Result<()>;
}

struct Pg {
    store: PgStore,
    pool: sqlx::PgPool,
    schema: String,
}

impl Fresh for Pg {
    type Store = PgStore;
    const TABLE: &'static str = "schema_migrations";
    const SHIPPED: &'static [Migration] = courier::postgres::MIGRATIONS;
    const THIRD_FILE: &'static str =
        include_str!("../../courier-postgres/migrations/0003_idle_workers.sql");

    async fn fresh() -> anyhow::Result<Self> {
        let schema = format!("t_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let pool = courier_testkit::pg_pool(&schema, 4).await?;
        let store = PgStore::with_schema(pool.clone(), &schema)?;
        Ok(Self {
            store,
            pool,
            schema,
        })
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    async fn status(&self) -> Result<Vec<MigrationStatus>, StoreError> {
        self.store.migration_status().await
    }

    async fn migrate_to(&self, version: i64) -> Result<(), StoreError> {
        self.store.migrate_to(version).await
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        self.store.schema_version().await
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(sql).execute(&self.pool).await?;
        Ok(())
    }

    async fn text(&self, sql: &str) -> anyhow::Result<Option<String>> {
        Ok(sqlx::query_scalar(sql).fetch_one(&self.pool).await?)
    }

    async fn objects(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = $1)
                  + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = $1)",
        )
        .bind(&self.schema)
        .fetch_one(&self.pool)
        .await?)
    }

    async fn finish(self) -> anyhow::Result<()> {
        self.execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .await?;
        self.pool.close().await;
        Ok(())
    }
}

struct Lite {
    store: SqliteStore,
    pool: sqlx::SqlitePool,
    _dir: tempfile::TempDir,
}

impl Fresh for Lite {
    type Store = SqliteStore;
    const TABLE: &'static str = "courier_schema_migrations";
    const SHIPPED: &'static [Migration] = courier::sqlite::MIGRATIONS;
    const THIRD_FILE: &'static str =
        include_str!("../../courier-sqlite/migrations/0003_tenant_rate_limits.sql");

    async fn fresh() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("courier.db");
        let path = path
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))?;
        let pool = courier::sqlite::connect(path, 2).await?;
        Ok(Self {
            store: SqliteStore::new(pool.clone()),
            pool,
            _dir: dir,
        })
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    async fn status(&self) -> Result<Vec<MigrationStatus>, StoreError> {
        self.store.migration_status().await
    }

    async fn migrate_to(&self, version: i64) -> Result<(), StoreError> {
        self.store.migrate_to(version).await
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        self.store.schema_version().await
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(sql).execute(&self.pool).await?;
        Ok(())
    }

    async fn text(&self, sql: &str) -> anyhow::Result<Option<String>> {
        Ok(sqlx::query_scalar(sql).fetch_one(&self.pool).await?)
    }

    async fn objects(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM sqlite_schema")
            .fetch_one(&self.pool)
            .await?)
    }

    async fn finish(self) -> anyhow::Result<()> {
        self.pool.close().await;
        Ok(())
    }
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn versions_in(status: &[MigrationStatus], state: MigrationState) -> Vec<i64> {
    status
        .iter()
        .filter(|s| s.state == state)
        .map(|s| s.version)
        .collect()
}

fn all(from: i64, to: i64) -> Vec<i64> {
    (from..=to).collect()
}

/// Status on a database never migrated lists every shipped migration
/// pending, with this binary's checksums, and creates nothing.
async fn status_of_a_fresh_database_lists_every_migration_pending_and_creates_nothing<F: Fresh>(
) -> anyhow::Result<()> {
    let db = F::fresh().await?;
    let before = db.objects().await?;
    let status = db.status().await?;
    let last = F::SHIPPED.len() as i64;
    assert_eq!(versions_in(&status, MigrationState::Pending), all(1, last));
    assert_eq!(status.len() as i64, last);
    for (line, shipped) in status.iter().zip(F::SHIPPED) {
        assert_eq!(line.name, shipped.name);
        assert_eq!(line.checksum.as_deref(), Some(shipped.checksum().as_str()));
        assert_eq!(line.recorded_checksum, None);
        assert_eq!(line.applied_at, None);
    }
    assert_eq!(db.objects().await?, before, "status created something");
    assert_eq!(db.schema_version().await?, 0);
    db.finish().await
}

/// After a migration run every migration reads applied, its recorded
/// checksum the SHA-256 of its SQL file as shipped (PostgreSQL's before the
/// schema name is put in).
async fn migrate_records_the_sha256_of_each_migration_as_shipped<F: Fresh>() -> anyhow::Result<()> {
    let db = F::fresh().await?;
    db.store().migrate().await?;
    let status = db.status().await?;
    let last = F::SHIPPED.len() as i64;
    assert_eq!(versions_in(&status, MigrationState::Applied), all(1, last));
    for line in &status {
        assert!(line.applied_at.is_some(), "{line:?}");
        assert!(line.recorded_checksum.is_some(), "{line:?}");
        assert_eq!(line.recorded_checksum, line.checksum, "{line:?}");
    }
    let third = sha256_hex(F::THIRD_FILE);
    assert_eq!(status[2].checksum.as_deref(), Some(third.as_str()));
    let table = F::TABLE;
    assert_eq!(
        db.text(&format!("SELECT checksum FROM {table} WHERE version = 3"))
            .await?,
        Some(third)
    );
    db.finish().await
}

/// A recorded checksum edited after the fact makes the next migration run
/// refuse, naming the migration, and apply nothing (not even the pending
/// ones); status shows that migration changed.
async fn a_changed_migration_is_refused_by_name_and_nothing_is_applied<F: Fresh>(
) -> anyhow::Result<()> {
    let db = F::fresh().await?;
    db.migrate_to(5).await?;
    let table = F::TABLE;
    db.execute(&format!(
        "UPDATE {table} SET checksum = 'edited' WHERE version = 3"
    ))
    .await?;

    let error = match db.store().migrate().await {
        Err(error) => error,
        Ok(()) => anyhow::bail!("a changed migration was not refused"),
    };
    let third = &F::SHIPPED[2];
    let expected = format!(
        "migration 0003 {} was changed after it was applied: recorded checksum edited, \
         this binary has {}",
        third.name,
        third.checksum()
    );
    assert_eq!(error.to_string(), expected);
    assert!(
        matches!(&error, StoreError::MigrationChanged { version: 3, .. }),
        "{error:?}"
    );
    assert_eq!(db.schema_version().await?, 5, "nothing applied");

    let status = db.status().await?;
    assert_eq!(versions_in(&status, MigrationState::Changed), vec![3]);
    assert_eq!(status[2].recorded_checksum.as_deref(), Some("edited"));
    assert_eq!(
        versions_in(&status, MigrationState::Applied),
        vec![1, 2, 4, 5]
    );
    let last = F::SHIPPED.len() as i64;
    assert_eq!(versions_in(&status, MigrationState::Pending), all(6, last));
    // Refused again, still naming it: the recorded checksum was kept.
    assert!(matches!(
        db.store().migrate().await,
        Err(StoreError::MigrationChanged { version: 3, .. })
    ));
    db.finish().await
}

/// A database an older build migrated (its bookkeeping table has no
/// checksum column) reads applied with nothing recorded, then migrates: the
/// pending migrations are applied and every migration gets the binary's
/// checksum recorded (trust on first use).
async fn a_database_migrated_before_checksums_gets_them_recorded<F: Fresh>() -> anyhow::Result<()> {
    let db = F::fresh().await?;
    db.migrate_to(5).await?;
    let table = F::TABLE;
    db.execute(&format!("ALTER TABLE {table} DROP COLUMN checksum"))
        .await?;

    let status = db.status().await?;
    assert_eq!(versions_in(&status, MigrationState::Applied), all(1, 5));
    assert!(status.iter().all(|line| line.recorded_checksum.is_none()));

    db.store().migrate().await?;
    let last = F::SHIPPED.len() as i64;
    assert_eq!(db.schema_version().await?, last);
    let status = db.status().await?;
    assert_eq!(versions_in(&status, MigrationState::Applied), all(1, last));
    for (line, shipped) in status.iter().zip(F::SHIPPED) {
        assert_eq!(
            line.recorded_checksum.as_deref(),
            Some(shipped.checksum().as_str()),
            "{line:?}"
        );
    }
    db.finish().await
}

/// A database a newer build migrated is refused, and status lists the
/// version this binary does not know.
async fn a_newer_database_is_refused_and_status_shows_the_unknown_version<F: Fresh>(
) -> anyhow::Result<()> {
    let db = F::fresh().await?;
    db.store().migrate().await?;
    let table = F::TABLE;
    db.execute(&format!(
        "INSERT INTO {table} (version, name, checksum) VALUES (999, 'future', 'abc')"
    ))
    .await?;
    let last = F::SHIPPED.len() as i64;
    match db.store().migrate().await {
        Err(StoreError::SchemaTooNew { found: 999, known }) => assert_eq!(known, last),
        other => anyhow::bail!("expected SchemaTooNew, got {other:?}"),
    }
    let status = db.status().await?;
    let unknown = status.last().ok_or_else(|| anyhow::anyhow!("no status"))?;
    assert_eq!(unknown.version, 999);
    assert_eq!(unknown.name, "future");
    assert_eq!(unknown.state, MigrationState::Unknown);
    assert_eq!(unknown.checksum, None);
    db.finish().await
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() -> anyhow::Result<()> {
                    super::$case::<super::Pg>().await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() -> anyhow::Result<()> {
                    super::$case::<super::Lite>().await
                }
            )*
        }
    };
}

on_both_backends!(
    status_of_a_fresh_database_lists_every_migration_pending_and_creates_nothing,
    migrate_records_the_sha256_of_each_migration_as_shipped,
    a_changed_migration_is_refused_by_name_and_nothing_is_applied,
    a_database_migrated_before_checksums_gets_them_recorded,
    a_newer_database_is_refused_and_status_shows_the_unknown_version,
);
