//! The SQLite store against real database files: each test opens its own
//! fresh file in a temporary directory, so the tests run in parallel.

use std::collections::HashSet;
use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use courier_core::{
    ClaimBatch, ClaimParams, ClaimedDelivery, DeadLetterFilter, DeadLetterStore, EnqueueOutcome,
    Failure, FailureApplied, HandlerError, NewMessage, OutboxStore, Route, StoreError,
    SubscriptionSpec, TransactionalOutcome, TxWork, MAX_ERROR_CHARS,
};
use courier_sqlite::{connect, SqliteStore, SCHEMA_VERSION};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
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

    async fn publish(&self, messages: &[NewMessage]) -> TestResult<Vec<EnqueueOutcome>> {
        Ok(self.store.publish_batch(messages).await?)
    }

    async fn count(&self, sql: &str) -> TestResult<i64> {
        Ok(sqlx::query_scalar(sql).fetch_one(self.store.pool()).await?)
    }

    async fn execute(&self, sql: &str) -> TestResult {
        sqlx::raw_sql(sql).execute(self.store.pool()).await?;
        Ok(())
    }

    async fn claim(&self, params: &ClaimParams) -> TestResult<Vec<ClaimedDelivery>> {
        Ok(self.store.claim(params).await?.deliveries)
    }
}

fn message(tenant: &str, topic: &str) -> TestResult<NewMessage> {
    Ok(NewMessage::new(
        tenant,
        topic,
        &serde_json::json!({"n": 1}),
    )?)
}

fn route(topic: &str, schema_version: i32, max_attempts: i32) -> Route {
    Route {
        topic: topic.to_owned(),
        schema_version,
        max_attempts,
    }
}

fn params(subscription: &str, routes: Vec<Route>, limit: usize) -> ClaimParams {
    ClaimParams {
        subscription: subscription.to_owned(),
        routes,
        limit,
        lease: Duration::from_secs(30),
        worker_id: "w1".to_owned(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

fn failure(delivery: &ClaimedDelivery, error: &str, retry_in: Option<Duration>) -> Failure {
    Failure {
        lease: delivery.lease(),
        error: error.to_owned(),
        retry_in,
    }
}

fn ids(deliveries: &[ClaimedDelivery]) -> Vec<i64> {
    deliveries.iter().map(|d| d.delivery_id).collect()
}

fn tx_work<F>(work: F) -> TxWork<SqliteConnection>
where
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<(), HandlerError>>
        + Send
        + 'static,
{
    Box::new(work)
}

/// Work that records `message_id` in the test's `effects` table.
fn record_effect(message_id: Uuid) -> TxWork<SqliteConnection> {
    tx_work(move |conn| {
        async move {
            sqlx::query("INSERT INTO effects (message_id) VALUES (?1)")
                .bind(message_id.to_string())
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        .boxed()
    })
}

#[tokio::test]
async fn migrating_twice_is_idempotent_and_a_newer_schema_is_refused() -> TestResult {
    let db = fresh().await?;
    db.store.migrate().await?;
    assert_eq!(db.store.schema_version().await?, SCHEMA_VERSION);
    assert_eq!(
        db.count("SELECT count(*) FROM courier_schema_migrations")
            .await?,
        SCHEMA_VERSION
    );
    assert_eq!(
        db.count("SELECT count(*) FROM sqlite_schema WHERE name = 'messages_fan_out'")
            .await?,
        1
    );
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(db.store.pool())
        .await?;
    assert_eq!(journal, "wal");

    db.execute("INSERT INTO courier_schema_migrations (version, name) VALUES (99, 'future')")
        .await?;
    match db.store.migrate().await {
        Err(StoreError::SchemaTooNew { found: 99, known }) => assert_eq!(known, SCHEMA_VERSION),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
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
async fn enqueue_in_a_rolled_back_transaction_leaves_no_message() -> TestResult {
    let db = fresh().await?;
    db.subscribe("billing", &["invoice.created"]).await?;

    let mut tx = db.store.begin().await?;
    let outcome = db
        .store
        .enqueue(&mut tx, &message("acme", "invoice.created")?)
        .await?;
    assert!(!outcome.duplicate);
    tx.rollback().await?;
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 0);
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 0);

    let mut tx = db.store.begin().await?;
    db.store
        .enqueue(&mut tx, &message("acme", "invoice.created")?)
        .await?;
    tx.commit().await?;
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 1);
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 1);
    Ok(())
}

#[tokio::test]
async fn invalid_messages_store_nothing() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let good = message("acme", "a")?;
    let bad = message("acme", "b")?.with_schema_version(0);
    match db.store.publish_batch(&[good, bad]).await {
        Err(StoreError::Invalid(error)) => assert_eq!(error.field, "schema_version"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 0);

    let refused = db
        .store
        .register_subscription(&SubscriptionSpec {
            name: "s".into(),
            topics: vec!["a*".into()],
            replay: None,
        })
        .await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))));
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
async fn idempotent_enqueue_returns_the_first_id_and_stores_nothing() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let first = message("acme", "t")?.with_idempotency_key("k");
    let outcome = db.publish(std::slice::from_ref(&first)).await?;
    assert_eq!(
        outcome,
        [EnqueueOutcome {
            id: first.id,
            duplicate: false
        }]
    );

    let again = message("acme", "t")?.with_idempotency_key("k");
    let outcome = db.publish(&[again]).await?;
    assert_eq!(
        outcome,
        [EnqueueOutcome {
            id: first.id,
            duplicate: true
        }]
    );
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 1);
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 1);

    let l1 = message("acme", "t")?.with_idempotency_key("l");
    let l2 = message("acme", "t")?.with_idempotency_key("l");
    let k = message("acme", "t")?.with_idempotency_key("k");
    let unkeyed = message("acme", "t")?;
    let other_tenant = message("globex", "t")?.with_idempotency_key("k");
    let batch = [l1.clone(), l2, k, unkeyed.clone(), other_tenant.clone()];
    let outcomes = db.publish(&batch).await?;
    let expected = [
        (l1.id, false),
        (l1.id, true),
        (first.id, true),
        (unkeyed.id, false),
        (other_tenant.id, false),
    ];
    let got: Vec<(Uuid, bool)> = outcomes.iter().map(|o| (o.id, o.duplicate)).collect();
    assert_eq!(got, expected);
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 4);
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 4);
    Ok(())
}

#[tokio::test]
async fn a_batch_beyond_one_statement_is_split_and_stays_in_order() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for index in 0..3100 {
        let mut m = message("acme", "t")?;
        if index == 0 || index == 3050 {
            m = m.with_idempotency_key("same");
        }
        batch.push(m);
    }
    let outcomes = db.publish(&batch).await?;
    assert_eq!(outcomes.len(), 3100);
    assert_eq!(outcomes[3050].id, batch[0].id);
    assert!(outcomes[3050].duplicate);
    assert_eq!(db.count("SELECT count(*) FROM messages").await?, 3099);
    let order: Vec<String> = sqlx::query_scalar("SELECT message_id FROM deliveries ORDER BY id")
        .fetch_all(db.store.pool())
        .await?;
    let expected: Vec<String> = batch
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 3050)
        .map(|(_, m)| m.id.to_string())
        .collect();
    assert_eq!(order, expected);
    Ok(())
}

#[tokio::test]
async fn publishing_bumps_the_wakeup_counter() -> TestResult {
    let db = fresh().await?;
    let mut wakeups = db.store.wakeups();
    assert!(!wakeups.has_changed()?);
    db.publish(&[message("acme", "t")?]).await?;
    assert!(wakeups.has_changed()?);
    wakeups.mark_unchanged();
    let mut tx = db.store.begin().await?;
    db.store.enqueue(&mut tx, &message("acme", "t")?).await?;
    tx.commit().await?;
    assert!(wakeups.has_changed()?);
    Ok(())
}

#[tokio::test]
async fn claim_takes_only_the_routes_asked_for() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let a1 = message("acme", "a")?;
    let a2 = message("acme", "a")?.with_schema_version(2);
    let b1 = message("acme", "b")?.with_header("trace", "x");
    db.publish(&[a1.clone(), a2.clone(), b1.clone()]).await?;

    let claimed = db.claim(&params("all", vec![route("a", 1, 3)], 10)).await?;
    assert_eq!(claimed.len(), 1);
    let delivery = &claimed[0];
    assert_eq!(delivery.message_id, a1.id);
    assert_eq!((delivery.attempt, delivery.max_attempts), (1, 3));
    assert_eq!(delivery.payload, r#"{"n":1}"#);
    assert_eq!(delivery.subscription, "all");
    assert!(delivery.lease_expires_at > Utc::now());
    assert_eq!(delivery.lease_token.get_version_num(), 4);
    assert_eq!(
        delivery.occurred_at.timestamp_millis(),
        a1.occurred_at.timestamp_millis()
    );

    let claimed = db
        .claim(&params("all", vec![route("b", 1, 5), route("a", 2, 7)], 10))
        .await?;
    let got: Vec<(Uuid, i32)> = claimed
        .iter()
        .map(|d| (d.message_id, d.max_attempts))
        .collect();
    assert_eq!(got, [(a2.id, 7), (b1.id, 5)]);
    assert_eq!(
        claimed[1].headers.get("trace").map(String::as_str),
        Some("x")
    );
    assert_ne!(claimed[0].lease_token, claimed[1].lease_token);

    assert!(db
        .claim(&params("all", vec![route("a", 1, 3)], 10))
        .await?
        .is_empty());
    assert!(db.claim(&params("all", Vec::new(), 10)).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn completion_with_a_wrong_token_is_refused() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let claimed = db.claim(&params("all", vec![route("t", 1, 10)], 1)).await?;
    let mut forged = claimed[0].lease();
    forged.lease_token = Uuid::new_v4();
    assert!(db.store.complete_many(&[forged]).await?.is_empty());
    assert!(db
        .store
        .fail_many(&[Failure {
            lease: forged,
            error: "x".into(),
            retry_in: None
        }])
        .await?
        .is_empty());
    assert!(db
        .store
        .extend_many(&[forged], Duration::from_secs(60))
        .await?
        .is_empty());
    assert!(db.store.release_many(&[forged]).await?.is_empty());

    assert_eq!(
        db.store.complete_many(&[claimed[0].lease()]).await?,
        [claimed[0].delivery_id]
    );
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 0);
    let receipt: String = sqlx::query_scalar("SELECT message_id FROM receipts")
        .fetch_one(db.store.pool())
        .await?;
    assert_eq!(receipt, m.id.to_string());
    let states = db.store.message_deliveries(m.id).await?;
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].state, "completed");
    // A second completion of the same claim finds nothing to do.
    assert!(db
        .store
        .complete_many(&[claimed[0].lease()])
        .await?
        .is_empty());
    Ok(())
}

#[tokio::test]
async fn zombie_completion_is_refused_after_lease_expiry() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let mut short = params("all", vec![route("t", 1, 10)], 1);
    short.lease = Duration::from_millis(200);
    let claimed = db.claim(&short).await?;
    assert_eq!(claimed.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let lease = claimed[0].lease();
    assert!(db.store.complete_many(&[lease]).await?.is_empty());
    assert!(db
        .store
        .fail_many(&[failure(&claimed[0], "late", Some(Duration::ZERO))])
        .await?
        .is_empty());
    assert!(db
        .store
        .extend_many(&[lease], Duration::from_secs(60))
        .await?
        .is_empty());
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 0);

    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(100))
            .await?,
        1
    );
    let again = db.claim(&short).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 2);
    assert!(db.store.complete_many(&[lease]).await?.is_empty());
    assert_eq!(db.store.complete_many(&[again[0].lease()]).await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_failed_attempt_waits_for_its_retry_delay() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let claim = params("all", vec![route("t", 1, 10)], 1);
    let claimed = db.claim(&claim).await?;
    let applied = db
        .store
        .fail_many(&[failure(
            &claimed[0],
            "try later",
            Some(Duration::from_millis(400)),
        )])
        .await?;
    assert_eq!(
        applied,
        [FailureApplied {
            delivery_id: claimed[0].delivery_id,
            dead: false
        }]
    );
    assert!(db.claim(&claim).await?.is_empty());
    let states = db.store.message_deliveries(m.id).await?;
    assert_eq!(states[0].state, "available");
    assert_eq!(states[0].errors.len(), 1);
    assert_eq!(states[0].errors[0].attempt, 1);
    assert_eq!(states[0].errors[0].message, "try later");
    assert!((Utc::now() - states[0].errors[0].at).num_seconds().abs() < 5);

    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = db.claim(&claim).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 2);
    Ok(())
}

#[tokio::test]
async fn exhausted_attempts_dead_letter_with_every_error_kept() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let claim = params("all", vec![route("t", 1, 10)], 1);
    let mut delivery_id = 0;
    for attempt in 1..=10 {
        let claimed = db.claim(&claim).await?;
        assert_eq!(claimed.len(), 1, "attempt {attempt}");
        assert_eq!(claimed[0].attempt, attempt);
        delivery_id = claimed[0].delivery_id;
        let applied = db
            .store
            .fail_many(&[failure(
                &claimed[0],
                &format!("boom {attempt}"),
                Some(Duration::ZERO),
            )])
            .await?;
        assert_eq!(applied[0].dead, attempt == 10);
    }
    assert!(db.claim(&claim).await?.is_empty());
    let dead = db
        .store
        .get_dead_letter(delivery_id)
        .await?
        .ok_or("no dead letter")?;
    assert_eq!(dead.attempts, 10);
    assert!(dead.dead_at.is_some());
    let history: Vec<(i32, String)> = dead
        .errors
        .iter()
        .map(|e| (e.attempt, e.message.clone()))
        .collect();
    let expected: Vec<(i32, String)> = (1..=10).map(|a| (a, format!("boom {a}"))).collect();
    assert_eq!(history, expected);
    Ok(())
}

#[tokio::test]
async fn the_error_history_keeps_the_newest_twenty() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let claim = params("all", vec![route("t", 1, 25)], 1);
    let mut delivery_id = 0;
    for attempt in 1..=25 {
        let claimed = db.claim(&claim).await?;
        delivery_id = claimed[0].delivery_id;
        db.store
            .fail_many(&[failure(
                &claimed[0],
                &format!("e{attempt}"),
                Some(Duration::ZERO),
            )])
            .await?;
    }
    let dead = db
        .store
        .get_dead_letter(delivery_id)
        .await?
        .ok_or("no dead letter")?;
    let attempts: Vec<i32> = dead.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (6..=25).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test]
async fn a_long_multibyte_error_is_cut_to_2000_characters() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let claimed = db.claim(&params("all", vec![route("t", 1, 10)], 1)).await?;
    let long = "é".repeat(3000);
    let applied = db
        .store
        .fail_many(&[failure(&claimed[0], &long, None)])
        .await?;
    assert!(applied[0].dead);
    let dead = db
        .store
        .get_dead_letter(claimed[0].delivery_id)
        .await?
        .ok_or("no dead letter")?;
    let stored = &dead.errors[0].message;
    assert_eq!(stored.chars().count(), MAX_ERROR_CHARS);
    assert!(stored.chars().all(|c| c == 'é'));
    Ok(())
}

#[tokio::test]
async fn extend_keeps_a_lease_alive_past_its_original_expiry() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let mut short = params("all", vec![route("t", 1, 10)], 1);
    short.lease = Duration::from_millis(300);
    let claimed = db.claim(&short).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let extended = db
        .store
        .extend_many(&[claimed[0].lease()], Duration::from_secs(5))
        .await?;
    assert_eq!(extended, [claimed[0].delivery_id]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(100))
            .await?,
        0
    );
    assert_eq!(
        db.store.complete_many(&[claimed[0].lease()]).await?,
        [claimed[0].delivery_id]
    );
    Ok(())
}

#[tokio::test]
async fn release_gives_back_the_attempt() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    db.publish(&[message("acme", "t")?]).await?;
    let claim = params("all", vec![route("t", 1, 10)], 1);
    let claimed = db.claim(&claim).await?;
    assert_eq!(claimed[0].attempt, 1);
    assert_eq!(
        db.store.release_many(&[claimed[0].lease()]).await?,
        [claimed[0].delivery_id]
    );
    assert!(db
        .store
        .complete_many(&[claimed[0].lease()])
        .await?
        .is_empty());
    let again = db.claim(&claim).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 1);
    Ok(())
}

#[tokio::test]
async fn rescue_returns_expired_leases_and_dead_letters_at_the_last_attempt() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let mut short = params("all", vec![route("t", 1, 2)], 1);
    short.lease = Duration::from_millis(100);

    let first = db.claim(&short).await?;
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(100))
            .await?,
        0
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(100))
            .await?,
        1
    );
    let states = db.store.message_deliveries(m.id).await?;
    assert_eq!(states[0].state, "available");
    assert_eq!(states[0].errors[0].message, "lease expired (worker w1)");

    let second = db.claim(&short).await?;
    assert_eq!(ids(&second), ids(&first));
    assert_eq!(second[0].attempt, 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(100))
            .await?,
        1
    );
    let dead = db
        .store
        .get_dead_letter(first[0].delivery_id)
        .await?
        .ok_or("not dead-lettered")?;
    assert_eq!(dead.attempts, 2);
    assert_eq!(dead.errors.len(), 2);
    assert!(db.claim(&short).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn an_ordering_key_holds_the_next_message_until_the_earlier_completes() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let first = message("acme", "t")?.with_ordering_key("order-1");
    let second = message("acme", "t")?.with_ordering_key("order-1");
    let unrelated = message("acme", "t")?.with_ordering_key("order-2");
    let unkeyed = message("acme", "t")?;
    db.publish(&[
        first.clone(),
        second.clone(),
        unrelated.clone(),
        unkeyed.clone(),
    ])
    .await?;
    let claim = params("all", vec![route("t", 1, 10)], 10);

    let claimed = db.claim(&claim).await?;
    let got: Vec<Uuid> = claimed.iter().map(|d| d.message_id).collect();
    assert_eq!(got, [first.id, unrelated.id, unkeyed.id]);
    assert!(db.claim(&claim).await?.is_empty());

    // A retrying earlier message still holds the next one back.
    db.store
        .fail_many(&[failure(&claimed[0], "again", Some(Duration::ZERO))])
        .await?;
    let retried = db.claim(&claim).await?;
    let got: Vec<Uuid> = retried.iter().map(|d| d.message_id).collect();
    assert_eq!(got, [first.id]);

    db.store.complete_many(&[retried[0].lease()]).await?;
    let next = db.claim(&claim).await?;
    let got: Vec<Uuid> = next.iter().map(|d| d.message_id).collect();
    assert_eq!(got, [second.id]);
    Ok(())
}

#[tokio::test]
async fn an_ordering_key_releases_the_next_message_when_the_earlier_is_dead_lettered() -> TestResult
{
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let first = message("acme", "t")?.with_ordering_key("k");
    let second = message("acme", "t")?.with_ordering_key("k");
    db.publish(&[first.clone(), second.clone()]).await?;
    let claim = params("all", vec![route("t", 1, 10)], 10);
    let claimed = db.claim(&claim).await?;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message_id, first.id);
    db.store
        .fail_many(&[failure(&claimed[0], "poison", None)])
        .await?;
    let next = db.claim(&claim).await?;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].message_id, second.id);
    Ok(())
}

#[tokio::test]
async fn a_busy_tenant_cannot_starve_a_small_one() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..500 {
        batch.push(message("a-big", "t")?);
    }
    for _ in 0..5 {
        batch.push(message("b-small", "t")?);
    }
    db.publish(&batch).await?;
    let claimed = db
        .claim(&params("all", vec![route("t", 1, 10)], 10))
        .await?;
    assert_eq!(claimed.len(), 10);
    let small = claimed.iter().filter(|d| d.tenant == "b-small").count();
    assert_eq!(small, 5);
    Ok(())
}

#[tokio::test]
async fn tenant_turns_continue_after_the_cursor() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for tenant in ["a", "b", "c"] {
        batch.push(message(tenant, "t")?);
        batch.push(message(tenant, "t")?);
    }
    // Tenant "a0" has only work this worker cannot handle; it must not hold the turn.
    batch.push(message("a0", "unhandled")?);
    db.publish(&batch).await?;

    let mut claim = params("all", vec![route("t", 1, 10)], 1);
    let mut served = Vec::new();
    for _ in 0..4 {
        let ClaimBatch {
            deliveries,
            next_tenant_cursor,
        } = db.store.claim(&claim).await?;
        served.push((
            deliveries
                .iter()
                .map(|d| d.tenant.clone())
                .collect::<Vec<_>>(),
            next_tenant_cursor.clone(),
        ));
        claim.tenant_cursor = next_tenant_cursor;
    }
    let expected = [
        (vec!["a".to_owned()], "a".to_owned()),
        (vec![], "a0".to_owned()),
        (vec!["b".to_owned()], "b".to_owned()),
        (vec!["c".to_owned()], "c".to_owned()),
    ];
    assert_eq!(served, expected);
    // Nothing after "c": the turn is empty and the cursor starts over.
    let last = db.store.claim(&claim).await?;
    assert!(last.deliveries.is_empty());
    assert_eq!(last.next_tenant_cursor, "");

    // A turn that is not full serves every tenant and resets the cursor.
    claim.tenant_cursor = String::new();
    claim.limit = 10;
    let all = db.store.claim(&claim).await?;
    assert_eq!(all.deliveries.len(), 3);
    assert_eq!(all.next_tenant_cursor, "");
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
    db.publish(&batch).await?;
    let mut claim = params("all", vec![route("t", 1, 10)], 1200);
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
async fn the_in_flight_limit_defers_a_tenant_without_spending_attempts() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..5 {
        batch.push(message("acme", "t")?);
    }
    batch.push(message("globex", "t")?);
    db.publish(&batch).await?;
    let mut claim = params("all", vec![route("t", 1, 10)], 10);
    claim.tenant_in_flight_limit = Some(2);

    let first = db.claim(&claim).await?;
    let acme: Vec<&ClaimedDelivery> = first.iter().filter(|d| d.tenant == "acme").collect();
    assert_eq!(acme.len(), 2);
    assert_eq!(first.len(), 3);
    assert!(db.claim(&claim).await?.is_empty());

    db.store.complete_many(&[acme[0].lease()]).await?;
    let next = db.claim(&claim).await?;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].attempt, 1);
    Ok(())
}

#[tokio::test]
async fn a_delayed_message_waits_until_it_is_available() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let delayed = message("acme", "t")?.delay(Duration::from_millis(400));
    let scheduled = message("acme", "t")?.available_at(Utc::now() + Duration::from_millis(400));
    db.publish(&[delayed.clone(), scheduled.clone()]).await?;
    let claim = params("all", vec![route("t", 1, 10)], 10);
    assert!(db.claim(&claim).await?.is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claimed = db.claim(&claim).await?;
    let got: Vec<Uuid> = claimed.iter().map(|d| d.message_id).collect();
    assert_eq!(got, [delayed.id, scheduled.id]);
    Ok(())
}

#[tokio::test]
async fn dead_letters_can_be_listed_inspected_retried_and_discarded() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for (tenant, topic) in [("t1", "x"), ("t1", "y"), ("t2", "x"), ("t2", "y")] {
        batch.push(message(tenant, topic)?);
    }
    db.publish(&batch).await?;
    let claimed = db
        .claim(&params(
            "all",
            vec![route("x", 1, 10), route("y", 1, 10)],
            10,
        ))
        .await?;
    let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
    assert!(db.store.fail_many(&failures).await?.iter().all(|f| f.dead));
    let dead_ids = ids(&claimed);

    let any = DeadLetterFilter::default();
    let page = db.store.list_dead_letters(&any, None, 3).await?;
    assert_eq!(page.items.len(), 3);
    assert_eq!(page.next_cursor, Some(dead_ids[2]));
    let rest = db
        .store
        .list_dead_letters(&any, page.next_cursor, 3)
        .await?;
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.next_cursor, None);

    let t1 = DeadLetterFilter {
        tenant: Some("t1".into()),
        ..DeadLetterFilter::default()
    };
    let x = DeadLetterFilter {
        topic: Some("x".into()),
        ..DeadLetterFilter::default()
    };
    let nobody = DeadLetterFilter {
        subscription: Some("nobody".into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        db.store.list_dead_letters(&t1, None, 10).await?.items.len(),
        2
    );
    assert_eq!(
        db.store.list_dead_letters(&x, None, 10).await?.items.len(),
        2
    );
    assert!(db
        .store
        .list_dead_letters(&nobody, None, 10)
        .await?
        .items
        .is_empty());

    let one = db
        .store
        .get_dead_letter(dead_ids[0])
        .await?
        .ok_or("missing dead letter")?;
    assert_eq!((one.tenant.as_str(), one.topic.as_str()), ("t1", "x"));
    assert_eq!(one.payload, r#"{"n":1}"#);
    assert_eq!(one.message_id, batch[0].id);
    assert_eq!(one.subscription, "all");
    assert!(db.store.get_dead_letter(i64::MAX).await?.is_none());

    // Retry by id: deliverable at once, attempts reset, history kept.
    assert_eq!(db.store.retry_dead_letters(&[dead_ids[0]]).await?, 1);
    assert!(db.store.get_dead_letter(dead_ids[0]).await?.is_none());
    let again = db
        .claim(&params("all", vec![route("x", 1, 10)], 10))
        .await?;
    assert_eq!(ids(&again), [dead_ids[0]]);
    assert_eq!(again[0].attempt, 1);
    let states = db.store.message_deliveries(batch[0].id).await?;
    assert_eq!(states[0].errors.len(), 1);

    // Retry by filter.
    let t2 = DeadLetterFilter {
        tenant: Some("t2".into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(db.store.retry_dead_letters_matching(&t2).await?, 2);
    assert_eq!(
        db.store
            .list_dead_letters(&any, None, 10)
            .await?
            .items
            .len(),
        1
    );

    // Discard by id, then by filter; a retried delivery is not dead and stays.
    assert_eq!(
        db.store
            .discard_dead_letters(&[dead_ids[1], dead_ids[0]])
            .await?,
        1
    );
    assert!(db.store.get_dead_letter(dead_ids[1]).await?.is_none());
    let claimed = db
        .claim(&params(
            "all",
            vec![route("x", 1, 10), route("y", 1, 10)],
            10,
        ))
        .await?;
    let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
    db.store.fail_many(&failures).await?;
    assert_eq!(db.store.discard_dead_letters_matching(&x).await?, 1);
    assert_eq!(db.store.discard_dead_letters_matching(&any).await?, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM deliveries WHERE state = 'dead'")
            .await?,
        0
    );
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 1);
    Ok(())
}

#[tokio::test]
async fn prune_removes_finished_messages_and_old_receipts_but_keeps_dead_letters() -> TestResult {
    let db = fresh().await?;
    db.subscribe("s", &["t"]).await?;
    let completed = message("acme", "t")?;
    let dead = message("acme", "t")?;
    let unrouted = message("acme", "nobody-listens")?;
    let pending = message("acme", "t")?;
    db.publish(&[completed.clone(), dead.clone(), unrouted.clone()])
        .await?;
    let claimed = db.claim(&params("s", vec![route("t", 1, 10)], 10)).await?;
    db.store.complete_many(&[claimed[0].lease()]).await?;
    db.store
        .fail_many(&[failure(&claimed[1], "poison", None)])
        .await?;
    db.publish(std::slice::from_ref(&pending)).await?;

    let report = db.store.prune(Duration::from_secs(3600), 100).await?;
    assert_eq!((report.messages, report.receipts), (0, 0));

    tokio::time::sleep(Duration::from_millis(20)).await;
    let report = db.store.prune(Duration::ZERO, 100).await?;
    assert_eq!((report.messages, report.receipts), (2, 1));
    let left: HashSet<String> = sqlx::query_scalar("SELECT id FROM messages")
        .fetch_all(db.store.pool())
        .await?
        .into_iter()
        .collect();
    let expected: HashSet<String> = [dead.id.to_string(), pending.id.to_string()].into();
    assert_eq!(left, expected);
    assert!(db
        .store
        .get_dead_letter(claimed[1].delivery_id)
        .await?
        .is_some());
    Ok(())
}

#[tokio::test]
async fn prune_works_in_batches() -> TestResult {
    let db = fresh().await?;
    let mut batch = Vec::new();
    for _ in 0..5 {
        batch.push(message("acme", "t")?);
    }
    db.publish(&batch).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(db.store.prune(Duration::ZERO, 2).await?.messages, 2);
    assert_eq!(db.store.prune(Duration::ZERO, 10).await?.messages, 3);
    Ok(())
}

#[tokio::test]
async fn transactional_work_commits_with_its_receipt_and_completion() -> TestResult {
    let db = fresh().await?;
    db.execute("CREATE TABLE effects (message_id TEXT PRIMARY KEY)")
        .await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let claimed = db.claim(&params("all", vec![route("t", 1, 10)], 1)).await?;

    let outcome = db
        .store
        .run_transactional(&claimed[0], record_effect(m.id))
        .await?;
    assert!(
        matches!(outcome, TransactionalOutcome::Applied),
        "{outcome:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM effects").await?, 1);
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 1);
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

#[tokio::test]
async fn transactional_work_is_skipped_when_a_receipt_exists() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let claimed = db.claim(&params("all", vec![route("t", 1, 10)], 1)).await?;
    sqlx::query(
        "INSERT INTO receipts (tenant, subscription, message_id) VALUES ('acme', 'all', ?1)",
    )
    .bind(m.id.to_string())
    .execute(db.store.pool())
    .await?;

    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let work = tx_work(move |_conn| {
        async move {
            flag.store(true, Ordering::SeqCst);
            Ok(())
        }
        .boxed()
    });
    let outcome = db.store.run_transactional(&claimed[0], work).await?;
    assert!(
        matches!(outcome, TransactionalOutcome::AlreadyApplied),
        "{outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(db.count("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

#[tokio::test]
async fn transactional_work_after_lease_expiry_is_rolled_back() -> TestResult {
    let db = fresh().await?;
    db.execute("CREATE TABLE effects (message_id TEXT PRIMARY KEY)")
        .await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let mut short = params("all", vec![route("t", 1, 10)], 1);
    short.lease = Duration::from_millis(200);
    let claimed = db.claim(&short).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let outcome = db
        .store
        .run_transactional(&claimed[0], record_effect(m.id))
        .await?;
    assert!(
        matches!(outcome, TransactionalOutcome::LeaseLost),
        "{outcome:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM effects").await?, 0);
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 0);
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(10))
            .await?,
        1
    );
    Ok(())
}

#[tokio::test]
async fn failing_transactional_work_rolls_back_its_writes() -> TestResult {
    let db = fresh().await?;
    db.execute("CREATE TABLE effects (message_id TEXT PRIMARY KEY)")
        .await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let claimed = db.claim(&params("all", vec![route("t", 1, 10)], 1)).await?;

    let id = m.id;
    let work = tx_work(move |conn| {
        async move {
            sqlx::query("INSERT INTO effects (message_id) VALUES (?1)")
                .bind(id.to_string())
                .execute(&mut *conn)
                .await?;
            Err(HandlerError::retry("downstream said no"))
        }
        .boxed()
    });
    let outcome = db.store.run_transactional(&claimed[0], work).await?;
    match outcome {
        TransactionalOutcome::HandlerFailed(error) => {
            assert_eq!(error.to_string(), "downstream said no");
        }
        other => panic!("expected HandlerFailed, got {other:?}"),
    }
    assert_eq!(db.count("SELECT count(*) FROM effects").await?, 0);
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 0);
    // The claim is still held, so the failure can be recorded.
    let applied = db
        .store
        .fail_many(&[failure(
            &claimed[0],
            "downstream said no",
            Some(Duration::ZERO),
        )])
        .await?;
    assert_eq!(applied.len(), 1);
    Ok(())
}

#[tokio::test]
async fn concurrent_claimers_never_share_a_delivery() -> TestResult {
    let db = fresh().await?;
    db.subscribe("all", &["*"]).await?;
    let mut batch = Vec::new();
    for index in 0..300 {
        batch.push(message(&format!("tenant-{}", index % 7), "t")?);
    }
    db.publish(&batch).await?;

    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let store = db.store.clone();
        workers.spawn(async move {
            let mut claim = params("all", vec![route("t", 1, 10)], 7);
            claim.worker_id = format!("w{worker}");
            let mut seen = Vec::new();
            let mut idle_rounds = 0;
            while idle_rounds < 3 {
                let batch = store.claim(&claim).await?;
                claim.tenant_cursor = batch.next_tenant_cursor;
                if batch.deliveries.is_empty() {
                    idle_rounds += 1;
                    continue;
                }
                idle_rounds = 0;
                let leases: Vec<_> = batch.deliveries.iter().map(|d| d.lease()).collect();
                let completed = store.complete_many(&leases).await?;
                assert_eq!(completed.len(), leases.len());
                seen.extend(completed);
            }
            Ok::<_, StoreError>(seen)
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = workers.join_next().await {
        all.extend(joined??);
    }
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), 300);
    assert_eq!(distinct.len(), 300);
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 300);
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

#[tokio::test]
async fn transactional_work_that_outlives_its_lease_inside_the_write_lock_completes() -> TestResult
{
    // The lease is checked when the transaction takes SQLite's write lock;
    // nobody can take the delivery over until it commits.
    let db = fresh().await?;
    db.execute("CREATE TABLE effects (message_id TEXT PRIMARY KEY)")
        .await?;
    db.subscribe("all", &["*"]).await?;
    let m = message("acme", "t")?;
    db.publish(std::slice::from_ref(&m)).await?;
    let mut short = params("all", vec![route("t", 1, 10)], 1);
    short.lease = Duration::from_millis(200);
    let claimed = db.claim(&short).await?;
    let slow = tx_work(move |conn| {
        async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            sqlx::query("INSERT INTO effects (message_id) VALUES (?1)")
                .bind(m.id.to_string())
                .execute(conn)
                .await?;
            Ok(())
        }
        .boxed()
    });
    let outcome = db.store.run_transactional(&claimed[0], slow).await?;
    assert!(
        matches!(outcome, TransactionalOutcome::Applied),
        "{outcome:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM effects").await?, 1);
    assert_eq!(db.count("SELECT count(*) FROM receipts").await?, 1);
    assert_eq!(
        db.store
            .rescue_expired(&courier_core::RescueParams::at_once(10))
            .await?,
        0
    );
    Ok(())
}
