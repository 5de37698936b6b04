//! Which messages a subscription is owed: decided by commit order whatever
//! the producer's isolation level, with replay of retained messages for a
//! new subscription, and topics that can be removed as well as added.

use std::time::Duration;

use courier::{AdminStore, NewMessage, OutboxStore, Replay, SubscriptionSpec};
use courier_testkit::{backend_tests, eventually, Backend, Event, PgFixture, SqliteFixture};
use uuid::Uuid;

/// Claims (and leaves running) everything subscription `name` is owed on
/// topics `a` and `b`, in claim order.
async fn claim_all<S: OutboxStore>(store: &S, name: &str) -> anyhow::Result<Vec<Uuid>> {
    let params = courier::ClaimParams {
        subscription: name.into(),
        routes: vec![courier::Route {
            topic: "*".into(),
            schema_version: 0,
            max_attempts: 10,
        }],
        limit: 1000,
        lease: Duration::from_secs(60),
        worker_id: "test".into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    };
    let mut ids = Vec::new();
    loop {
        let batch = store.claim(&params).await?.deliveries;
        if batch.is_empty() {
            return Ok(ids);
        }
        ids.extend(batch.iter().map(|d| d.message_id));
    }
}

/// Enqueues one message per number on `topic`, each in its own transaction.
async fn enqueue_each<B: Backend>(
    backend: &B,
    topic: &str,
    ns: &[i64],
) -> anyhow::Result<Vec<Uuid>> {
    let mut ids = Vec::new();
    for &n in ns {
        let message = NewMessage::new("acme", topic, &Event { n })?;
        ids.push(backend.enqueue_committed(&[message]).await?[0].id);
        // Enqueue times are kept to the millisecond on SQLite: keep them apart.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    Ok(ids)
}

async fn a_new_subscription_replays_retained_messages_from_an_id_or_a_time<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    let a = enqueue_each(&backend, "a", &[1, 2, 3]).await?;
    let b = enqueue_each(&backend, "b", &[4]).await?;

    let from_id = store
        .register_subscription(
            &SubscriptionSpec::new("from-id", ["a"]).with_replay(Replay::FromMessage(a[1])),
        )
        .await?;
    assert!(from_id.created);
    assert_eq!(from_id.replayed, 2, "a[1] and a[2], not a[0] nor topic b");
    assert_eq!(claim_all(store, "from-id").await?, a[1..].to_vec());

    let Some((second, _)) = store.get_message(a[1]).await? else {
        anyhow::bail!("message a[1] is not retained");
    };
    let since = store
        .register_subscription(
            &SubscriptionSpec::new("since", ["a", "b"])
                .with_replay(Replay::Since(second.enqueued_at)),
        )
        .await?;
    assert_eq!(
        since.replayed, 3,
        "a[1], a[2] and b[0] were enqueued at or after a[1]"
    );
    assert_eq!(
        claim_all(store, "since").await?,
        vec![a[1], a[2], b[0]],
        "replayed in enqueue order"
    );

    let all = store
        .register_subscription(&SubscriptionSpec::new("all", ["*"]).with_replay(Replay::All))
        .await?;
    assert_eq!(all.replayed, 4);

    // A replay applies only when the registration creates the subscription:
    // a worker restarting with the same spec replays nothing twice.
    let again = store
        .register_subscription(&SubscriptionSpec::new("all", ["*"]).with_replay(Replay::All))
        .await?;
    assert_eq!(again, courier::Registration::default());
    assert_eq!(claim_all(store, "all").await?.len(), 4);

    // Messages committed after the registration are fanned out once, not
    // replayed as well.
    let later = enqueue_each(&backend, "a", &[5]).await?;
    assert_eq!(claim_all(store, "from-id").await?, later);
    assert_eq!(claim_all(store, "all").await?, later);

    // Without replay a new subscription starts with what commits after it.
    store
        .register_subscription(&SubscriptionSpec::new("plain", ["a"]))
        .await?;
    assert!(claim_all(store, "plain").await?.is_empty());
    Ok(())
}

async fn a_replay_from_a_message_that_is_not_retained_is_refused_and_creates_nothing<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    enqueue_each(&backend, "a", &[1]).await?;
    let refused = store
        .register_subscription(
            &SubscriptionSpec::new("sub", ["a"]).with_replay(Replay::FromMessage(Uuid::now_v7())),
        )
        .await;
    match refused {
        Err(courier::StoreError::Invalid(error)) => {
            assert_eq!(error.field, "replay", "{error}");
        }
        other => anyhow::bail!("expected a validation error, got {other:?}"),
    }
    assert!(
        store.list_subscriptions(None, 100).await?.items.is_empty(),
        "nothing half-stored"
    );
    Ok(())
}

async fn a_removed_topic_is_no_longer_owed_but_what_was_owed_stays<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["a", "b.*"]))
        .await?;
    let owed = enqueue_each(&backend, "a", &[1]).await?;
    assert_eq!(
        store
            .remove_subscription_topics("sub", &["a".into(), "c".into()])
            .await?,
        1,
        "only `a` was registered"
    );
    enqueue_each(&backend, "a", &[2]).await?;
    let kept = enqueue_each(&backend, "b.x", &[3]).await?;
    assert_eq!(
        claim_all(store, "sub").await?,
        vec![owed[0], kept[0]],
        "the delivery owed before the removal stays; `a` after it is not owed"
    );
    let topics: Vec<String> = store
        .list_subscriptions(None, 100)
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.topics)
        .collect();
    assert_eq!(topics, vec!["b.*".to_owned()]);
    // Adding it back takes effect from then on.
    let added = store
        .register_subscription(&SubscriptionSpec::new("sub", ["a"]))
        .await?;
    assert_eq!(added.topics_added, 1);
    let again = enqueue_each(&backend, "a", &[4]).await?;
    assert_eq!(claim_all(store, "sub").await?, again);
    Ok(())
}

async fn a_worker_that_creates_its_subscription_can_replay_what_was_retained<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    enqueue_each(&backend, "topic", &[1, 2, 3]).await?;
    let counter = courier_testkit::CallCounter::default();
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, courier_testkit::counting(counter.clone()))
        .replay(Replay::All)
        .maintenance(None)
        .build()
        .await?
        .start();
    enqueue_each(&backend, "topic", &[4]).await?;
    let all = eventually(Duration::from_secs(10), || async { counter.total() == 4 }).await;
    worker.shutdown().await;
    assert!(all, "handled {} of 3 replayed and 1 new", counter.total());
    assert_eq!(counter.distinct(), 4, "each once");
    Ok(())
}

backend_tests!(
    a_worker_that_creates_its_subscription_can_replay_what_was_retained,
    a_new_subscription_replays_retained_messages_from_an_id_or_a_time,
    a_replay_from_a_message_that_is_not_retained_is_refused_and_creates_nothing,
    a_removed_topic_is_no_longer_owed_but_what_was_owed_stays,
);

/// The SQLSTATE of a PostgreSQL error inside a Courier or sqlx error.
fn sqlstate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
            return db.code().map(|c| c.into_owned());
        }
        source = error.source();
    }
    None
}

/// A REPEATABLE READ producer whose snapshot was taken before a subscription
/// was registered, inserting after the registration committed, commits after
/// it: its message is owed to the subscription, or the insert fails with a
/// serialization failure (and the retry is owed) — never silently missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_repeatable_read_producer_older_than_a_registration_never_misses_it(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let mut producer = pg.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *producer)
        .await?;
    // The snapshot is taken here, before the subscription exists.
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&mut *producer)
        .await?;
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["a"]))
        .await?;

    let message = NewMessage::new("acme", "a", &Event { n: 1 })?;
    match pg.courier().enqueue(&mut producer, &message).await {
        Ok(_) => {
            producer.commit().await?;
            let owed = pg
                .scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
                .await?;
            assert_eq!(owed, 1, "committed after the registration, so owed to it");
        }
        Err(error) => {
            assert_eq!(
                sqlstate(&error).as_deref(),
                Some("40001"),
                "a stale snapshot must fail as a serialization failure: {error}"
            );
            producer.rollback().await?;
            pg.enqueue_committed(&[message]).await?;
            let owed = pg
                .scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
                .await?;
            assert_eq!(owed, 1, "the retried message is owed to the subscription");
        }
    }
    // A REPEATABLE READ producer that began after the registration is not refused.
    let mut fresh = pg.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *fresh)
        .await?;
    let next = NewMessage::new("acme", "a", &Event { n: 2 })?;
    pg.courier().enqueue(&mut fresh, &next).await?;
    fresh.commit().await?;
    assert_eq!(
        pg.scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
            .await?,
        2
    );
    Ok(())
}

/// A READ COMMITTED producer that fanned out before a registration and
/// commits after it started: either the registration waits for it (the
/// message committed first and is not owed), or, if the registration
/// committed first, the message must be owed. Today's failure mode was the
/// registration committing first and the message owing it nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_read_committed_producer_in_flight_during_a_registration_is_ordered_by_commit(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let mut producer = pg.pool.begin().await?;
    let message = NewMessage::new("acme", "a", &Event { n: 1 })?;
    pg.courier().enqueue(&mut producer, &message).await?;

    let registering = tokio::spawn(async move {
        store
            .register_subscription(&SubscriptionSpec::new("sub", ["a"]))
            .await
    });
    let registered_first = eventually(Duration::from_secs(1), || async {
        registering.is_finished()
    })
    .await;
    producer.commit().await?;
    registering.await??;
    let owed = pg
        .scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
        .await?;
    if registered_first {
        assert_eq!(
            owed, 1,
            "the registration committed before the message, which is not owed to it"
        );
    } else {
        assert_eq!(owed, 0, "the message committed before the registration");
    }
    // After both, every message is owed.
    pg.enqueue_committed(&[NewMessage::new("acme", "a", &Event { n: 2 })?])
        .await?;
    assert_eq!(
        pg.scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
            .await?,
        owed + 1
    );
    Ok(())
}

/// SQLite's one writer orders a registration and a producer by commit: a
/// producer whose read transaction began before the registration either gets
/// the delivery or fails to write (its snapshot is stale), never silently
/// missing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_producer_whose_snapshot_predates_a_registration_never_misses_it(
) -> anyhow::Result<()> {
    let db = SqliteFixture::new().await?;
    let store = db.courier().store().clone();
    let mut producer = db.pool.begin().await?;
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&mut *producer)
        .await?;
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["a"]))
        .await?;
    let message = NewMessage::new("acme", "a", &Event { n: 1 })?;
    let written = db.courier().enqueue(&mut producer, &message).await;
    match written {
        Ok(_) => {
            producer.commit().await?;
            assert_eq!(
                db.scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
                    .await?,
                1
            );
        }
        Err(error) => {
            producer.rollback().await?;
            assert!(
                error.to_string().to_lowercase().contains("lock")
                    || error.to_string().to_lowercase().contains("busy"),
                "a stale snapshot fails to write: {error}"
            );
            assert_eq!(db.scalar("SELECT count(*) FROM messages").await?, 0);
        }
    }
    Ok(())
}

/// A producer transaction that stays open holds a registration up, but the
/// registration does not hold other producers up for long while it waits:
/// it queues for the lock only briefly at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_registration_held_up_by_an_open_producer_never_stalls_other_producers(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let mut open = pg.pool.begin().await?;
    pg.courier()
        .enqueue(&mut open, &NewMessage::new("acme", "a", &Event { n: 1 })?)
        .await?;
    let registering = tokio::spawn(async move {
        store
            .register_subscription(&SubscriptionSpec::new("sub", ["a"]))
            .await
    });
    // Past the registration's first 2 s of tries, it queues now and then.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut slowest = Duration::ZERO;
    for n in 2..12 {
        let started = std::time::Instant::now();
        pg.enqueue_committed(&[NewMessage::new("acme", "a", &Event { n })?])
            .await?;
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        !registering.is_finished(),
        "the registration went ahead of an open producer"
    );
    open.commit().await?;
    registering.await??;
    // Behind the registration a producer would wait until the open one
    // commits (for ever here); the registration queues at most 200 ms at a
    // time, and 2 s leave a loaded machine its time beside that.
    assert!(
        slowest < Duration::from_secs(2),
        "a producer waited {slowest:?} behind a waiting registration"
    );
    assert_eq!(
        pg.scalar("SELECT count(*) FROM deliveries WHERE subscription = 'sub'")
            .await?,
        0,
        "every message committed before the registration"
    );
    Ok(())
}
