//! Claim floors (PostgreSQL): work another process puts back below a store's
//! floors is claimed within seconds under a held snapshot, without waiting
//! for a full lap.

use std::time::{Duration, Instant};

use courier::postgres::PgStore;
use courier::{DeadLetterStore, Failure, NewMessage, OutboxStore, RescueParams, SubscriptionSpec};
use courier_testkit::{pg_pool, Backend, Event, PgFixture};

fn params(worker: &str, limit: usize) -> courier::ClaimParams {
    courier::ClaimParams {
        subscription: "sub".into(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit,
        lease: Duration::from_secs(30),
        worker_id: worker.into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

/// How another process puts the victim back.
#[derive(Debug, Clone, Copy)]
enum PutBack {
    /// Its handler failed with `retry_in = 0`.
    Failed,
    /// Its lease expired and the rescuer (on the elected worker, elsewhere)
    /// returned it.
    Rescued,
    /// It was dead-lettered and an operator retried it.
    RetriedByOperator,
}

async fn put_back_below_the_floors_is_claimed_within_5_s(how: PutBack) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let setup = pg.courier().store().clone();
    setup
        .register_subscription(&SubscriptionSpec::new("sub", ["topic"]))
        .await?;
    let churn = |from: i64, n: i64| -> anyhow::Result<Vec<NewMessage>> {
        (from..from + n)
            .map(|n| Ok(NewMessage::new("acme", "topic", &Event { n })?))
            .collect()
    };
    pg.enqueue_committed(&churn(0, 1)?).await?;
    // Another process claims the victim first.
    let other = PgStore::with_schema(pg_pool(&pg.schema, 2).await?, &pg.schema)?;
    let mut short = params("other", 1);
    short.lease = Duration::from_secs(60);
    let victim = other.claim(&short).await?.deliveries;
    anyhow::ensure!(victim.len() == 1, "the other process claimed the victim");
    let victim = victim[0].clone();

    // The claimer's laps are as rare as a held snapshot makes expensive ones:
    // only its floors and the database's marks can find the victim in time.
    let claimer = PgStore::with_schema(pg_pool(&pg.schema, 4).await?, &pg.schema)?
        .with_min_lap_spacing(Duration::from_secs(600));
    let mut held = pg.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *held)
        .await?;
    sqlx::query("SELECT count(*) FROM deliveries")
        .execute(&mut *held)
        .await?;

    // Churn: the claimer's floor moves past the victim.
    let mut next = 1;
    let mut drain_some = || {
        let claimer = claimer.clone();
        let pg = &pg;
        let from = next;
        next += 20;
        async move {
            pg.enqueue_committed(&churn(from, 20)?).await?;
            let batch = claimer.claim(&params("claimer", 10)).await?.deliveries;
            let leases: Vec<courier::LeaseRef> = batch
                .iter()
                .filter(|d| d.delivery_id != victim.delivery_id)
                .map(|d| d.lease())
                .collect();
            claimer.complete_many(&leases).await?;
            anyhow::Ok(batch.iter().map(|d| d.delivery_id).collect::<Vec<_>>())
        }
    };
    for _ in 0..10 {
        drain_some().await?;
    }
    let floor = claimer
        .claim_floors("sub")
        .get("acme")
        .copied()
        .unwrap_or(0);
    anyhow::ensure!(
        floor >= victim.delivery_id,
        "the claimer's floor {floor} is past the victim {}",
        victim.delivery_id
    );

    match how {
        PutBack::Failed => {
            let failed = other
                .fail_many(&[Failure {
                    lease: victim.lease(),
                    error: "try again".into(),
                    kind: courier::ErrorKind::Retry,
                    retry_in: Some(Duration::ZERO),
                }])
                .await?;
            assert_eq!(failed.len(), 1);
        }
        PutBack::Rescued => {
            pg.expire_leases().await?;
            assert_eq!(other.rescue_expired(&RescueParams::at_once(100)).await?, 1);
        }
        PutBack::RetriedByOperator => {
            other
                .fail_many(&[Failure {
                    lease: victim.lease(),
                    error: "poison".into(),
                    kind: courier::ErrorKind::Permanent,
                    retry_in: None,
                }])
                .await?;
            assert_eq!(other.retry_dead_letters(&[victim.delivery_id]).await?, 1);
        }
    }
    let put_back = Instant::now();
    let mut found = false;
    while put_back.elapsed() < Duration::from_secs(5) {
        if drain_some().await?.contains(&victim.delivery_id) {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.rollback().await?;
    assert!(
        found,
        "{how:?}: the victim {} below the floor was not claimed within 5 s",
        victim.delivery_id
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_another_process_failed_below_the_floors_is_claimed_within_5_s(
) -> anyhow::Result<()> {
    put_back_below_the_floors_is_claimed_within_5_s(PutBack::Failed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_rescued_elsewhere_below_the_floors_is_claimed_within_5_s() -> anyhow::Result<()>
{
    put_back_below_the_floors_is_claimed_within_5_s(PutBack::Rescued).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_retried_below_the_floors_is_claimed_within_5_s() -> anyhow::Result<()> {
    put_back_below_the_floors_is_claimed_within_5_s(PutBack::RetriedByOperator).await
}
