//! Cases: the rescuer — expired leases back to the queue after a backoff or
//! to the dead letters, with the error history bounded on every path.

use std::time::Duration;

use courier::{DeadLetterStore, OutboxStore, RescueParams};

use super::helpers::*;
use super::StoreFixture;

/// The rescuer leaves live leases alone, returns an expired one to the queue
/// with a note naming the worker, and dead-letters it when the expired
/// attempt was the last.
pub async fn rescue_returns_expired_leases_and_dead_letters_at_the_last_attempt<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let claim_params = params("all", vec![route("t", 1, 2)], 10);

    let first = claim(store, &claim_params).await?;
    assert_eq!(store.rescue_expired(&at_once()).await?, 0);
    fixture.expire_leases("all").await?;
    assert_eq!(store.rescue_expired(&at_once()).await?, 1);
    let states = store.message_deliveries(m.id).await?;
    assert_eq!(states[0].state, "available");
    assert_eq!(states[0].errors[0].message, "lease expired (worker w1)");

    let second = claim(store, &claim_params).await?;
    assert_eq!(ids(&second), ids(&first));
    assert_eq!(second[0].attempt, 2);
    fixture.expire_leases("all").await?;
    assert_eq!(store.rescue_expired(&at_once()).await?, 1);
    let dead = store
        .get_dead_letter(first[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("not dead-lettered"))?;
    assert_eq!(dead.attempts, 2);
    assert_eq!(dead.errors.len(), 2);
    assert!(claim(store, &claim_params).await?.is_empty());
    Ok(())
}

/// Rescued deliveries wait a backoff before their next attempt.
pub async fn rescued_deliveries_wait_a_backoff<F: StoreFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "sub", &["topic"]).await?;
    store.publish_batch(&[message("acme", "topic")?]).await?;
    let claim_params = params("sub", vec![route("topic", 1, 10)], 10);
    claim(store, &claim_params).await?;
    fixture.expire_leases("sub").await?;
    let rescue = RescueParams {
        limit: 10,
        backoff_base: Duration::from_secs(60),
        backoff_cap: Duration::from_secs(300),
    };
    assert_eq!(store.rescue_expired(&rescue).await?, 1);
    assert!(
        claim(store, &claim_params).await?.is_empty(),
        "a rescued delivery is not offered again at once"
    );
    // Jittered to between half and all of the first delay.
    fixture.pass_time(Duration::from_secs(61)).await?;
    assert_eq!(claim(store, &claim_params).await?.len(), 1);
    Ok(())
}

/// The error history keeps the newest 20 entries, whether the attempts
/// failed or expired and were rescued, back to the queue or to the dead.
pub async fn the_error_history_keeps_the_newest_twenty_on_every_path<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "sub", &["topic"]).await?;
    let message_id = store.publish_batch(&[message("acme", "topic")?]).await?[0].id;
    let history = || async {
        let deliveries = store.message_deliveries(message_id).await?;
        anyhow::Ok(deliveries.first().map_or(0, |d| d.errors.len()))
    };
    let budget = 100;
    for attempt in 1..=25 {
        let claimed = claim(store, &params("sub", vec![route("topic", 1, budget)], 10)).await?;
        anyhow::ensure!(claimed.len() == 1, "attempt {attempt} was claimed");
        if attempt % 2 == 0 {
            let failure = failure(
                &claimed[0],
                &format!("failed {attempt}"),
                Some(Duration::ZERO),
            );
            assert_eq!(store.fail_many(&[failure]).await?.len(), 1);
        } else {
            fixture.expire_leases("sub").await?;
            assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 1);
        }
    }
    assert_eq!(history().await?, 20);
    // The last attempt expires and is rescued to the dead letters.
    let claimed = claim(store, &params("sub", vec![route("topic", 1, 26)], 10)).await?;
    anyhow::ensure!(claimed.len() == 1, "the last attempt was claimed");
    fixture.expire_leases("sub").await?;
    assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 1);
    let letter = store
        .get_dead_letter(claimed[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the last attempt dead-lettered"))?;
    assert_eq!(letter.errors.len(), 20);
    assert_eq!(letter.errors.first().map(|e| e.attempt), Some(7));
    assert_eq!(letter.errors.last().map(|e| e.attempt), Some(26));
    Ok(())
}
