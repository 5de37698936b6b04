//! Per-tenant in-flight limits on PostgreSQL: exact under concurrent claims,
//! and a claim of one tenant never waits for a claim of another.

use std::time::Duration;

use courier::{NewMessage, OutboxStore, SubscriptionSpec};
use courier_testkit::{eventually, Backend, Event, PgFixture};

/// Claims of subscription `sub` on `topic`, one tenant per claim, after
/// `cursor`, with at most one running delivery per tenant.
fn limited(worker: &str, cursor: &str) -> courier::ClaimParams {
    courier::ClaimParams {
        subscription: "sub".into(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 10,
        }],
        limit: 1,
        lease: Duration::from_secs(30),
        worker_id: worker.into(),
        tenant_cursor: cursor.into(),
        tenant_in_flight_limit: Some(1),
    }
}

/// Claim A of tenant `z` is held open at its commit. A claim of tenant `b`
/// goes ahead meanwhile (no subscription-wide lock); a claim of `b` and `z`
/// waits for A and then counts A's delivery, so `z` never exceeds its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_under_an_in_flight_limit_waits_only_for_claims_of_its_own_tenants(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["topic"]))
        .await?;
    let two = |tenant: &str| -> anyhow::Result<Vec<NewMessage>> {
        (0..2)
            .map(|n| Ok(NewMessage::new(tenant, "topic", &Event { n })?))
            .collect()
    };
    pg.enqueue_committed(&two("z")?).await?;
    let first_of_z: i64 = pg
        .scalar("SELECT min(id) FROM deliveries WHERE tenant = 'z'")
        .await?;

    // A gate holds claim A's commit open once its claim has run: a deferred
    // trigger waits for an advisory lock this test holds.
    let gate_key: i64 = i64::from(std::process::id()) << 20 | (first_of_z & 0xFFFFF);
    pg.execute(&format!(
        "CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock({gate_key}); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER gate AFTER UPDATE ON deliveries
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
           WHEN (NEW.id = {first_of_z} AND NEW.lease_token IS NOT NULL) EXECUTE FUNCTION gate();"
    ))
    .await?;
    let mut gate = pg.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(gate_key)
        .execute(&mut *gate)
        .await?;

    let a_store = pg.named_store("a").await?;
    let claim_a = tokio::spawn(async move { a_store.claim(&limited("a", "")).await });
    anyhow::ensure!(
        eventually(Duration::from_secs(10), || pg.waits_on_a_lock("a")).await,
        "claim A never reached its commit"
    );
    // Tenant b sorts first, so a claim of one tenant serves b.
    pg.enqueue_committed(&two("b")?).await?;

    // Tenant b's claim does not wait for tenant z's.
    let b_store = pg.named_store("b").await?;
    let claim_b = tokio::spawn(async move { b_store.claim(&limited("b", "")).await });
    let b_went_ahead = eventually(Duration::from_secs(5), || async { claim_b.is_finished() }).await;

    // A claim of b and z waits for claim A.
    let c_store = pg.named_store("c").await?;
    let claim_c = tokio::spawn(async move {
        let mut both = limited("c", "");
        both.limit = 2;
        c_store.claim(&both).await
    });
    let c_waited = eventually(Duration::from_secs(5), || pg.waits_on_a_lock("c")).await;

    gate.commit().await?;
    let a = claim_a.await??.deliveries;
    let b = claim_b.await??.deliveries;
    let c = claim_c.await??.deliveries;
    assert!(
        b_went_ahead,
        "a claim of tenant b waited for a claim of tenant z"
    );
    assert!(
        c_waited,
        "a second claim of tenant z did not wait for the first"
    );
    assert_eq!(
        a.iter().map(|d| d.delivery_id).collect::<Vec<_>>(),
        vec![first_of_z]
    );
    assert_eq!(
        b.iter().map(|d| d.tenant.as_str()).collect::<Vec<_>>(),
        vec!["b"]
    );
    assert!(
        c.is_empty(),
        "b and z are each at their limit of 1 while claims A and B run, got {c:?}"
    );
    let most: i64 = pg
        .scalar(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM deliveries
             WHERE state = 'running' GROUP BY tenant) r",
        )
        .await?;
    assert_eq!(most, 1, "no tenant exceeds its limit");
    Ok(())
}

/// Many claimers with pools of their own, 20 tenants with a limit of 2:
/// no tenant ever has more than 2 running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_never_exceed_a_tenant_s_in_flight_limit() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["topic"]))
        .await?;
    let mut messages = Vec::new();
    for tenant in 0..20 {
        for n in 0..10 {
            messages.push(NewMessage::new(
                format!("t{tenant:02}"),
                "topic",
                &Event { n },
            )?);
        }
    }
    pg.enqueue_committed(&messages).await?;
    let mut claimers = Vec::new();
    for worker in 0..4 {
        let store = pg.named_store(&format!("w{worker}")).await?;
        claimers.push(tokio::spawn(async move {
            let mut cursor = String::new();
            let mut claimed = 0;
            for _ in 0..30 {
                let mut params = limited(&format!("w{worker}"), &cursor);
                params.limit = 8;
                params.tenant_in_flight_limit = Some(2);
                let batch = store.claim(&params).await?;
                cursor = batch.next_tenant_cursor;
                claimed += batch.deliveries.len();
            }
            anyhow::Ok(claimed)
        }));
    }
    let mut claimed = 0;
    for claimer in claimers {
        claimed += claimer.await??;
    }
    let most: i64 = pg
        .scalar(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM deliveries
             WHERE state = 'running' GROUP BY tenant) r",
        )
        .await?;
    assert_eq!(claimed, 40, "every tenant reached its limit of 2");
    assert_eq!(most, 2, "no tenant has more than its limit running");
    Ok(())
}
