//! Upgrades keep what operators read: a database that an older build
//! (PostgreSQL schema 12, SQLite 6: plain completions wrote receipts) left
//! with completed and pending work reads the same after the upgrade to plain
//! completions without receipts, and the work completed after it reads
//! completed too. Dead letters from before fingerprints (PostgreSQL schema
//! 14, SQLite 8) still group after the upgrade, under `unknown`. SQLite 10's
//! pending stream entries survive the rebuild that allows a count of 0.

use std::time::Duration;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{
    error_fingerprint, AdminStore, ClaimParams, ClaimedDelivery, DeadLetterFilter, DeadLetterStore,
    ErrorKind, Failure, LeaseRef, NewMessage, OutboxStore, Route, StoreError, UNKNOWN_FINGERPRINT,
};
use courier_testkit::{states_of, Event};
use uuid::Uuid;

async fn claim<S: OutboxStore>(
    store: &S,
    limit: usize,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let batch = store
        .claim(&ClaimParams {
            subscription: "old".into(),
            routes: vec![Route {
                topic: "t".into(),
                schema_version: 1,
                max_attempts: 10,
            }],
            limit,
            lease: Duration::from_secs(300),
            worker_id: "upgrade-test".into(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: None,
        })
        .await?;
    Ok(batch.deliveries)
}

/// A fresh PostgreSQL schema migrated to `version`, with subscription `old`
/// on topic `t` as that version's registration wrote it: (schema, pool,
/// store). The caller drops the schema.
async fn postgres_at(version: i64) -> anyhow::Result<(String, sqlx::PgPool, PgStore)> {
    let schema = format!("t_{}", &Uuid::new_v4().simple().to_string()[..16]);
    let pool = courier_testkit::pg_pool(&schema, 4).await?;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await?;
    let store = PgStore::with_schema(pool.clone(), &schema)?;
    store.migrate_to(version).await?;
    anyhow::ensure!(store.schema_version().await? == version);
    sqlx::raw_sql(SUBSCRIBE_OLD).execute(&pool).await?;
    Ok((schema, pool, store))
}

/// A fresh SQLite file migrated to `version`, with subscription `old` as
/// [`postgres_at`] makes it: (its directory, pool, store). Messages of the
/// test are enqueued a millisecond after the registration, as in any real
/// run.
async fn sqlite_at(
    version: i64,
) -> anyhow::Result<(tempfile::TempDir, sqlx::SqlitePool, SqliteStore)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("courier.db");
    let path = path
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("temporary path is not UTF-8"))?;
    let pool = courier::sqlite::connect(path, 4).await?;
    let store = SqliteStore::new(pool.clone());
    store.migrate_to(version).await?;
    anyhow::ensure!(store.schema_version().await? == version);
    sqlx::raw_sql(SUBSCRIBE_OLD).execute(&pool).await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok((dir, pool, store))
}

/// Subscription `old` on topic `t`, as every older schema's registration
/// wrote it.
const SUBSCRIBE_OLD: &str = "INSERT INTO subscriptions (name) VALUES ('old');
     INSERT INTO subscription_topics (subscription, pattern, prefix) VALUES ('old', 't', NULL)";

/// The database as an older build's producers and workers wrote it: this
/// build's enqueue and claim statements name columns an older schema lacks.
enum OldDb {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl OldDb {
    /// Publishes `messages` in order, as a plain-SQL producer of any schema
    /// version does (the columns every version has).
    async fn publish(&self, messages: &[NewMessage]) -> anyhow::Result<()> {
        for message in messages {
            match self {
                Self::Postgres(pool) => {
                    sqlx::query(
                        "INSERT INTO messages (id, tenant, topic, payload) VALUES ($1, $2, $3, $4::jsonb)",
                    )
                    .bind(message.id)
                    .bind(&message.tenant)
                    .bind(&message.topic)
                    .bind(&message.payload)
                    .execute(pool)
                    .await?;
                }
                Self::Sqlite(pool) => {
                    sqlx::query(
                        "INSERT INTO messages (id, tenant, topic, payload) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .bind(message.id.to_string())
                    .bind(&message.tenant)
                    .bind(&message.topic)
                    .bind(&message.payload)
                    .execute(pool)
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// Sets the `n` oldest available deliveries running under one fresh
    /// five-minute lease, as an older build's claim did; returns the leases.
    async fn claim(&self, n: i64) -> anyhow::Result<Vec<LeaseRef>> {
        let token = Uuid::new_v4();
        let ids: Vec<i64> = match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar(
                    "UPDATE deliveries SET state = 'running', attempts = attempts + 1,
                       max_attempts = 10, lease_token = $1, claimed_by = 'old',
                       lease_expires_at = statement_timestamp() + interval '5 minutes'
                     WHERE id IN (SELECT id FROM deliveries WHERE state = 'available'
                                  ORDER BY id LIMIT $2)
                     RETURNING id",
                )
                .bind(token)
                .bind(n)
                .fetch_all(pool)
                .await?
            }
            Self::Sqlite(pool) => {
                sqlx::query_scalar(
                    "UPDATE deliveries SET state = 'running', attempts = attempts + 1,
                       max_attempts = 10, lease_token = ?1, claimed_by = 'old',
                       lease_expires_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + 300000
                     WHERE id IN (SELECT id FROM deliveries WHERE state = 'available'
                                  ORDER BY id LIMIT ?2)
                     RETURNING id",
                )
                .bind(token.to_string())
                .bind(n)
                .fetch_all(pool)
                .await?
            }
        };
        Ok(ids
            .into_iter()
            .map(|delivery_id| LeaseRef {
                delivery_id,
                lease_token: token,
            })
            .collect())
    }
}

/// What the older build had done: `first` completed with its receipt, the
/// dead letter of `fourth` discarded (its delivery deleted), `second` and
/// `third` pending. Then the upgrade, then `second` completes.
async fn upgrade_keeps_completed<S: OutboxStore + AdminStore>(
    store: &S,
    old: &OldDb,
    old_completion: impl AsyncFnOnce(Uuid, Uuid) -> anyhow::Result<()>,
    upgrade: impl AsyncFnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let messages = [
        NewMessage::new("acme", "t", &Event { n: 1 })?,
        NewMessage::new("acme", "t", &Event { n: 2 })?,
        NewMessage::new("acme", "t", &Event { n: 3 })?,
        NewMessage::new("acme", "t", &Event { n: 4 })?,
    ];
    old.publish(&messages).await?;
    old_completion(messages[0].id, messages[3].id).await?;
    upgrade().await?;

    let claimed = claim(store, 1).await?;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message_id, messages[1].id);
    assert_eq!(store.complete_many(&[claimed[0].lease()]).await?.len(), 1);

    let completed = vec![("old".to_owned(), "completed".to_owned())];
    assert_eq!(
        states_of(store, messages[0].id).await?,
        completed,
        "completed before"
    );
    assert_eq!(
        states_of(store, messages[1].id).await?,
        completed,
        "completed after"
    );
    assert_eq!(
        states_of(store, messages[2].id).await?,
        [("old".to_owned(), "available".to_owned())]
    );
    assert_eq!(
        states_of(store, messages[3].id).await?,
        [("old".to_owned(), "discarded".to_owned())],
        "discarded before the upgrade, never completed"
    );
    Ok(())
}

#[tokio::test]
async fn postgres_an_upgrade_from_schema_12_keeps_what_reads_completed() -> anyhow::Result<()> {
    let (schema, pool, store) = postgres_at(12).await?;
    let result = upgrade_keeps_completed(
        &store,
        &OldDb::Postgres(pool.clone()),
        async |completed, discarded| {
            sqlx::query(
                "WITH done AS (DELETE FROM deliveries WHERE message_id = $1
                               RETURNING tenant, subscription, message_id)
                 INSERT INTO receipts (tenant, subscription, message_id) SELECT * FROM done",
            )
            .bind(completed)
            .execute(&pool)
            .await?;
            sqlx::query("DELETE FROM deliveries WHERE message_id = $1")
                .bind(discarded)
                .execute(&pool)
                .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::postgres::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await?;
    result
}

#[tokio::test]
async fn sqlite_an_upgrade_from_schema_6_keeps_what_reads_completed() -> anyhow::Result<()> {
    let (_dir, pool, store) = sqlite_at(6).await?;
    upgrade_keeps_completed(
        &store,
        &OldDb::Sqlite(pool.clone()),
        async |completed, discarded| {
            sqlx::raw_sql(&format!(
                "INSERT INTO receipts (tenant, subscription, message_id)
                 SELECT tenant, subscription, message_id FROM deliveries
                 WHERE message_id = '{completed}';
                 DELETE FROM deliveries WHERE message_id IN ('{completed}', '{discarded}')"
            ))
            .execute(&pool)
            .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::sqlite::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await
}

/// Dead letters an older build left (before fingerprints: PostgreSQL schema
/// 14, SQLite 8) group after the upgrade under `unknown`, with a sample of
/// their stored last error; that group is retried by its fingerprint like
/// any other, and a failure after the upgrade groups by its own fingerprint.
async fn upgrade_groups_old_dead_letters_as_unknown<S: OutboxStore + DeadLetterStore>(
    store: &S,
    old: &OldDb,
    kill_by_hand: impl AsyncFnOnce() -> anyhow::Result<()>,
    upgrade: impl AsyncFnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let messages = [
        NewMessage::new("acme", "t", &Event { n: 1 })?,
        NewMessage::new("acme", "t", &Event { n: 2 })?,
        NewMessage::new("acme", "t", &Event { n: 3 })?,
    ];
    old.publish(&messages).await?;
    kill_by_hand().await?;
    upgrade().await?;

    let any = DeadLetterFilter::default();
    let groups = store.dead_letter_groups(&any, 10).await?;
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_eq!(groups[0].fingerprint, UNKNOWN_FINGERPRINT);
    assert_eq!(groups[0].count, 3);
    assert_eq!(groups[0].sample_error, "boom before the upgrade");
    assert_eq!(groups[0].subscriptions, ["old"]);
    assert_eq!(groups[0].topics, ["t"]);
    let unknown = DeadLetterFilter {
        fingerprint: Some(UNKNOWN_FINGERPRINT.to_owned()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        store
            .list_dead_letters(&unknown, None, 10)
            .await?
            .items
            .len(),
        3
    );
    assert_eq!(store.retry_dead_letters_matching(&unknown).await?, 3);

    let claimed = claim(store, 10).await?;
    assert_eq!(claimed.len(), 3);
    let failures: Vec<Failure> = claimed
        .iter()
        .map(|d| Failure {
            lease: d.lease(),
            error: format!("permanent failure: order {} refused", d.delivery_id),
            kind: ErrorKind::Permanent,
            retry_in: None,
        })
        .collect();
    store.fail_many(&failures).await?;
    let groups = store.dead_letter_groups(&any, 10).await?;
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_eq!(
        groups[0].fingerprint,
        error_fingerprint(ErrorKind::Permanent, "permanent failure: order 1 refused")
    );
    assert_eq!(groups[0].count, 3);
    Ok(())
}

#[tokio::test]
async fn postgres_dead_letters_from_schema_14_group_as_unknown_after_the_upgrade(
) -> anyhow::Result<()> {
    let (schema, pool, store) = postgres_at(14).await?;
    let result = upgrade_groups_old_dead_letters_as_unknown(
        &store,
        &OldDb::Postgres(pool.clone()),
        async || {
            // As schema 14's fail.sql left a dead letter.
            sqlx::raw_sql(
                "UPDATE deliveries SET state = 'dead', attempts = 1, dead_at = clock_timestamp(),
                   errors = jsonb_build_array(jsonb_build_object(
                     'attempt', 1, 'at', clock_timestamp(),
                     'message', 'boom before the upgrade'))",
            )
            .execute(&pool)
            .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::postgres::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await?;
    result
}

#[tokio::test]
async fn sqlite_dead_letters_from_schema_8_group_as_unknown_after_the_upgrade() -> anyhow::Result<()>
{
    let (_dir, pool, store) = sqlite_at(8).await?;
    upgrade_groups_old_dead_letters_as_unknown(
        &store,
        &OldDb::Sqlite(pool.clone()),
        async || {
            // As schema 8's fail.sql left a dead letter.
            sqlx::raw_sql(
                "UPDATE deliveries SET state = 'dead', attempts = 1,
                   dead_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER),
                   errors = json_array(json_object(
                     'attempt', 1, 'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                     'message', 'boom before the upgrade'))",
            )
            .execute(&pool)
            .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::sqlite::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await
}

/// A database an older build (before priorities) left with pending, running
/// and dead work: after the upgrade the running delivery completes under the
/// lease it had, the pending ones are claimed as priority 0, the dead letter
/// is retried and delivered, and a new priority-9 message overtakes the old
/// backlog. Every message is delivered once.
async fn upgrade_keeps_work_in_flight_and_adds_priorities<S: OutboxStore + DeadLetterStore>(
    store: &S,
    old: &OldDb,
    kill_by_hand: impl AsyncFnOnce() -> anyhow::Result<()>,
    upgrade: impl AsyncFnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let doomed = NewMessage::new("acme", "t", &Event { n: 0 })?;
    old.publish(std::slice::from_ref(&doomed)).await?;
    kill_by_hand().await?;
    let backlog: Vec<NewMessage> = (1..=20)
        .map(|n| NewMessage::new("acme", "t", &Event { n }))
        .collect::<Result<_, _>>()?;
    old.publish(&backlog).await?;
    let running = old.claim(2).await?;
    assert_eq!(running.len(), 2);
    upgrade().await?;

    let mut delivered: Vec<Uuid> = backlog[..2].iter().map(|m| m.id).collect();
    assert_eq!(
        store.complete_many(&running).await?.len(),
        2,
        "a lease from before the upgrade was refused"
    );

    let urgent = NewMessage::new("acme", "t", &Event { n: 99 })?.with_priority(9);
    store.publish_batch(std::slice::from_ref(&urgent)).await?;
    let first = claim(store, 1).await?;
    assert_eq!(
        first.iter().map(|d| d.message_id).collect::<Vec<_>>(),
        [urgent.id]
    );
    let leases: Vec<_> = first.iter().map(ClaimedDelivery::lease).collect();
    store.complete_many(&leases).await?;
    delivered.push(urgent.id);

    assert_eq!(
        store
            .retry_dead_letters_matching(&DeadLetterFilter::default())
            .await?,
        1
    );
    loop {
        let claimed = claim(store, 7).await?;
        if claimed.is_empty() {
            break;
        }
        assert!(claimed.iter().all(|d| d.priority == 0));
        let leases: Vec<_> = claimed.iter().map(ClaimedDelivery::lease).collect();
        store.complete_many(&leases).await?;
        delivered.extend(claimed.iter().map(|d| d.message_id));
    }
    let mut expected: Vec<Uuid> = backlog.iter().map(|m| m.id).collect();
    expected.push(doomed.id);
    expected.push(urgent.id);
    expected.sort();
    delivered.sort();
    assert_eq!(delivered, expected, "every message once");
    Ok(())
}

#[tokio::test]
async fn postgres_an_upgrade_from_schema_15_keeps_work_in_flight_and_adds_priorities(
) -> anyhow::Result<()> {
    let (schema, pool, store) = postgres_at(15).await?;
    let result = upgrade_keeps_work_in_flight_and_adds_priorities(
        &store,
        &OldDb::Postgres(pool.clone()),
        async || {
            sqlx::raw_sql(
                "UPDATE deliveries SET state = 'dead', attempts = 1, dead_at = clock_timestamp(),
                   error_fingerprint = 'unknown'",
            )
            .execute(&pool)
            .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::postgres::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await?;
    result
}

#[tokio::test]
async fn sqlite_an_upgrade_from_schema_9_keeps_work_in_flight_and_adds_priorities(
) -> anyhow::Result<()> {
    let (_dir, pool, store) = sqlite_at(9).await?;
    upgrade_keeps_work_in_flight_and_adds_priorities(
        &store,
        &OldDb::Sqlite(pool.clone()),
        async || {
            sqlx::raw_sql(
                "UPDATE deliveries SET state = 'dead', attempts = 1,
                   dead_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER),
                   error_fingerprint = 'unknown'",
            )
            .execute(&pool)
            .await?;
            Ok(())
        },
        async || {
            store.migrate().await?;
            anyhow::ensure!(store.schema_version().await? == courier::sqlite::SCHEMA_VERSION);
            Ok(())
        },
    )
    .await
}

/// SQLite schema 10 refused a stream entry pending with 0 deliveries, which
/// a subscription leaves when it takes back the only delivery of an entry
/// it deferred. The upgrade keeps every pending entry (consumer, count,
/// idle time) and then allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_upgrade_from_schema_10_keeps_pending_stream_entries_and_allows_uncounting(
) -> anyhow::Result<()> {
    use courier::StreamStore;
    use courier::{GroupStart, NewStreamEntry, PendingQuery, ReadNew, StreamEntryId, StreamKey};

    let (_dir, _pool, store) = sqlite_at(10).await?;
    let key = StreamKey::new("acme", "events")?;
    store.ensure_group(&key, "g", GroupStart::Beginning).await?;
    let entries: Vec<_> = (0..3)
        .map(|n| NewStreamEntry::new(serde_json::json!({ "n": n })))
        .collect();
    let ids = store.append(&key, &entries).await?;
    for (consumer, count) in [("c1", 2), ("c2", 1)] {
        let read = ReadNew {
            group: "g".to_owned(),
            consumer: consumer.to_owned(),
            count,
            block: None,
        };
        anyhow::ensure!(store.read_new(&key, &read).await?.len() == count);
    }
    store
        .read_pending(&key, "g", "c1", StreamEntryId::ZERO, 1)
        .await?;
    let all = PendingQuery {
        after: StreamEntryId::ZERO,
        count: 10,
        consumer: None,
        min_idle: None,
    };
    let counts = |detail: Vec<courier::PendingDetail>| {
        detail
            .into_iter()
            .map(|d| (d.id, d.consumer, d.deliveries))
            .collect::<Vec<_>>()
    };
    let before = counts(store.pending_detail(&key, "g", &all).await?);
    assert_eq!(
        before,
        vec![
            (ids[0], "c1".to_owned(), 2),
            (ids[1], "c1".to_owned(), 1),
            (ids[2], "c2".to_owned(), 1),
        ]
    );
    assert!(
        store
            .uncount_deliveries(&key, "g", "c1", &ids[1..2])
            .await
            .is_err(),
        "schema 10 refuses a count of 0"
    );

    store.migrate().await?;
    anyhow::ensure!(store.schema_version().await? == courier::sqlite::SCHEMA_VERSION);
    assert_eq!(counts(store.pending_detail(&key, "g", &all).await?), before);
    assert_eq!(store.uncount_deliveries(&key, "g", "c1", &ids).await?, 2);
    assert_eq!(
        counts(store.pending_detail(&key, "g", &all).await?),
        vec![
            (ids[0], "c1".to_owned(), 1),
            (ids[1], "c1".to_owned(), 0),
            (ids[2], "c2".to_owned(), 1),
        ]
    );
    Ok(())
}
