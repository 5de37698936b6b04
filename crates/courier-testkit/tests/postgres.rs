//! PostgreSQL-only promises: the SQL contract for non-Rust producers,
//! LISTEN/NOTIFY wake-ups that survive a killed connection, workers in
//! separate processes racing over one outbox, migrations started together,
//! and the claim's index walks (floors under a held snapshot). The store
//! traits' promises, lease fences included, are in the store conformance
//! suite (`tests/store.rs`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use courier::{handler_fn, HandlerError, Message};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sql_insert_is_delivered_to_every_matching_subscription() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let exact = CallCounter::default();
    let wildcard = CallCounter::default();
    let everything = CallCounter::default();
    let unrelated = CallCounter::default();
    let courier = pg.courier();
    let exact_worker = courier
        .worker("exact")
        .handle("invoice.paid", 1, counting(exact.clone()))
        .maintenance(None)
        .build()
        .await?;
    let wildcard_worker = courier
        .worker("wildcard")
        .handle("invoice.paid", 1, counting(wildcard.clone()))
        .maintenance(None)
        .build()
        .await?;
    let all_worker = courier
        .worker("all")
        .handle("invoice.paid", 1, counting(everything.clone()))
        .maintenance(None)
        .build()
        .await?;
    let unrelated_worker = courier
        .worker("unrelated")
        .handle("order.placed", 1, counting(unrelated.clone()))
        .maintenance(None)
        .build()
        .await?;
    // Widen two subscriptions' patterns the way the daemon's config does.
    courier::OutboxStore::register_subscription(
        courier.store(),
        &courier::SubscriptionSpec {
            name: "wildcard".into(),
            topics: vec!["invoice.*".into()],
            replay: None,
        },
    )
    .await?;
    courier::OutboxStore::register_subscription(
        courier.store(),
        &courier::SubscriptionSpec {
            name: "all".into(),
            topics: vec!["*".into()],
            replay: None,
        },
    )
    .await?;
    // The documented contract: only tenant, topic and payload are required.
    pg.execute(
        r#"INSERT INTO messages (tenant, topic, payload) VALUES ('acme', 'invoice.paid', '{"n": 41}');
           INSERT INTO messages (tenant, topic, schema_version, payload, headers, ordering_key, idempotency_key)
             VALUES ('acme', 'invoice.paid', 1, '{"n": 42}', '{"source": "php"}', 'invoice-9', 'pay-9');"#,
    )
    .await?;
    let duplicate = pg
        .execute(
            r#"INSERT INTO messages (tenant, topic, payload, idempotency_key) VALUES ('acme', 'invoice.paid', '{"n": 43}', 'pay-9')
               ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"#,
        )
        .await?;
    assert_eq!(duplicate, 0);
    let version: i64 = pg
        .scalar("SELECT count(*) FROM messages WHERE (id::text)::uuid IS NOT NULL AND substr(id::text, 15, 1) = '7'")
        .await?;
    assert_eq!(version, 2, "ids default to UUIDv7");
    assert_eq!(exact_worker.run_once().await?, 2);
    assert_eq!(wildcard_worker.run_once().await?, 2);
    assert_eq!(all_worker.run_once().await?, 2);
    assert_eq!(unrelated_worker.run_once().await?, 0);
    assert_eq!(
        (
            exact.total(),
            wildcard.total(),
            everything.total(),
            unrelated.total()
        ),
        (2, 2, 2, 0)
    );
    // Bad rows are refused by the table itself, with the name grammar of
    // `validate_name`: ASCII letters, digits, '.', '_', '-', not leading with
    // punctuation, 1 to 128 bytes.
    for (tenant, topic) in [
        ("a:b", "t"),
        ("", "t"),
        ("-a", "t"),
        ("a", ".t"),
        ("a", "t t"),
        ("é", "t"),
        ("a", "t\n"),
    ] {
        let refused = pg
            .execute(&format!(
                "INSERT INTO messages (tenant, topic, payload) VALUES ('{tenant}', E'{topic}', '{{}}')"
            ))
            .await;
        assert!(refused.is_err(), "{tenant:?} / {topic:?} was stored");
    }
    let longest = "a".repeat(128);
    pg.execute(&format!(
        "INSERT INTO messages (tenant, topic, payload) VALUES ('{longest}', '{longest}', '{{}}')"
    ))
    .await?;
    assert!(pg
        .execute(&format!(
            "INSERT INTO messages (tenant, topic, payload) VALUES ('{longest}a', 't', '{{}}')"
        ))
        .await
        .is_err());
    assert!(pg
        .execute(
            "INSERT INTO messages (tenant, topic, payload, headers) VALUES ('a', 't', '{}', '[1]')"
        )
        .await
        .is_err());
    Ok(())
}

async fn listener_pid(pg: &PgFixture) -> anyhow::Result<Option<i32>> {
    let pid: Option<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE query = $1 AND pid <> pg_backend_pid() LIMIT 1",
    )
    .bind(format!("LISTEN \"{}.courier\"", pg.schema))
    .fetch_optional(&pg.pool)
    .await?;
    Ok(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_an_idle_worker_even_after_its_listen_connection_is_killed(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let counter = CallCounter::default();
    let worker = pg
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .poll_interval(Duration::from_secs(120))
        .build()
        .await?
        .start();
    assert!(
        eventually(Duration::from_secs(10), || async {
            matches!(listener_pid(&pg).await, Ok(Some(_)))
        })
        .await
    );
    // Let the worker go idle, then publish: only NOTIFY can wake it in time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    assert!(eventually(Duration::from_secs(5), || async { counter.total() == 1 }).await);
    assert!(sent.elapsed() < Duration::from_secs(5));

    let pid = listener_pid(&pg)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no listener"))?;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&pg.pool)
        .await?;
    assert!(killed);
    assert!(
        eventually(Duration::from_secs(10), || async {
            matches!(listener_pid(&pg).await, Ok(Some(new)) if new != pid)
        })
        .await,
        "the notifier did not listen again"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    assert!(
        eventually(Duration::from_secs(5), || async { counter.total() == 2 }).await,
        "not picked up after re-listen"
    );
    assert!(sent.elapsed() < Duration::from_secs(5));
    worker.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_in_two_processes_apply_each_message_once_per_subscription(
) -> anyhow::Result<()> {
    let pg = PgFixture::with_connections(4).await?;
    pg.create_effects_table().await?;
    pg.execute("CREATE TABLE handler_calls (subscription text NOT NULL, message_id text NOT NULL)")
        .await?;
    // Register both subscriptions before publishing, as deployed workers would have.
    for name in ["alpha", "beta"] {
        courier::OutboxStore::register_subscription(
            pg.courier().store(),
            &courier::SubscriptionSpec {
                name: name.into(),
                topics: vec!["order.placed".into()],
                replay: None,
            },
        )
        .await?;
    }
    let n: i64 = 10_000;
    for chunk in events("acme", "order.placed", n)?.chunks(1000) {
        pg.enqueue_committed(chunk).await?;
    }
    let spawn = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_courier-test-worker"))
            .args([
                "--schema",
                &pg.schema,
                "--subscriptions",
                "alpha,beta",
                "--workers",
                "2",
            ])
            .env("DATABASE_URL", courier_testkit::database_url())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
    };
    let (mut first, mut second) = (spawn()?, spawn()?);
    let (a, b) = tokio::join!(first.wait(), second.wait());
    assert!(a?.success() && b?.success(), "a worker process failed");
    for subscription in ["alpha", "beta"] {
        let receipts = pg
            .scalar(&format!(
                "SELECT count(*) FROM receipts WHERE subscription = '{subscription}'"
            ))
            .await?;
        let effects = pg
            .scalar(&format!(
                "SELECT count(*) FROM effects WHERE subscription = '{subscription}' AND calls = 1"
            ))
            .await?;
        let calls = pg
            .scalar(&format!(
                "SELECT count(*) FROM handler_calls WHERE subscription = '{subscription}'"
            ))
            .await?;
        assert_eq!((receipts, effects, calls), (n, n, n), "{subscription}");
    }
    assert_eq!(
        pg.scalar("SELECT count(*) FROM effects WHERE calls <> 1")
            .await?,
        0
    );
    assert_eq!(pg.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_once_when_many_processes_start_together() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let fresh = format!("{}_m", pg.schema);
    let pool = courier_testkit::pg_pool(&fresh, 8).await?;
    let runs = (0..6).map(|_| {
        let courier = courier::Courier::postgres_with_schema(pool.clone(), &fresh);
        async move { courier?.migrate().await.map_err(anyhow::Error::from) }
    });
    for result in futures_util::future::join_all(runs).await {
        result?;
    }
    let applied: i64 =
        sqlx::query_scalar(&format!("SELECT count(*) FROM {fresh}.schema_migrations"))
            .fetch_one(&pool)
            .await?;
    assert_eq!(applied, courier::postgres::SCHEMA_VERSION);
    sqlx::query(&format!("DROP SCHEMA {fresh} CASCADE"))
        .execute(&pool)
        .await?;
    Ok(())
}

/// Waits up to `limit` for a notification on `listener`.
/// Whether a wake-up arrives within `limit` (the workers' own liveness
/// probes of their LISTEN connections are not wake-ups).
async fn notified(listener: &mut sqlx::postgres::PgListener, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, listener.recv()).await {
            Ok(Ok(n)) if n.payload().starts_with("courier-listener-check:") => continue,
            Ok(Ok(_)) => return true,
            _ => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_notify_only_while_a_worker_is_idle() -> anyhow::Result<()> {
    // NOTIFY makes committing transactions take turns, so producers send it
    // only when a worker has announced that it is idle.
    let pg = PgFixture::new().await?;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pg.pool).await?;
    listener.listen(&format!("{}.courier", pg.schema)).await?;
    let idle_rows = || pg.scalar("SELECT count(*) FROM idle_workers");

    // No worker is idle: a producer does not notify.
    let courier = pg.courier();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let counter = CallCounter::default();
    let (handler_gate, handler_counter) = (gate.clone(), counter.clone());
    let worker = courier
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let (gate, counter) = (handler_gate.clone(), handler_counter.clone());
                async move {
                    counter.record(message.id, message.payload.n);
                    // Each handler waits for one permit: the test decides when it ends.
                    let permit = gate.acquire().await.map_err(HandlerError::retry)?;
                    permit.forget();
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .concurrency(1)
        .batch_size(1)
        .poll_interval(Duration::from_secs(120))
        .build()
        .await?;
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    assert_eq!(idle_rows().await?, 0);
    assert!(
        !notified(&mut listener, Duration::from_millis(300)).await,
        "notified with no idle worker"
    );

    // The worker takes that message, then finds nothing and announces itself idle.
    let running = worker.start();
    assert!(eventually(Duration::from_secs(10), || async { counter.total() == 1 }).await);
    gate.add_permits(1);
    assert!(
        eventually(Duration::from_secs(10), || async {
            matches!(idle_rows().await, Ok(1))
        })
        .await,
        "the idle worker did not announce itself"
    );

    // An idle worker is woken by NOTIFY (its poll interval is 2 minutes).
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    assert!(notified(&mut listener, Duration::from_secs(5)).await);
    assert!(eventually(Duration::from_secs(5), || async { counter.total() == 2 }).await);

    // Busy (its one slot taken), it withdraws: the next producer does not notify.
    assert!(
        eventually(Duration::from_secs(5), || async {
            matches!(idle_rows().await, Ok(0))
        })
        .await,
        "the busy worker stayed announced"
    );
    while notified(&mut listener, Duration::from_millis(100)).await {}
    pg.enqueue_committed(&events("acme", "topic", 1)?).await?;
    assert!(
        !notified(&mut listener, Duration::from_millis(300)).await,
        "notified while the only worker was busy"
    );
    // Its slot freed, it claims the waiting message without a wake-up.
    gate.add_permits(1);
    assert!(eventually(Duration::from_secs(5), || async { counter.total() == 3 }).await);
    gate.add_permits(1);
    running.shutdown().await;
    assert_eq!(idle_rows().await?, 0, "shutdown withdraws the announcement");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_walks_each_tenant_s_ready_rows_not_the_whole_table() -> anyhow::Result<()> {
    // After ANALYZE saw one big tenant, `tenant = $x ... ORDER BY id` let the
    // planner walk the primary key and filter out the big tenant's rows for
    // every small tenant (1.2 s per claim beside a 200,000-row backlog).
    let pg = PgFixture::new().await?;
    let courier = pg.courier();
    courier
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .build()
        .await?;
    for chunk in events("big", "topic", 20_000)?.chunks(1000) {
        pg.enqueue_committed(chunk).await?;
    }
    pg.execute("ANALYZE deliveries").await?;
    for tenant in ["small-a", "small-b", "small-c"] {
        pg.enqueue_committed(&events(tenant, "topic", 2)?).await?;
    }
    let claim = courier
        .store()
        .query_sql("claim")
        .ok_or_else(|| anyhow::anyhow!("no claim query"))?
        .to_owned();
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {claim}"))
        .bind("sub")
        .bind("")
        .bind(256_i32)
        .bind(256_i32)
        .bind(vec!["topic"])
        .bind(vec![1_i32])
        .bind(vec![10_i32])
        .bind(None::<i32>)
        .bind(30_000_i64)
        .bind("w")
        .bind(uuid::Uuid::new_v4())
        .bind(Some(10_i32))
        .bind(Vec::<String>::new())
        .bind(Vec::<i64>::new())
        .bind(0_i64)
        .fetch_all(&pg.pool)
        .await?;
    let text = plan.join("\n");
    // The per-tenant scan: deliveries_ready, from the tenant's first row.
    let ready_scan = plan
        .iter()
        .position(|line| line.contains("Index Scan using deliveries_ready on deliveries"));
    let range = ready_scan.and_then(|at| plan.get(at + 1));
    assert!(
        range.is_some_and(|cond| cond.contains("ROW(tenant, id) > ROW(")),
        "the per-tenant scan has no tenant range on deliveries_ready:\n{text}"
    );
    // The primary key only finds the picked rows by id, the highest id (its
    // last entry) and what was enqueued above an id; it never filters
    // tenants.
    for (at, line) in plan.iter().enumerate() {
        if line.contains("using deliveries_pkey") {
            let next = plan.get(at + 1).map(String::as_str).unwrap_or_default();
            let by_id = next.contains("Index Cond: (id = ")
                || next.contains("Index Cond: (id > ")
                || (line.contains("Backward") && next.contains("Index Cond: (id IS NOT NULL)"));
            assert!(by_id, "the claim walks the primary key:\n{text}");
        }
    }
    Ok(())
}

/// Registers subscription `sub` for `topic` v1, as its workers would.
async fn register_sub(pg: &PgFixture) -> anyhow::Result<()> {
    pg.courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    Ok(())
}

/// The claim parameters a worker of subscription `sub` handling `topic` v1 uses.
fn claim_params(limit: usize) -> courier::ClaimParams {
    courier::ClaimParams {
        subscription: "sub".into(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit,
        lease: Duration::from_secs(30),
        worker_id: "w".into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

/// Claims and completes through the store until `count` deliveries are done.
async fn drain_through_store(
    store: &courier::postgres::PgStore,
    params: &courier::ClaimParams,
    count: usize,
) -> anyhow::Result<()> {
    use courier::OutboxStore;
    let mut done = 0;
    while done < count {
        let batch = store.claim(params).await?;
        anyhow::ensure!(
            !batch.deliveries.is_empty(),
            "claims stopped finding work after {done} of {count}"
        );
        let leases: Vec<_> = batch.deliveries.iter().map(|d| d.lease()).collect();
        done += store.complete_many(&leases).await?.len();
    }
    Ok(())
}

/// Index entries of `deliveries_ready` the claim statement reads (in a
/// transaction that rolls back), claiming as a floor pass over `floors` (tenant,
/// floor) or, when `floors` is empty, as a full pass.
async fn ready_entries_read(
    pg: &PgFixture,
    floors: &[(&str, i64)],
) -> anyhow::Result<(i64, usize)> {
    let claim = pg
        .courier()
        .store()
        .query_sql("claim")
        .ok_or_else(|| anyhow::anyhow!("no claim query"))?
        .to_owned();
    let tenants: Vec<&str> = floors.iter().map(|(t, _)| *t).collect();
    let ids: Vec<i64> = floors.iter().map(|(_, f)| *f).collect();
    // The backend's counters run on across transactions until flushed
    // (never inside one): the statement's reads are the difference.
    let read_so_far = "SELECT pg_stat_get_xact_tuples_returned('deliveries_ready'::regclass)";
    let mut tx = pg.pool.begin().await?;
    let before: i64 = sqlx::query_scalar(read_so_far).fetch_one(&mut *tx).await?;
    let rows = sqlx::query(&claim)
        .bind("sub")
        .bind("")
        .bind(256_i32)
        .bind(256_i32)
        .bind(vec!["topic"])
        .bind(vec![1_i32])
        .bind(vec![10_i32])
        .bind(None::<i32>)
        .bind(30_000_i64)
        .bind("w")
        .bind(uuid::Uuid::new_v4())
        .bind(Some(10_i32))
        .bind(&tenants)
        .bind(&ids)
        .bind(0_i64)
        .fetch_all(&mut *tx)
        .await?;
    let claimed = rows
        .iter()
        .filter(|row| {
            matches!(
                sqlx::Row::try_get::<Option<i64>, _>(*row, "id"),
                Ok(Some(_))
            )
        })
        .count();
    let after: i64 = sqlx::query_scalar(read_so_far).fetch_one(&mut *tx).await?;
    tx.rollback().await?;
    Ok((after - before, claimed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_under_a_held_snapshot_start_past_the_deliveries_already_done() -> anyhow::Result<()>
{
    // A snapshot held open elsewhere keeps the index entry of every delivery
    // claimed or completed after it began; a claim that starts at the tenant's
    // first entry reads them all. The store's claims start at its floors.
    let pg = PgFixture::new().await?;
    let courier = pg.courier();
    register_sub(&pg).await?;
    let holder = courier_testkit::StoreFixture::hold_snapshot(&pg).await?;
    for chunk in events("t", "topic", 3_000)?.chunks(1000) {
        pg.enqueue_committed(chunk).await?;
    }
    let store = courier.store();
    drain_through_store(store, &claim_params(250), 3_000).await?;
    let floor = store.claim_floors("sub").get("t").copied().unwrap_or(0);
    let first: i64 = pg
        .scalar("SELECT min(id) FROM deliveries")
        .await
        .unwrap_or(0);
    assert_eq!(first, 0, "every delivery was completed");
    // Delivery ids are 1..=3000 in this fresh schema; the last claim took
    // the last 250.
    assert!(floor >= 2_750, "the floor stayed at {floor}");
    pg.enqueue_committed(&events("t", "topic", 10)?).await?;

    let (full_read, full_claimed) = ready_entries_read(&pg, &[]).await?;
    let (floor_read, floor_claimed) = ready_entries_read(&pg, &[("t", floor)]).await?;
    assert_eq!((full_claimed, floor_claimed), (10, 10));
    assert!(
        full_read >= 3_000,
        "a full pass should read the 3,000 kept entries, read {full_read}"
    );
    assert!(
        floor_read <= 1_000,
        "a floor pass read {floor_read} entries (a full pass {full_read})"
    );
    // And the store itself claims the new ones.
    let batch = courier::OutboxStore::claim(store, &claim_params(250)).await?;
    assert_eq!(batch.deliveries.len(), 10);
    holder.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_committed_after_later_ones_were_claimed_is_still_claimed() -> anyhow::Result<()>
{
    // Its delivery id is below the floor the later claims left: a floor pass
    // skips it, a full pass must find it.
    let pg = PgFixture::new().await?;
    let courier = pg.courier();
    register_sub(&pg).await?;
    let store = courier.store();
    let params = claim_params(5);
    let mut late = pg.pool.begin().await?;
    let outcomes = courier
        .enqueue_batch(&mut late, &events("t", "topic", 1)?)
        .await?;
    let late_message = outcomes
        .first()
        .map(|o| o.id)
        .ok_or_else(|| anyhow::anyhow!("nothing enqueued"))?;
    let late_delivery: i64 = sqlx::query_scalar("SELECT id FROM deliveries WHERE message_id = $1")
        .bind(late_message)
        .fetch_one(&mut *late)
        .await?;
    for _ in 0..3 {
        pg.enqueue_committed(&events("t", "topic", 5)?).await?;
    }
    drain_through_store(store, &params, 15).await?;
    let floor = store.claim_floors("sub").get("t").copied().unwrap_or(0);
    assert!(
        floor >= late_delivery,
        "the test needs the late delivery ({late_delivery}) below the floor ({floor})"
    );
    late.commit().await?;
    // Work above the floor too, so floor passes keep finding something.
    pg.enqueue_committed(&events("t", "topic", 20)?).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut found = false;
    while !found && Instant::now() < deadline {
        let batch = courier::OutboxStore::claim(store, &params).await?;
        found = batch
            .deliveries
            .iter()
            .any(|d| d.message_id == late_message);
        let leases: Vec<_> = batch.deliveries.iter().map(|d| d.lease()).collect();
        courier::OutboxStore::complete_many(store, &leases).await?;
        if batch.deliveries.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(found, "the late message was never claimed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_pauses_while_outcomes_wait_to_be_written() -> anyhow::Result<()> {
    // Handlers finish faster than outcomes are written: the worker must not
    // keep claiming (and heartbeating) ever more unsettled deliveries.
    let pg = PgFixture::new().await?;
    let calls = CallCounter::default();
    let concurrency = 4;
    let worker = pg
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(calls.clone()))
        .concurrency(concurrency)
        .batch_size(concurrency)
        .maintenance(None)
        .build()
        .await?;
    pg.enqueue_committed(&events("t", "topic", 200)?).await?;
    // Completing deletes deliveries; claiming only updates them. A gate on
    // deletes (a lock the test holds) stops every completion and no claim.
    let gate = format!("hashtext('{}:gate')", pg.schema);
    pg.execute(&format!(
        "CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock_shared({gate}); RETURN NULL; END $$;
         CREATE TRIGGER gate AFTER DELETE ON deliveries
         FOR EACH STATEMENT EXECUTE FUNCTION gate()"
    ))
    .await?;
    let mut locker = pg.pool.begin().await?;
    sqlx::query(&format!("SELECT pg_advisory_xact_lock({gate})"))
        .execute(&mut *locker)
        .await?;
    let handle = worker.start();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let while_blocked = calls.total();
    locker.rollback().await?;
    let all = eventually(Duration::from_secs(30), || {
        let calls = calls.clone();
        async move { calls.distinct() == 200 }
    })
    .await;
    handle.shutdown().await;
    assert!(while_blocked >= 1, "the worker never started");
    // Unsettled deliveries stop new claims at twice the concurrency; a claim
    // already in flight may add up to one more concurrency's worth.
    let cap = u64::try_from(3 * concurrency)?;
    assert!(
        while_blocked <= cap,
        "{while_blocked} handler calls while no outcome could be written (at most {cap})"
    );
    assert!(
        all,
        "only {} of 200 delivered after the lock",
        calls.distinct()
    );
    Ok(())
}

/// Connections from `connect_options` bound statements, lock waits and
/// idle transactions (a frozen worker's locks are not held forever), and a
/// URL that sets one itself keeps its own.
#[tokio::test]
async fn courier_s_connection_options_bound_statements_lock_waits_and_idle_transactions(
) -> anyhow::Result<()> {
    use sqlx::postgres::PgPoolOptions;
    async fn settings(url: &str) -> anyhow::Result<Vec<String>> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(courier::postgres::connect_options(url)?)
            .await?;
        let mut shown = Vec::new();
        for name in [
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
        ] {
            shown.push(
                sqlx::query_scalar::<_, String>(&format!("SHOW {name}"))
                    .fetch_one(&pool)
                    .await?,
            );
        }
        Ok(shown)
    }
    let url = courier_testkit::database_url();
    assert_eq!(settings(&url).await?, ["30s", "10s", "2min"]);
    let separator = if url.contains('?') { '&' } else { '?' };
    let own =
        format!("{url}{separator}options=-c%20statement_timeout%3D0%20-c%20lock_timeout%3D1s");
    assert_eq!(settings(&own).await?, ["0", "1s", "2min"]);

    // A statement past the bound is cancelled, not left running.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(courier::postgres::connect_options(&format!(
            "{url}{separator}options=-c%20statement_timeout%3D200"
        ))?)
        .await?;
    let error = sqlx::query("SELECT pg_sleep(5)")
        .execute(&pool)
        .await
        .err()
        .and_then(|e| {
            e.as_database_error()
                .and_then(|d| d.code().map(|c| c.into_owned()))
        });
    assert_eq!(error.as_deref(), Some("57014"), "query_canceled");
    Ok(())
}

/// Pools built from `connect_options` do not JIT-compile (a claim of 256
/// deliveries of an analysed 100,000 backlog took 156 ms with JIT and 6.5 ms
/// without, see BENCHMARKS.md), and a store over a pool that does says so, so
/// its workers can warn.
#[tokio::test]
async fn courier_s_connection_options_turn_jit_off_and_a_jit_pool_is_detected() -> anyhow::Result<()>
{
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let url = courier_testkit::database_url();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(courier::postgres::connect_options(&url)?)
        .await?;
    assert!(!courier::postgres::PgStore::new(pool).jit_enabled().await?);

    let own: PgConnectOptions = url.parse()?;
    let jit_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(own.options([("jit", "on"), ("jit_above_cost", "100000")]))
        .await?;
    assert!(
        courier::postgres::PgStore::new(jit_pool)
            .jit_enabled()
            .await?
    );
    Ok(())
}

/// A store error around a transactional handler's transaction that is not
/// the message's fault spends no attempt: here its receipt insert times out
/// on a lock (another transaction holds the same receipt uncommitted, as a
/// frozen worker's open transaction would). The delivery snoozes instead of
/// being dead-lettered at its only attempt, and applies once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_timeout_around_a_transactional_handler_spends_no_attempt() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    pg.create_effects_table().await?;
    let url = courier_testkit::database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(courier::postgres::connect_options(&format!(
            "{url}{separator}options=-c%20lock_timeout%3D200%20-c%20search_path%3D{}",
            pg.schema
        ))?)
        .await?;
    let courier = courier::Courier::postgres_with_schema(pool, &pg.schema)?;
    let handler = courier_testkit::RecordEffect::default();
    let mut retry = courier::RetryPolicy::with_max_attempts(1);
    retry.base = Duration::from_millis(50);
    let worker = courier
        .worker("sub")
        .handle_transactional("topic", 1, handler)
        .retry_policy(retry)
        .poll_interval(Duration::from_millis(20))
        .maintenance(None)
        .build()
        .await?;
    let message = courier::NewMessage::new("acme", "topic", &Event { n: 1 })?;
    pg.enqueue_committed(std::slice::from_ref(&message)).await?;
    let mut holder = pg.pool.begin().await?;
    sqlx::query(
        "INSERT INTO receipts (tenant, subscription, message_id) VALUES ('acme', 'sub', $1)",
    )
    .bind(message.id)
    .execute(&mut *holder)
    .await?;
    let running = worker.start();
    let snoozed = eventually(Duration::from_secs(10), || async {
        matches!(
            pg.scalar("SELECT coalesce(max(snoozes), 0)::bigint FROM deliveries").await,
            Ok(n) if n >= 2
        )
    })
    .await;
    let dead = pg
        .scalar("SELECT count(*) FROM deliveries WHERE state = 'dead'")
        .await?;
    holder.rollback().await?;
    let applied = eventually(Duration::from_secs(10), || async {
        matches!(pg.scalar("SELECT count(*) FROM deliveries").await, Ok(0))
    })
    .await;
    running.shutdown().await;
    assert_eq!(dead, 0, "the lock timeout spent the only attempt");
    assert!(
        snoozed,
        "the delivery did not wait for the lock by snoozing"
    );
    assert!(
        applied,
        "the delivery was not applied once the lock was gone"
    );
    assert_eq!(pg.scalar("SELECT count(*) FROM effects").await?, 1);
    Ok(())
}

/// A call dropped while its transaction's BEGIN is on the wire (a handler
/// stopped at its lease or timeout, a cancelled request) must not return
/// the connection to the pool inside that transaction: sqlx's `begin` is
/// not cancel-safe on PostgreSQL (the BEGIN is sent, the reply not read,
/// and nothing rolls it back), so the next borrower's statements would run
/// in a transaction that never ends and hold their locks for good (seen in
/// the chaos suite: a maintenance lease row locked that way stopped every
/// rescue). Each try polls a publish once (it sends BEGIN and waits for the
/// reply), drops it, and asks the pool's only connection whether its next
/// statement runs in a transaction of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_begin_leaves_no_pooled_connection_in_a_transaction(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    // One connection, named so that another can watch it.
    let options: sqlx::postgres::PgConnectOptions = courier_testkit::database_url().parse()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            options
                .options([("search_path", pg.schema.as_str())])
                .application_name(&pg.schema),
        )
        .await?;
    let courier = courier::Courier::postgres_with_schema(pool, &pg.schema)?;
    let message = courier::NewMessage::new("acme", "invoice.paid", &serde_json::json!({}))?;
    let mut dropped_pending = 0;
    for round in 0..40 {
        {
            // Dropped after `round % 4` more polls, each a millisecond
            // after the last (the acquire's ping has had its reply): one of
            // them lands between BEGIN sent and its reply read.
            let mut publish = std::pin::pin!(courier.publish(std::slice::from_ref(&message)));
            let mut pending = futures_util::poll!(publish.as_mut()).is_pending();
            for _ in 0..round % 4 {
                if !pending {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
                pending = futures_util::poll!(publish.as_mut()).is_pending();
            }
            if pending {
                dropped_pending += 1;
            }
        }
        // Its BEGIN lands, is rolled back, and the connection is back in
        // the pool (how soon depends on the machine's load; left inside
        // the transaction, it stays there).
        let released = courier_testkit::eventually(Duration::from_secs(10), || async {
            let in_transaction: Result<i64, sqlx::Error> = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
            )
            .bind(&pg.schema)
            .fetch_one(&pg.pool)
            .await;
            matches!(in_transaction, Ok(0))
        })
        .await;
        assert!(
            released,
            "the pool's connection was left inside a transaction"
        );
    }
    assert!(dropped_pending > 0, "no publish was dropped mid-way");
    Ok(())
}

/// A heartbeat's extension that waits on a completion committing the same
/// delivery (a transactional group deletes its rows in its transaction, and
/// is marked settling only once the commit returns) reads the delivery as
/// gone, not as a lost lease: before, every such meeting counted in
/// `courier_leases_lost_total` and logged "leases expired under running
/// handlers" although nothing was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_waits_on_a_completion_reads_the_delivery_gone() -> anyhow::Result<()> {
    use courier::OutboxStore;
    let pg = PgFixture::new().await?;
    register_sub(&pg).await?;
    pg.enqueue_committed(&events("t", "topic", 1)?).await?;
    let claimed = pg.courier().store().claim(&claim_params(1)).await?;
    let lease = claimed
        .deliveries
        .first()
        .map(|d| d.lease())
        .ok_or_else(|| anyhow::anyhow!("nothing claimed"))?;
    // The completion, holding the row's lock until it commits.
    let mut completion = pg.pool.begin().await?;
    let deleted = sqlx::query("DELETE FROM deliveries WHERE id = $1")
        .bind(lease.delivery_id)
        .execute(&mut *completion)
        .await?
        .rows_affected();
    assert_eq!(deleted, 1);
    let heartbeat = pg.named_store("heartbeat").await?;
    let extension = tokio::spawn(async move {
        heartbeat
            .extend_many(&[lease], Duration::from_secs(30))
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pg.waits_on_a_lock("heartbeat").await {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the extension never waited on the completion's lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    completion.commit().await?;
    let answer = extension.await??;
    assert!(answer.extended.is_empty(), "{answer:?}");
    assert_eq!(answer.gone, [lease.delivery_id], "{answer:?}");
    Ok(())
}

/// The dead-letter group query reads dead rows only, from the partial
/// covering index migration 15 adds, never open work:
/// with 300 live deliveries beside 30 dead ones, the generic plan (every
/// filter NULL, as `GET /v1/dead-letters/groups` sends most of them) scans
/// `deliveries_dead_fingerprint` and no other access to the deliveries
/// table than the sample's primary-key lookups. Sequential scans are
/// disabled so the tiny table's costs cannot hide a missing index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dead_letter_groups_read_only_the_dead_rows_index() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let courier = pg.courier();
    let worker = courier
        .worker("billing")
        .handle(
            "invoice.paid",
            1,
            handler_fn(|message: Message<Event>| async move {
                Err::<(), _>(HandlerError::permanent(format!("refused {}", message.id)))
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    courier
        .publish(&events("acme", "invoice.paid", 30)?)
        .await?;
    assert_eq!(worker.run_once().await?, 30);
    courier
        .publish(&events("acme", "invoice.paid", 300)?)
        .await?;

    let sql = include_str!("../../courier-postgres/queries/dead_letter_groups.sql")
        .replace("{schema}", &pg.schema);
    let mut conn = pg.pool.acquire().await?;
    // What autovacuum does to a table at rest: the visibility map lets the
    // scan skip the heap.
    sqlx::raw_sql(&format!("VACUUM ANALYZE {}.deliveries", pg.schema))
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(&format!(
        "SET enable_seqscan = off;
         SET plan_cache_mode = force_generic_plan;
         PREPARE groups (text, text, text, uuid, timestamptz, timestamptz, text, bigint) AS {sql}"
    ))
    .execute(&mut *conn)
    .await?;
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (COSTS OFF) EXECUTE groups (NULL, NULL, NULL, NULL, NULL, NULL, NULL, 50)",
    )
    .fetch_all(&mut *conn)
    .await?;
    let plan = plan.join("\n");
    sqlx::raw_sql("DEALLOCATE groups; RESET enable_seqscan; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await?;
    // Index-only once the visibility map is set; a snapshot another test
    // holds can keep VACUUM from setting it, and then the same index feeds a
    // bitmap heap scan. Either way only the dead rows' index is read.
    assert!(!plan.contains("Seq Scan"), "{plan}");
    let index_scans: Vec<&str> = plan
        .lines()
        .filter(|line| line.contains("Index") && line.contains("Scan"))
        .collect();
    assert!(
        index_scans
            .iter()
            .any(|line| line.contains("deliveries_dead_fingerprint")),
        "{plan}"
    );
    for line in &index_scans {
        assert!(
            line.contains("deliveries_dead_fingerprint")
                || line.contains("Index Scan using deliveries_pkey on deliveries s"),
            "an index other than the dead rows' read: {line}\n{plan}"
        );
    }
    Ok(())
}
