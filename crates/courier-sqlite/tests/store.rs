//! What only the SQLite store does: its file (WAL mode, the fan-out
//! trigger, a fresh file's schema version), its column encodings under a
//! plain SQL insert, the in-process wake-up counter, its cap on tenants per
//! turn and its busy errors. Every promise of the store traits is in the
//! store conformance suite (courier-testkit's `store_suite`, run by its
//! `tests/store.rs` against SQLite and PostgreSQL). Each test opens its own
//! fresh file in a temporary directory, so the tests run in parallel.

use std::error::Error;
use std::time::Duration;

use courier_core::{ClaimParams, NewMessage, OutboxStore, Route, SubscriptionSpec};
use courier_sqlite::{connect, SqliteStore, SCHEMA_VERSION};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;
use uuid::Uuid;

type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// A migrated store over a fresh file that lives as long as this value.
struct Db {
    store: SqliteStore,
    dir: TempDir,
}

async fn fresh() -> TestResult<Db> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("courier.db");
    let pool = connect(path.to_str().ok_or("temporary path is not UTF-8")?, 4).await?;
    let store = SqliteStore::new(pool);
    store.migrate().await?;
    Ok(Db { store, dir })
}

impl Db {
    async fn subscribe(&self, name: &str, topics: &[&str]) -> TestResult {
        self.store
            .register_subscription(&SubscriptionSpec {
                name: name.to_owned(),
                topics: topics.iter().map(|t| (*t).to_owned()).collect(),
                replay: None,
            })
            .await?;
        Ok(())
    }

    async fn count(&self, sql: &str) -> TestResult<i64> {
        Ok(sqlx::query_scalar(sql).fetch_one(self.store.pool()).await?)
    }

    async fn execute(&self, sql: &str) -> TestResult {
        sqlx::raw_sql(sql).execute(self.store.pool()).await?;
        Ok(())
    }
}

fn message(tenant: &str, topic: &str) -> TestResult<NewMessage> {
    Ok(NewMessage::new(
        tenant,
        topic,
        &serde_json::json!({"n": 1}),
    )?)
}

fn params(subscription: &str, limit: usize) -> ClaimParams {
    ClaimParams {
        subscription: subscription.to_owned(),
        routes: vec![Route {
            topic: "t".to_owned(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit,
        lease: Duration::from_secs(30),
        worker_id: "w1".to_owned(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

#[tokio::test]
async fn a_migrated_file_is_in_wal_mode_with_its_fan_out_trigger() -> TestResult {
    // Migrating twice and refusing a newer schema: the store suite
    // (courier-testkit's tests/store.rs).
    let db = fresh().await?;
    db.store.migrate().await?;
    assert_eq!(db.store.schema_version().await?, SCHEMA_VERSION);
    assert_eq!(
        db.count("SELECT count(*) FROM sqlite_schema WHERE name = 'messages_fan_out'")
            .await?,
        1
    );
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(db.store.pool())
        .await?;
    assert_eq!(journal, "wal");
    Ok(())
}

#[tokio::test]
async fn a_fresh_file_reports_schema_version_zero_until_migrated() -> TestResult {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("new.db").display());
    let store = SqliteStore::new(connect(&url, 2).await?);
    assert_eq!(store.schema_version().await?, 0);
    store.migrate().await?;
    assert_eq!(store.schema_version().await?, SCHEMA_VERSION);
    Ok(())
}

#[tokio::test]
async fn plain_sql_insert_fans_out_to_every_matching_subscription() -> TestResult {
    let db = fresh().await?;
    db.subscribe("exact", &["invoice.created"]).await?;
    db.subscribe("prefix", &["invoice.*"]).await?;
    db.subscribe("everything", &["*"]).await?;
    db.subscribe("both", &["invoice.created", "invoice.*"])
        .await?;
    db.subscribe("other", &["payment.made", "payment.*"])
        .await?;

    db.execute(
        r#"INSERT INTO messages (tenant, topic, payload) VALUES ('acme', 'invoice.created', '{"n": 1}')"#,
    )
    .await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT m.id, d.subscription FROM messages m JOIN deliveries d ON d.message_id = m.id
         ORDER BY d.subscription",
    )
    .fetch_all(db.store.pool())
    .await?;
    let subscriptions: Vec<&str> = rows.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(subscriptions, ["both", "everything", "exact", "prefix"]);
    // The default id is a UUIDv7 made by the database.
    let id = Uuid::parse_str(&rows[0].0)?;
    assert_eq!(id.get_version_num(), 7);

    // `invoice.*` needs the dot: `invoiced` reaches only `*`.
    db.execute(r#"INSERT INTO messages (tenant, topic, payload) VALUES ('acme', 'invoiced', '1')"#)
        .await?;
    let reached: Vec<String> =
        sqlx::query_scalar("SELECT d.subscription FROM deliveries d WHERE d.topic = 'invoiced'")
            .fetch_all(db.store.pool())
            .await?;
    assert_eq!(reached, ["everything"]);

    // Two rows of one statement: deliveries follow insert order.
    db.execute(
        r#"INSERT INTO messages (id, tenant, topic, payload) VALUES
             ('01900000-0000-7000-8000-000000000002', 'acme', 'payment.made', '2'),
             ('01900000-0000-7000-8000-000000000001', 'acme', 'payment.made', '1')"#,
    )
    .await?;
    let order: Vec<String> = sqlx::query_scalar(
        "SELECT message_id FROM deliveries WHERE subscription = 'other' ORDER BY id",
    )
    .fetch_all(db.store.pool())
    .await?;
    assert_eq!(
        order,
        [
            "01900000-0000-7000-8000-000000000002",
            "01900000-0000-7000-8000-000000000001"
        ]
    );

    // The table refuses what Courier could not read.
    for bad in [
        r#"INSERT INTO messages (tenant, topic, payload) VALUES ('a:b', 't', '1')"#,
        r#"INSERT INTO messages (tenant, topic, payload) VALUES ('a', 't', '{not json')"#,
        r#"INSERT INTO messages (tenant, topic, payload, headers) VALUES ('a', 't', '1', '[]')"#,
        r#"INSERT INTO messages (id, tenant, topic, payload) VALUES ('NOT-A-UUID', 'a', 't', '1')"#,
        r#"INSERT INTO messages (tenant, topic, payload, occurred_at) VALUES ('a', 't', '1', 'yesterday')"#,
    ] {
        assert!(db.execute(bad).await.is_err(), "{bad}");
    }
    Ok(())
}

#[tokio::test]
async fn publishing_bumps_the_wakeup_counter() -> TestResult {
    let db = fresh().await?;
    let mut wakeups = db.store.wakeups();
    assert!(!wakeups.has_changed()?);
    db.store.publish_batch(&[message("acme", "t")?]).await?;
    assert!(wakeups.has_changed()?);
    wakeups.mark_unchanged();
    let mut tx = db.store.begin().await?;
    db.store.enqueue(&mut tx, &message("acme", "t")?).await?;
    tx.commit().await?;
    assert!(wakeups.has_changed()?);
    Ok(())
}

#[tokio::test]
async fn a_turn_over_many_tenants_is_capped_and_continues() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for index in 0..1200 {
        batch.push(message(&format!("tenant-{index:04}"), "t")?);
    }
    db.store.publish_batch(&batch).await?;
    let mut claim = params("all", 1200);
    let first = db.store.claim(&claim).await?;
    assert_eq!(first.deliveries.len(), courier_sqlite::MAX_TENANTS_PER_TURN);
    assert_eq!(first.next_tenant_cursor, "tenant-0999");
    claim.tenant_cursor = first.next_tenant_cursor;
    let second = db.store.claim(&claim).await?;
    assert_eq!(second.deliveries.len(), 200);
    assert_eq!(second.next_tenant_cursor, "");
    Ok(())
}

#[tokio::test]
async fn a_busy_database_is_a_transient_error() -> TestResult {
    let db = fresh().await?;
    let path = db.dir.path().join("courier.db");
    let impatient = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .busy_timeout(Duration::ZERO),
        )
        .await?;
    let impatient = SqliteStore::new(impatient);

    let mut holder =
        SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&path)).await?;
    let lock = holder.begin_with("BEGIN IMMEDIATE").await?;
    let error = impatient
        .register_subscription(&SubscriptionSpec {
            name: "s".into(),
            topics: vec!["t".into()],
            replay: None,
        })
        .await
        .err()
        .ok_or("the write should have found the database busy")?;
    assert!(error.is_transient(), "{error}");
    lock.rollback().await?;
    impatient
        .register_subscription(&SubscriptionSpec {
            name: "s".into(),
            topics: vec!["t".into()],
            replay: None,
        })
        .await?;
    Ok(())
}
