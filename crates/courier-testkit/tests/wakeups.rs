//! PostgreSQL wake-ups and locks: an idle worker is woken even after the
//! database lost its announcement, no tenant or key text can take one of
//! Courier's own advisory locks, and a producer waits only for producers of
//! its own ordering key.

use std::time::Duration;

use courier::{handler_fn, HandlerError, Message, NewMessage, OutboxStore};
use courier_testkit::{events, eventually, Backend, CallCounter, Event, PgFixture};

fn counting(counter: CallCounter) -> impl courier::Handler<Payload = Event> {
    handler_fn(move |message: Message<Event>| {
        let counter = counter.clone();
        async move {
            counter.record(message.id, message.payload.n);
            Ok::<(), HandlerError>(())
        }
    })
}

/// A crash or failover empties the unlogged `idle_workers` table; producers
/// then see no idle worker and send no NOTIFY. The idle worker announces
/// itself again on its own, so a message is picked up long before its
/// two-minute poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_is_woken_after_the_database_lost_its_announcement() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let counter = CallCounter::default();
    let worker = pg
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .poll_interval(Duration::from_secs(120))
        .maintenance(None)
        .build()
        .await?
        .start();
    let announced = || async {
        pg.scalar("SELECT count(*) FROM idle_workers")
            .await
            .is_ok_and(|n| n == 1)
    };
    assert!(eventually(Duration::from_secs(10), announced).await);
    pg.execute("TRUNCATE idle_workers").await?;
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    // Well before the 120 s poll; 30 s leave a loaded machine its time.
    let picked_up = eventually(Duration::from_secs(30), || async { counter.total() == 1 }).await;
    worker.shutdown().await;
    assert!(
        picked_up,
        "the message waited for the poll after the announcement was lost"
    );
    Ok(())
}

/// Whether the backend `pid` waits for an advisory lock.
async fn waits_for_an_advisory_lock(pg: &PgFixture, pid: i32) -> bool {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted",
    )
    .bind(pid)
    .fetch_one(&pg.pool)
    .await
    .is_ok_and(|n| n > 0)
}

/// Tenant `idle` with key `sub` used to hash to the lock a worker of `sub`
/// takes to announce idleness, and tenant `claim` to the one in-flight-limited
/// claims take: an open producer transaction blocked both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tenant_or_key_text_takes_courier_s_own_locks() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    store
        .register_subscription(&courier::SubscriptionSpec {
            name: "sub".into(),
            topics: vec!["topic".into()],
            replay: None,
        })
        .await?;
    // A topic `sub` does not receive: the producer shares none of its locks
    // (a producer that fans out to `sub` rightly holds up its idle handshake).
    let mut producer = pg.pool.begin().await?;
    for tenant in ["idle", "claim", "in-flight"] {
        pg.courier()
            .enqueue(
                &mut producer,
                &NewMessage::new(tenant, "elsewhere", &Event { n: 1 })?.with_ordering_key("sub"),
            )
            .await?;
    }
    let announced = tokio::time::timeout(
        Duration::from_secs(5),
        store.announce_idle("sub", "w", true),
    )
    .await;
    assert!(
        matches!(announced, Ok(Ok(true))),
        "announcing idleness waited for a producer of tenant idle"
    );
    let params = courier::ClaimParams {
        subscription: "sub".into(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit: 10,
        lease: Duration::from_secs(30),
        worker_id: "w".into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: Some(5),
    };
    let claimed = tokio::time::timeout(Duration::from_secs(5), store.claim(&params)).await;
    assert!(
        matches!(claimed, Ok(Ok(_))),
        "an in-flight-limited claim waited for a producer of tenant claim"
    );
    producer.commit().await?;
    Ok(())
}

/// What a producer waits for: another uncommitted producer of the same
/// (tenant, ordering key), until it commits; a producer of another key, or of
/// the same key in another tenant, goes straight through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_waits_only_for_producers_of_its_own_ordering_key() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    pg.courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let keyed = |tenant: &str, key: &str| {
        NewMessage::new(tenant, "topic", &Event { n: 1 }).map(|m| m.with_ordering_key(key))
    };
    let mut first = pg.pool.begin().await?;
    pg.courier()
        .enqueue(&mut first, &keyed("acme", "k")?)
        .await?;

    // Other keys and other tenants commit while `first` is open.
    for (tenant, key) in [("acme", "other"), ("globex", "k")] {
        let mut tx = pg.pool.begin().await?;
        tokio::time::timeout(
            Duration::from_secs(5),
            pg.courier().enqueue(&mut tx, &keyed(tenant, key)?),
        )
        .await??;
        tx.commit().await?;
    }

    // The same key waits for `first`, and only until it commits.
    let mut second = pg.pool.acquire().await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *second)
        .await?;
    let courier = pg.courier().clone();
    let same_key = keyed("acme", "k")?;
    let waiting = tokio::spawn(async move {
        let mut tx = sqlx::Connection::begin(&mut *second).await?;
        courier.enqueue(&mut tx, &same_key).await?;
        tx.commit().await?;
        anyhow::Ok(())
    });
    assert!(
        eventually(Duration::from_secs(5), || waits_for_an_advisory_lock(
            &pg, pid
        ))
        .await,
        "the second producer of acme/k did not wait for the first"
    );
    first.commit().await?;
    tokio::time::timeout(Duration::from_secs(5), waiting).await???;
    assert_eq!(pg.scalar("SELECT count(*) FROM deliveries").await?, 4);
    Ok(())
}
