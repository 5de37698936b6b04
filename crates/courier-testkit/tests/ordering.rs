//! Ordering keys under real concurrency: a key's messages never run side by
//! side, whatever claims, operators' retries and lost leases interleave.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::postgres::PgStore;
use courier::{DeadLetterStore, NewMessage, OutboxStore};
use courier_testkit::{eventually, pg_pool, Backend, Event, PgFixture};

/// The claim parameters of subscription `sub` handling `topic` v1.
fn claim_params(worker: &str) -> courier::ClaimParams {
    courier::ClaimParams {
        subscription: "sub".into(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit: 10,
        lease: Duration::from_secs(30),
        worker_id: worker.into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

async fn register(store: &PgStore) -> anyhow::Result<()> {
    store
        .register_subscription(&courier::SubscriptionSpec {
            name: "sub".into(),
            topics: vec!["topic".into()],
            replay: None,
        })
        .await?;
    Ok(())
}

/// d1 (dead) and d2 share a key. Claim A takes d2 and has not committed; an
/// operator retries d1; claim B, whose snapshot still shows d2 available,
/// must not take d1 beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_retried_while_a_later_claim_commits_never_runs_beside_it() -> anyhow::Result<()>
{
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    register(&store).await?;
    let keyed: Vec<NewMessage> = (0..2)
        .map(|n| Ok(NewMessage::new("acme", "topic", &Event { n })?.with_ordering_key("k")))
        .collect::<anyhow::Result<_>>()?;
    pg.enqueue_committed(&keyed).await?;
    let head = store.claim(&claim_params("setup")).await?.deliveries;
    anyhow::ensure!(head.len() == 1, "only the head is claimable at first");
    let d1 = head[0].delivery_id;
    let dead = courier::Failure {
        lease: head[0].lease(),
        error: "rejected".into(),
        kind: courier::ErrorKind::Permanent,
        retry_in: None,
    };
    store.fail_many(&[dead]).await?;
    let d2: i64 = pg
        .scalar(&format!("SELECT id FROM deliveries WHERE id <> {d1}"))
        .await?;

    // A gate holds claim A's commit open once its claim of d2 has run: a
    // deferred trigger waits for an advisory lock this test holds.
    let gate_key: i64 = i64::from(std::process::id()) << 20 | (d2 & 0xFFFFF);
    pg.execute(&format!(
        "CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock({gate_key}); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER gate AFTER UPDATE ON deliveries
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
           WHEN (NEW.id = {d2} AND NEW.lease_token IS NOT NULL) EXECUTE FUNCTION gate();"
    ))
    .await?;
    let mut gate = pg.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(gate_key)
        .execute(&mut *gate)
        .await?;

    let a_store = pg.named_store("a").await?;
    let claim_a = tokio::spawn(async move { a_store.claim(&claim_params("a")).await });
    anyhow::ensure!(
        eventually(Duration::from_secs(10), || pg.waits_on_a_lock("a")).await,
        "claim A never reached its commit"
    );
    assert_eq!(store.retry_dead_letters(&[d1]).await?, 1);

    let b_store = pg.named_store("b").await?;
    let claim_b = tokio::spawn(async move { b_store.claim(&claim_params("b")).await });
    // B either finishes or waits for A; either way A may now commit.
    eventually(Duration::from_secs(5), || async {
        claim_b.is_finished() || pg.waits_on_a_lock("b").await
    })
    .await;
    gate.commit().await?;
    let a = claim_a.await??.deliveries;
    let b = claim_b.await??.deliveries;
    let a_ids: Vec<i64> = a.iter().map(|d| d.delivery_id).collect();
    let b_ids: Vec<i64> = b.iter().map(|d| d.delivery_id).collect();
    assert_eq!(
        a_ids,
        vec![d2],
        "claim A took the message after the dead head"
    );
    assert!(
        b_ids.is_empty(),
        "claim B took {b_ids:?} while d2 ({d2}) of the same key was running"
    );
    let running = pg
        .scalar("SELECT count(*) FROM deliveries WHERE state = 'running'")
        .await?;
    assert_eq!(running, 1, "one delivery of the key runs at a time");
    Ok(())
}

/// One handler run of a key: when it started and ended.
type Intervals = Arc<Mutex<HashMap<String, Vec<(Instant, Instant)>>>>;

/// Four workers with their own pools over one subscription of 1,000 keys;
/// handlers dead-letter one message in twenty and an operator keeps retrying
/// the dead heads. No two handler runs of one key overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_claimers_and_an_operator_retrying_dead_heads_never_overlap_a_key(
) -> anyhow::Result<()> {
    const KEYS: i64 = 1_000;
    const PER_KEY: i64 = 3;
    let pg = PgFixture::new().await?;
    let intervals: Intervals = Arc::default();
    let mut workers = Vec::new();
    for w in 0..4 {
        let store = PgStore::with_schema(pg_pool(&pg.schema, 6).await?, &pg.schema)?;
        let courier = courier::Courier::from_postgres_store(store);
        let intervals = Arc::clone(&intervals);
        let worker = courier
            .worker("sub")
            .handle(
                "topic",
                1,
                courier::handler_fn(move |message: courier::Message<Event>| {
                    let intervals = Arc::clone(&intervals);
                    async move {
                        let started = Instant::now();
                        let key = message.ordering_key.clone().unwrap_or_default();
                        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..1_500))).await;
                        let ended = Instant::now();
                        if let Ok(mut map) = intervals.lock() {
                            map.entry(key).or_default().push((started, ended));
                        }
                        if fastrand::u32(0..20) == 0 {
                            return Err(courier::HandlerError::permanent("rejected"));
                        }
                        Ok(())
                    }
                }),
            )
            .concurrency(32)
            .batch_size(16)
            .worker_id(format!("w{w}"))
            .poll_interval(Duration::from_millis(20))
            .maintenance(None)
            .build()
            .await?
            .start();
        workers.push(worker);
    }
    let messages: Vec<NewMessage> = (0..PER_KEY)
        .flat_map(|round| (0..KEYS).map(move |k| (round, k)))
        .map(|(round, k)| {
            Ok(NewMessage::new(
                "acme",
                "topic",
                &Event {
                    n: round * KEYS + k,
                },
            )?
            .with_ordering_key(format!("key-{k}")))
        })
        .collect::<anyhow::Result<_>>()?;
    pg.enqueue_committed(&messages).await?;

    // The operator: retries every dead letter again and again until the outbox is drained.
    let store = pg.courier().store().clone();
    let drained = eventually(Duration::from_secs(120), || async {
        let _ = store
            .retry_dead_letters_matching(&courier::DeadLetterFilter::default())
            .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        pg.scalar("SELECT count(*) FROM deliveries")
            .await
            .is_ok_and(|open| open == 0)
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    assert!(drained, "the outbox drained");
    let map = intervals.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    assert_eq!(map.len(), usize::try_from(KEYS)?);
    for (key, runs) in map.iter() {
        let mut runs = runs.clone();
        runs.sort_by_key(|(start, _)| *start);
        for pair in runs.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "two runs of {key} overlapped: {:?} began before {:?} ended",
                pair[1].0,
                pair[0].1
            );
        }
    }
    Ok(())
}

/// A key row whose delivery is no longer running (left by a worker of a
/// version before ordering_locks, which settles without deleting it) would
/// block its key for ever; the rescuer's pass removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_key_row_is_swept_by_the_rescuer() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    register(&store).await?;
    pg.enqueue_committed(&[
        NewMessage::new("acme", "topic", &Event { n: 1 })?.with_ordering_key("k")
    ])
    .await?;
    pg.execute(
        "INSERT INTO ordering_locks (subscription, tenant, ordering_key, delivery_id)
         VALUES ('sub', 'acme', 'k', -1)",
    )
    .await?;
    assert!(
        store.claim(&claim_params("w")).await?.deliveries.is_empty(),
        "the orphaned row holds the key"
    );
    store
        .rescue_expired(&courier::RescueParams::at_once(100))
        .await?;
    assert_eq!(store.claim(&claim_params("w")).await?.deliveries.len(), 1);
    assert_eq!(pg.scalar("SELECT count(*) FROM ordering_locks").await?, 1);
    Ok(())
}
