//! Cases: claimers in separate stores racing over one database, and claims
//! beside a snapshot held open elsewhere.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use courier::{ClaimedDelivery, OutboxStore, StoreError};

use super::helpers::*;
use super::StoreFixture;

/// Claimers in separate stores (separate pools, as separate processes would
/// have), claiming at once on several tasks, are never handed the same
/// delivery while its lease is live; every lease then completes.
pub async fn concurrent_claimers_never_share_a_delivery<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    subscribe(fixture.store(), "all", &["*"]).await?;
    let mut batch = Vec::new();
    for index in 0..300 {
        batch.push(message(&format!("tenant-{}", index % 7), "t")?);
    }
    fixture.store().publish_batch(&batch).await?;

    let total = 300;
    let claimed_so_far = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut claimers = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let store = fixture.open_store(2).await?;
        let (start, claimed_so_far) = (Arc::clone(&start), Arc::clone(&claimed_so_far));
        claimers.spawn(async move {
            let mut claim_params = params("all", vec![route("t", 1, 10)], 7);
            claim_params.worker_id = format!("w{worker}");
            // Leases far longer than the test: every claim below is live
            // until the completions at the end.
            claim_params.lease = Duration::from_secs(600);
            let mut held = Vec::new();
            start.wait().await;
            // Claim until the claimers together hold as many leases as there
            // are deliveries: a delivery handed out twice leaves another
            // unclaimed, which the distinct count below finds.
            while claimed_so_far.load(Ordering::SeqCst) < total
                && tokio::time::Instant::now() < deadline
            {
                let batch = store.claim(&claim_params).await?;
                claim_params.tenant_cursor = batch.next_tenant_cursor;
                if batch.deliveries.is_empty() {
                    // Rows another claimer has locked this instant.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                claimed_so_far.fetch_add(batch.deliveries.len(), Ordering::SeqCst);
                held.extend(batch.deliveries.iter().map(ClaimedDelivery::lease));
            }
            Ok::<_, StoreError>((store, held))
        });
    }
    let mut all = Vec::new();
    let mut holders = Vec::new();
    while let Some(joined) = claimers.join_next().await {
        let (store, held) = joined??;
        all.extend(held.iter().map(|lease| lease.delivery_id));
        holders.push((store, held));
    }
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "a delivery was handed out twice");
    assert_eq!(distinct.len(), total, "every delivery was claimed");
    for (store, held) in &holders {
        let completed = store.complete_many(held).await?;
        assert_eq!(completed.len(), held.len(), "a claim lost its lease");
    }
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

/// A snapshot held open elsewhere (a long report, a stuck transaction)
/// keeps old row versions alive; claims still find and settle new work
/// beside the deliveries done since it began.
pub async fn claims_find_new_work_while_an_old_snapshot_is_held<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let snapshot = fixture.hold_snapshot().await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 100);
    for round in 0..3 {
        let mut batch = Vec::new();
        for index in 0..300 {
            batch.push(message(&format!("tenant-{}", index % 3), "t")?);
        }
        store.publish_batch(&batch).await?;
        let mut done = 0;
        while done < 300 {
            let claimed = claim(store, &claim_params).await?;
            anyhow::ensure!(
                !claimed.is_empty(),
                "round {round}: claims stopped finding work after {done} of 300"
            );
            let leases: Vec<_> = claimed.iter().map(ClaimedDelivery::lease).collect();
            done += store.complete_many(&leases).await?.len();
        }
    }
    let late = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&late)).await?;
    let claimed = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&claimed), [late.id]);
    assert_eq!(store.complete_many(&[claimed[0].lease()]).await?.len(), 1);
    snapshot.close().await?;
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}
