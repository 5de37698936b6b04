//! Cases: transactional work — its writes commit with the receipt and the
//! completion or not at all, fenced by the lease as the store declares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier::{HandlerError, OutboxStore, RescueParams, TransactionalOutcome};
use futures_util::FutureExt;

use super::helpers::*;
use super::{StoreFixture, SuiteConnection};
use crate::EffectConnection;

/// Transactional work commits with its receipt and the completion.
pub async fn transactional_work_commits_with_its_receipt_and_completion<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    create_effects_table(&fixture).await?;
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;

    let outcome = store
        .run_transactional(&claimed[0], record_effect(&claimed[0]))
        .await?;
    assert!(
        matches!(outcome, TransactionalOutcome::Applied),
        "{outcome:?}"
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM effects").await?, 1);
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 1);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

/// A receipt already written means the effect was applied: the work is
/// skipped and the delivery completed.
pub async fn transactional_work_is_skipped_when_a_receipt_exists<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;
    fixture
        .execute(&format!(
            "INSERT INTO receipts (tenant, subscription, message_id) VALUES ('acme', 'all', {})",
            literal(&m.id.to_string())
        ))
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
    let outcome = store.run_transactional(&claimed[0], work).await?;
    assert!(
        matches!(outcome, TransactionalOutcome::AlreadyApplied),
        "{outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

/// Transactional work started on an expired lease is rolled back, its
/// receipt too, and the delivery is left for the rescuer.
pub async fn transactional_work_after_lease_expiry_is_rolled_back<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    create_effects_table(&fixture).await?;
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;
    fixture.expire_leases("all").await?;

    let outcome = store
        .run_transactional(&claimed[0], record_effect(&claimed[0]))
        .await?;
    assert!(
        matches!(outcome, TransactionalOutcome::LeaseLost),
        "{outcome:?}"
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM effects").await?, 0);
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 0);
    assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 1);
    Ok(())
}

/// Failing transactional work rolls back its writes and its receipt; its
/// lease is still held, so the failure can be recorded.
pub async fn failing_transactional_work_rolls_back_its_writes<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    create_effects_table(&fixture).await?;
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;

    let (subscription, message_id) = (claimed[0].subscription.clone(), claimed[0].message_id);
    let work = tx_work(move |conn: &mut <F::Store as OutboxStore>::Connection| {
        async move {
            conn.record_effect(&subscription, message_id.to_string())
                .await?;
            Err(HandlerError::retry("downstream said no"))
        }
        .boxed()
    });
    let outcome = store.run_transactional(&claimed[0], work).await?;
    match outcome {
        TransactionalOutcome::HandlerFailed(error) => {
            assert_eq!(error.to_string(), "downstream said no");
        }
        other => panic!("expected HandlerFailed, got {other:?}"),
    }
    assert_eq!(fixture.scalar("SELECT count(*) FROM effects").await?, 0);
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 0);
    let applied = store
        .fail_many(&[failure(
            &claimed[0],
            "downstream said no",
            Some(Duration::ZERO),
        )])
        .await?;
    assert_eq!(applied.len(), 1);
    Ok(())
}

/// A lease that expires while its transactional work runs. A store whose
/// transactions exclude every other writer ([`OutboxStore::EXCLUSIVE_TRANSACTIONS`],
/// SQLite) checked the lease when it took the write lock and nobody could
/// take the delivery over since: the work commits. Any other store
/// (PostgreSQL) lets the rescuer and another worker take it over meanwhile,
/// so the zombie's work is refused at commit and rolled back, and the new
/// claim's effect is the only one.
pub async fn a_lease_expiring_during_transactional_work_is_fenced_as_the_store_declares<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    type Conn<F> = <<F as StoreFixture>::Store as OutboxStore>::Connection;
    let store = fixture.store();
    create_effects_table(&fixture).await?;
    subscribe(store, "ledger", &["order.placed"]).await?;
    store
        .publish_batch(&[message("acme", "order.placed")?])
        .await?;
    let claim_params = params("ledger", vec![route("order.placed", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    anyhow::ensure!(claimed.len() == 1, "claimed {claimed:?}");
    let (subscription, message_id) = (claimed[0].subscription.clone(), claimed[0].message_id);

    if <F::Store as OutboxStore>::EXCLUSIVE_TRANSACTIONS {
        // Only the work itself can write while it runs: it moves its own
        // lease past expiry, as a slow handler would find it at commit.
        let expire = fixture.expire_leases_sql("ledger");
        let work = tx_work(move |conn: &mut Conn<F>| {
            async move {
                conn.run_sql(&expire).await?;
                conn.record_effect(&subscription, message_id.to_string())
                    .await?;
                Ok(())
            }
            .boxed()
        });
        let outcome = store.run_transactional(&claimed[0], work).await?;
        assert!(
            matches!(outcome, TransactionalOutcome::Applied),
            "{outcome:?}"
        );
        assert_eq!(fixture.scalar("SELECT count(*) FROM effects").await?, 1);
        assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 1);
        assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 0);
        assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
        return Ok(());
    }

    // The zombie: its work starts, then waits while it is partitioned.
    let (started, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (resume, resume_rx) = tokio::sync::oneshot::channel::<()>();
    let work = tx_work(move |conn: &mut Conn<F>| {
        async move {
            let _ = started.send(());
            let _ = resume_rx.await;
            conn.record_effect(&subscription, message_id.to_string())
                .await?;
            Ok(())
        }
        .boxed()
    });
    let zombie = tokio::spawn({
        let (store, delivery) = (store.clone(), claimed[0].clone());
        async move { store.run_transactional(&delivery, work).await }
    });
    started_rx.await?;
    assert_eq!(fixture.expire_leases("ledger").await?, 1);
    assert_eq!(
        store.rescue_expired(&RescueParams::at_once(10)).await?,
        1,
        "the expired lease must be rescued"
    );
    let again = claim(store, &claim_params).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 2);
    let healthy = tokio::spawn({
        let (store, delivery) = (store.clone(), again[0].clone());
        async move {
            let work = record_effect(&delivery);
            store.run_transactional(&delivery, work).await
        }
    });
    let _ = resume.send(());
    let zombie = zombie.await??;
    assert!(
        matches!(zombie, TransactionalOutcome::LeaseLost),
        "the zombie's work must be refused: {zombie:?}"
    );
    let healthy = healthy.await??;
    assert!(
        matches!(healthy, TransactionalOutcome::Applied),
        "{healthy:?}"
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM effects").await?, 1);
    assert_eq!(
        fixture
            .scalar("SELECT CAST(max(calls) AS BIGINT) FROM effects")
            .await?,
        1,
        "the zombie's write must have rolled back"
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 1);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}
