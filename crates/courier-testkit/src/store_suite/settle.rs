//! Cases: settling a claim — completion, failure, extension, release and
//! snoozes, each fenced by the lease token and the lease's expiry on the
//! database clock; attempts, retry delays and the error history.

use std::time::Duration;

use chrono::Utc;
use courier::{
    DeadLetterStore, Extended, Failure, FailureApplied, OutboxStore, RescueParams, Snooze,
    MAX_ERROR_CHARS,
};
use uuid::Uuid;

use super::helpers::*;
use super::StoreFixture;

/// Every write about a claim presenting another token is refused; the right
/// token completes once, writing no receipt (the message reads completed).
pub async fn completion_with_a_wrong_token_is_refused<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;
    let mut forged = claimed[0].lease();
    forged.lease_token = Uuid::new_v4();
    assert!(store.complete_many(&[forged]).await?.is_empty());
    assert!(store
        .fail_many(&[Failure {
            lease: forged,
            error: "x".into(),
            kind: courier::ErrorKind::Retry,
            retry_in: None
        }])
        .await?
        .is_empty());
    assert!(store
        .snooze_many(&[Snooze {
            lease: forged,
            delay: Duration::ZERO,
            reason: "x".into()
        }])
        .await?
        .is_empty());
    assert_eq!(
        store
            .extend_many(&[forged], Duration::from_secs(60))
            .await?,
        Extended::default(),
        "a forged lease is not extended, and its delivery is not gone"
    );
    assert!(store.release_many(&[forged]).await?.is_empty());

    assert_eq!(
        store.complete_many(&[claimed[0].lease()]).await?,
        [claimed[0].delivery_id]
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);
    // A plain completion writes no receipt; the message still reads completed.
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 0);
    let states = store.message_deliveries(m.id).await?;
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].state, "completed");
    // A second completion of the same claim finds nothing to do.
    assert!(store.complete_many(&[claimed[0].lease()]).await?.is_empty());
    Ok(())
}

/// Once its lease expired, a claim's completion, failure and extension are
/// refused; rescued and claimed again, the new claim completes and the old
/// one still cannot.
pub async fn zombie_completion_is_refused_after_lease_expiry<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    assert_eq!(claimed.len(), 1);
    assert_eq!(fixture.expire_leases("all").await?, 1);

    let lease = claimed[0].lease();
    assert!(store.complete_many(&[lease]).await?.is_empty());
    assert!(store
        .fail_many(&[failure(&claimed[0], "late", Some(Duration::ZERO))])
        .await?
        .is_empty());
    assert_eq!(
        store.extend_many(&[lease], Duration::from_secs(60)).await?,
        Extended::default(),
        "an expired lease is lost, not gone"
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM receipts").await?, 0);

    assert_eq!(store.rescue_expired(&at_once()).await?, 1);
    let again = claim(store, &claim_params).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 2);
    assert!(store.complete_many(&[lease]).await?.is_empty());
    assert_eq!(store.complete_many(&[again[0].lease()]).await?.len(), 1);
    Ok(())
}

/// A zombie still holds the right token but its lease expired on the
/// database clock (no rescue has run): complete, fail, snooze, extend and
/// release are all refused, and the claim is left for the rescuer.
pub async fn a_zombie_with_the_right_token_is_refused_by_the_clock<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "sub", &["topic"]).await?;
    store.publish_batch(&[message("acme", "topic")?]).await?;
    let claimed = claim(store, &params("sub", vec![route("topic", 1, 10)], 10)).await?;
    let lease = claimed[0].lease();
    fixture.expire_leases("sub").await?;
    assert!(store.complete_many(&[lease]).await?.is_empty(), "complete");
    let failure = Failure {
        lease,
        error: "late".into(),
        kind: courier::ErrorKind::Retry,
        retry_in: Some(Duration::ZERO),
    };
    assert!(store.fail_many(&[failure]).await?.is_empty(), "fail");
    let snooze = Snooze {
        lease,
        delay: Duration::ZERO,
        reason: "late".into(),
    };
    assert!(store.snooze_many(&[snooze]).await?.is_empty(), "snooze");
    assert!(
        store.extend_many(&[lease], Duration::from_secs(30)).await? == Extended::default(),
        "extend"
    );
    assert!(store.release_many(&[lease]).await?.is_empty(), "release");
    // Still the zombie's claim, untouched, for the rescuer.
    assert_eq!(
        fixture
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'running' AND attempts = 1")
            .await?,
        1
    );
    assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 1);
    Ok(())
}

/// A failed attempt is recorded in the history and offered again only once
/// its retry delay has gone by, as the next attempt.
pub async fn a_failed_attempt_waits_for_its_retry_delay<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    let retry_in = Duration::from_secs(600);
    let applied = store
        .fail_many(&[failure(&claimed[0], "try later", Some(retry_in))])
        .await?;
    assert_eq!(
        applied,
        [FailureApplied {
            delivery_id: claimed[0].delivery_id,
            dead: false
        }]
    );
    assert!(claim(store, &claim_params).await?.is_empty());
    let states = store.message_deliveries(m.id).await?;
    assert_eq!(states[0].state, "available");
    assert_eq!(states[0].errors.len(), 1);
    assert_eq!(states[0].errors[0].attempt, 1);
    assert_eq!(states[0].errors[0].message, "try later");
    assert!((Utc::now() - states[0].errors[0].at).num_seconds().abs() < 5);

    fixture.pass_time(retry_in - Duration::from_secs(5)).await?;
    assert!(
        claim(store, &claim_params).await?.is_empty(),
        "offered before its retry delay"
    );
    fixture.pass_time(Duration::from_secs(6)).await?;
    let again = claim(store, &claim_params).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 2);
    Ok(())
}

/// The last allowed failed attempt dead-letters the delivery with every
/// attempt's error, in order.
pub async fn exhausted_attempts_dead_letter_with_every_error_kept<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let mut delivery_id = 0;
    for attempt in 1..=10 {
        let claimed = claim(store, &claim_params).await?;
        assert_eq!(claimed.len(), 1, "attempt {attempt}");
        assert_eq!(claimed[0].attempt, attempt);
        delivery_id = claimed[0].delivery_id;
        let applied = store
            .fail_many(&[failure(
                &claimed[0],
                &format!("boom {attempt}"),
                Some(Duration::ZERO),
            )])
            .await?;
        assert_eq!(applied[0].dead, attempt == 10);
    }
    assert!(claim(store, &claim_params).await?.is_empty());
    let dead = store
        .get_dead_letter(delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no dead letter"))?;
    assert_eq!(dead.attempts, 10);
    assert!(dead.dead_at.is_some());
    let history: Vec<(i32, String)> = dead
        .errors
        .iter()
        .map(|e| (e.attempt, e.message.clone()))
        .collect();
    let expected: Vec<(i32, String)> = (1..=10).map(|a| (a, format!("boom {a}"))).collect();
    assert_eq!(history, expected);
    Ok(())
}

/// Failed attempts keep the newest twenty errors.
pub async fn the_error_history_keeps_the_newest_twenty<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claim_params = params("all", vec![route("t", 1, 25)], 10);
    let mut delivery_id = 0;
    for attempt in 1..=25 {
        let claimed = claim(store, &claim_params).await?;
        anyhow::ensure!(claimed.len() == 1, "attempt {attempt} was claimed");
        delivery_id = claimed[0].delivery_id;
        store
            .fail_many(&[failure(
                &claimed[0],
                &format!("e{attempt}"),
                Some(Duration::ZERO),
            )])
            .await?;
    }
    let dead = store
        .get_dead_letter(delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no dead letter"))?;
    let attempts: Vec<i32> = dead.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (6..=25).collect::<Vec<_>>());
    Ok(())
}

/// An error longer than [`MAX_ERROR_CHARS`] is cut to that many characters,
/// on a character boundary.
pub async fn a_long_multibyte_error_is_cut_to_2000_characters<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;
    let long = "é".repeat(3000);
    let applied = store
        .fail_many(&[failure(&claimed[0], &long, None)])
        .await?;
    assert!(applied[0].dead);
    let dead = store
        .get_dead_letter(claimed[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no dead letter"))?;
    let stored = &dead.errors[0].message;
    assert_eq!(stored.chars().count(), MAX_ERROR_CHARS);
    assert!(stored.chars().all(|c| c == 'é'));
    Ok(())
}

/// An extended lease outlives its original expiry; one not extended beside
/// it does not.
pub async fn extend_keeps_a_lease_alive_past_its_original_expiry<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store
        .publish_batch(&[message("acme", "t")?, message("acme", "t")?])
        .await?;
    let mut short = params("all", vec![route("t", 1, 10)], 2);
    short.lease = Duration::from_secs(10);
    let claimed = claim(store, &short).await?;
    assert_eq!(claimed.len(), 2);
    let (kept, left) = (&claimed[0], &claimed[1]);
    let extended = store
        .extend_many(&[kept.lease()], Duration::from_secs(300))
        .await?;
    assert_eq!(extended.extended, [kept.delivery_id]);
    assert!(extended.gone.is_empty());
    // Past the original ten seconds, well inside the extension.
    fixture.pass_time(Duration::from_secs(60)).await?;
    assert_eq!(
        store.rescue_expired(&at_once()).await?,
        1,
        "only the lease that was not extended expired"
    );
    assert!(store.complete_many(&[left.lease()]).await?.is_empty());
    assert_eq!(
        store.complete_many(&[kept.lease()]).await?,
        [kept.delivery_id]
    );
    Ok(())
}

/// A heartbeat tells a delivery that no longer exists (completed: nobody
/// else can run it) from one whose lease was lost (rescued and claimed
/// again: somebody else may be running it), and extends the one still held.
pub async fn extend_tells_a_completed_delivery_from_a_lost_lease<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store
        .publish_batch(&[
            message("acme", "t")?,
            message("acme", "t")?,
            message("acme", "t")?,
        ])
        .await?;
    let three = params("all", vec![route("t", 1, 10)], 3);
    let claimed = claim(store, &three).await?;
    assert_eq!(claimed.len(), 3);
    let (held, completed, taken) = (&claimed[0], &claimed[1], &claimed[2]);
    assert_eq!(
        store.complete_many(&[completed.lease()]).await?,
        [completed.delivery_id]
    );
    // The third lease expires and the delivery is claimed again elsewhere.
    fixture.expire_leases("all").await?;
    assert!(store.rescue_expired(&at_once()).await? >= 1);
    let again = claim(store, &three).await?;
    assert!(
        again.iter().any(|d| d.delivery_id == taken.delivery_id),
        "the expired delivery is claimed again"
    );
    // The first was rescued and claimed again too: its old lease is lost as
    // well, so extend the claims the second round holds instead.
    let held_again = again
        .iter()
        .find(|d| d.delivery_id == held.delivery_id)
        .map(|d| d.lease())
        .ok_or_else(|| anyhow::anyhow!("the first delivery was not claimed again"))?;
    let answer = store
        .extend_many(
            &[held_again, completed.lease(), taken.lease()],
            Duration::from_secs(60),
        )
        .await?;
    assert_eq!(
        answer.extended,
        [held.delivery_id],
        "the held lease is extended"
    );
    assert_eq!(
        answer.gone,
        [completed.delivery_id],
        "the completed delivery is gone"
    );
    Ok(())
}

/// A released claim is offered again at once with its attempt given back,
/// and its old lease can no longer complete it.
pub async fn release_gives_back_the_attempt<F: StoreFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    assert_eq!(claimed[0].attempt, 1);
    assert_eq!(
        store.release_many(&[claimed[0].lease()]).await?,
        [claimed[0].delivery_id]
    );
    assert!(store.complete_many(&[claimed[0].lease()]).await?.is_empty());
    let again = claim(store, &claim_params).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 1);
    Ok(())
}

/// A snoozed delivery comes back after its delay, not before, without
/// spending an attempt or leaving an error; its old lease is spent.
pub async fn a_snooze_puts_the_delivery_back_after_its_delay_without_spending_an_attempt<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = message("acme", "t")?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let claim_params = params("all", vec![route("t", 1, 1)], 10);
    let claimed = claim(store, &claim_params).await?;
    let delay = Duration::from_secs(600);
    let applied = store
        .snooze_many(&[Snooze {
            lease: claimed[0].lease(),
            delay,
            reason: "over quota".into(),
        }])
        .await?;
    assert_eq!(
        applied,
        [FailureApplied {
            delivery_id: claimed[0].delivery_id,
            dead: false
        }]
    );
    assert!(store.complete_many(&[claimed[0].lease()]).await?.is_empty());
    assert!(claim(store, &claim_params).await?.is_empty());
    fixture.pass_time(delay - Duration::from_secs(5)).await?;
    assert!(
        claim(store, &claim_params).await?.is_empty(),
        "offered before its snooze ended"
    );
    fixture.pass_time(Duration::from_secs(6)).await?;
    // Its only attempt is still unspent.
    let again = claim(store, &claim_params).await?;
    assert_eq!(ids(&again), ids(&claimed));
    assert_eq!(again[0].attempt, 1);
    let states = store.message_deliveries(m.id).await?;
    assert!(states[0].errors.is_empty(), "{:?}", states[0].errors);
    Ok(())
}

/// The bound on snoozes: past it, a snooze spends the attempt like a failure
/// (and, when that was the last, dead-letters with the snooze's fingerprint).
pub async fn a_delivery_past_the_snooze_bound_spends_its_attempt<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "sub", &["topic"]).await?;
    store.publish_batch(&[message("acme", "topic")?]).await?;
    let claim_params = params("sub", vec![route("topic", 1, 1)], 10);
    let claimed = claim(store, &claim_params).await?;
    let snooze = |lease| Snooze {
        lease,
        delay: Duration::ZERO,
        reason: "over quota".into(),
    };
    let applied = store.snooze_many(&[snooze(claimed[0].lease())]).await?;
    assert_eq!(applied.len(), 1);
    assert!(!applied[0].dead, "a snooze within the bound puts it back");
    assert_eq!(
        fixture
            .scalar("SELECT CAST(attempts AS BIGINT) FROM deliveries")
            .await?,
        0
    );
    fixture
        .execute(&format!(
            "UPDATE deliveries SET snoozes = {}",
            courier::MAX_SNOOZES
        ))
        .await?;
    let again = claim(store, &claim_params).await?;
    let applied = store.snooze_many(&[snooze(again[0].lease())]).await?;
    assert!(
        applied[0].dead,
        "past the bound the snooze spent the only attempt"
    );
    let letter = store
        .get_dead_letter(again[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no dead letter"))?;
    assert_eq!(letter.attempts, 1);
    assert_eq!(
        letter.errors.last().map(|e| e.message.as_str()),
        Some("snoozed 1000 times already: over quota")
    );
    // Its fingerprint is the snooze's, from the reason: the dead letter
    // groups under it, not under the failures of other kinds.
    let groups = store
        .dead_letter_groups(&courier::DeadLetterFilter::default(), 10)
        .await?;
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0].fingerprint,
        courier::error_fingerprint(courier::ErrorKind::Snooze, "over quota")
    );
    Ok(())
}
