//! Cases: what a claim takes — routes, tenant turns and cursors, ordering
//! keys, in-flight limits and delayed messages.

use std::time::Duration;

use chrono::Utc;
use courier::{ClaimBatch, ClaimedDelivery, OutboxStore};
use uuid::Uuid;

use super::helpers::*;
use super::StoreFixture;

/// A claim takes only the (topic, version) routes asked for, each with its
/// route's attempt budget, under a fresh lease per delivery.
pub async fn claim_takes_only_the_routes_asked_for<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let a1 = message("acme", "a")?;
    let a2 = message("acme", "a")?.with_schema_version(2);
    let b1 = message("acme", "b")?.with_header("trace", "x");
    store
        .publish_batch(&[a1.clone(), a2.clone(), b1.clone()])
        .await?;

    let claimed = claim(store, &params("all", vec![route("a", 1, 3)], 10)).await?;
    assert_eq!(claimed.len(), 1);
    let delivery = &claimed[0];
    assert_eq!(delivery.message_id, a1.id);
    assert_eq!((delivery.attempt, delivery.max_attempts), (1, 3));
    assert_eq!(json(&delivery.payload)?, serde_json::json!({"n": 1}));
    assert_eq!(delivery.subscription, "all");
    assert!(delivery.lease_expires_at > Utc::now());
    assert_eq!(delivery.lease_token.get_version_num(), 4);
    assert_eq!(
        delivery.occurred_at.timestamp_millis(),
        a1.occurred_at.timestamp_millis()
    );

    let claimed = claim(
        store,
        &params("all", vec![route("b", 1, 5), route("a", 2, 7)], 10),
    )
    .await?;
    let got: Vec<(Uuid, i32)> = claimed
        .iter()
        .map(|d| (d.message_id, d.max_attempts))
        .collect();
    assert_eq!(got, [(a2.id, 7), (b1.id, 5)]);
    assert_eq!(
        claimed[1].headers.get("trace").map(String::as_str),
        Some("x")
    );

    assert!(claim(store, &params("all", vec![route("a", 1, 3)], 10))
        .await?
        .is_empty());
    assert!(claim(store, &params("all", Vec::new(), 10))
        .await?
        .is_empty());
    Ok(())
}

/// A lease is named by its delivery and its claim's token together: the
/// token of one claim settles nothing of another claim, even for a delivery
/// whose own token is still live.
pub async fn a_lease_is_named_by_its_delivery_and_its_claim_s_token<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let first = claim(store, &params("all", vec![route("t", 1, 10)], 10)).await?;
    store.publish_batch(&[message("globex", "t")?]).await?;
    let second = claim(store, &params("all", vec![route("t", 1, 10)], 10)).await?;
    assert_eq!((first.len(), second.len()), (1, 1));
    assert_ne!(
        first[0].lease_token, second[0].lease_token,
        "two claims share a lease token"
    );
    let mut crossed = first[0].lease();
    crossed.lease_token = second[0].lease_token;
    assert!(
        store.complete_many(&[crossed]).await?.is_empty(),
        "another claim's token completed a delivery"
    );
    assert_eq!(
        store.complete_many(&[first[0].lease()]).await?,
        vec![first[0].delivery_id]
    );
    Ok(())
}

/// A claim serves the tenants after the cursor it is given: from the first
/// cursor (`""`) every tenant with ready work, whatever earlier claims were
/// given or returned. Here the previous claim's turn was cut at "acme" by
/// its limit, and acme's delivery was released since.
pub async fn a_claim_from_the_first_cursor_serves_every_tenant_with_ready_work<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    store.publish_batch(&[message("acme", "t")?]).await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 1);
    let first = store.claim(&claim_params).await?;
    assert_eq!(first.deliveries.len(), 1);
    assert_eq!(first.next_tenant_cursor, "acme", "the turn was cut at acme");
    assert_eq!(
        store.release_many(&[first.deliveries[0].lease()]).await?,
        ids(&first.deliveries)
    );
    let again = claim(store, &claim_params).await?;
    assert_eq!(
        ids(&again),
        ids(&first.deliveries),
        "a claim from the first cursor found nothing while acme's delivery was ready"
    );
    Ok(())
}

/// An ordering key holds its next message back while an earlier one is
/// running or waiting to retry; unrelated keys and unkeyed messages pass.
pub async fn an_ordering_key_holds_the_next_message_until_the_earlier_completes<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let first = message("acme", "t")?.with_ordering_key("order-1");
    let second = message("acme", "t")?.with_ordering_key("order-1");
    let unrelated = message("acme", "t")?.with_ordering_key("order-2");
    let unkeyed = message("acme", "t")?;
    store
        .publish_batch(&[
            first.clone(),
            second.clone(),
            unrelated.clone(),
            unkeyed.clone(),
        ])
        .await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);

    let claimed = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&claimed), [first.id, unrelated.id, unkeyed.id]);
    assert!(claim(store, &claim_params).await?.is_empty());

    // A retrying earlier message still holds the next one back.
    store
        .fail_many(&[failure(&claimed[0], "again", Some(Duration::ZERO))])
        .await?;
    let retried = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&retried), [first.id]);

    store.complete_many(&[retried[0].lease()]).await?;
    let next = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&next), [second.id]);
    Ok(())
}

/// A dead-lettered head lets its key's next message go.
pub async fn an_ordering_key_releases_the_next_message_when_the_earlier_is_dead_lettered<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let first = message("acme", "t")?.with_ordering_key("k");
    let second = message("acme", "t")?.with_ordering_key("k");
    store
        .publish_batch(&[first.clone(), second.clone()])
        .await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&claimed), [first.id]);
    store
        .fail_many(&[failure(&claimed[0], "poison", None)])
        .await?;
    let next = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&next), [second.id]);
    Ok(())
}

/// One claim serves every tenant with ready work before a busy tenant
/// takes the rest.
pub async fn a_busy_tenant_cannot_starve_a_small_one<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..500 {
        batch.push(message("a-big", "t")?);
    }
    for _ in 0..5 {
        batch.push(message("b-small", "t")?);
    }
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 10)).await?;
    assert_eq!(claimed.len(), 10);
    let small = claimed.iter().filter(|d| d.tenant == "b-small").count();
    assert_eq!(small, 5);
    Ok(())
}

/// The share one tenant cannot use (it has fewer ready deliveries, or it is
/// at its in-flight limit) goes to the tenants that took their whole share,
/// split evenly between them, in the same claim. Every tenant still gets its
/// equal share or all it can take. (The equal split's remainder is not
/// handed out, and there is one top-up round: a topped-up tenant that runs
/// out leaves the rest of its part for the next claim.)
pub async fn a_claim_gives_the_share_a_tenant_cannot_use_to_the_others<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..500 {
        batch.push(message("a-big", "t")?);
    }
    batch.push(message("b-small", "t")?);
    batch.push(message("c-small", "t")?);
    store.publish_batch(&batch).await?;
    let counts = |claimed: &[ClaimedDelivery]| {
        ["a-big", "b-small", "c-small"].map(|t| claimed.iter().filter(|d| d.tenant == t).count())
    };

    // 12 over three tenants is 4 each; the small ones can use 1 each.
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 12)).await?;
    assert_eq!(counts(&claimed), [10, 1, 1]);
    // 10 over two busy tenants: 5 each (c-small has nothing ready, so it is
    // not in the turn).
    batch.clear();
    for _ in 0..20 {
        batch.push(message("b-small", "t")?);
    }
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 10)).await?;
    assert_eq!(counts(&claimed), [5, 5, 0]);
    // A tenant at its in-flight limit cedes the rest of its share.
    let mut limited = params("all", vec![route("t", 1, 10)], 10);
    limited.tenant_in_flight_limit = Some(18);
    let claimed = claim(store, &limited).await?;
    // a-big has 15 running and may take 3 more; b-small takes the other 7.
    assert_eq!(counts(&claimed), [3, 7, 0]);

    // Two tenants topped up share what the third left: 3 over 2 is 1 each
    // and 1 for one of them.
    subscribe(store, "even", &["e"]).await?;
    batch.clear();
    for _ in 0..30 {
        batch.push(message("p", "e")?);
        batch.push(message("q", "e")?);
    }
    batch.push(message("r", "e")?);
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("even", vec![route("e", 1, 10)], 12)).await?;
    let [p, q, r] = ["p", "q", "r"].map(|t| claimed.iter().filter(|d| d.tenant == t).count());
    assert_eq!((p + q, r), (11, 1));
    assert!(p >= 5 && q >= 5, "{p} and {q}");

    // What a tenant takes beyond its share still keeps its ordering keys:
    // one of "k" at a time.
    subscribe(store, "keyed", &["k"]).await?;
    // y's share (4 of 8) ends at its first "k"; its top-up walks on past
    // the other two.
    let mut batch = vec![message("x", "k")?];
    for i in 0..13 {
        let m = message("y", "k")?;
        batch.push(if (3..6).contains(&i) {
            m.with_ordering_key("k")
        } else {
            m
        });
    }
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("keyed", vec![route("k", 1, 10)], 8)).await?;
    let keyed: Vec<Uuid> = claimed
        .iter()
        .filter(|d| d.ordering_key.as_deref() == Some("k"))
        .map(|d| d.message_id)
        .collect();
    // The first "k" (y's fourth message, after x's one).
    assert_eq!((claimed.len(), keyed), (8, vec![batch[4].id]));
    Ok(())
}

/// A tenant whose share was all urgent (priority above 0) is topped up as
/// well, still in priority order: its other urgent deliveries first (highest,
/// then oldest), then priority 0 in enqueue order.
pub async fn a_tenant_whose_share_was_urgent_is_topped_up_in_priority_order<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..30 {
        batch.push(message("a-big", "t")?);
    }
    for priority in [5, 2, 5, 2, 5, 2] {
        batch.push(message("a-big", "t")?.with_priority(priority));
    }
    batch.push(message("b-small", "t")?);
    batch.push(message("c-small", "t")?);
    store.publish_batch(&batch).await?;
    let counts = |claimed: &[ClaimedDelivery]| {
        ["a-big", "b-small", "c-small"].map(|t| claimed.iter().filter(|d| d.tenant == t).count())
    };

    // 12 over three tenants is 4 each: a-big's share is its four most urgent
    // (5, 5, 5, 2); the 6 the small ones leave take its other two urgent and
    // then its four oldest at priority 0.
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 12)).await?;
    assert_eq!(counts(&claimed), [10, 1, 1]);
    let mut big: Vec<Uuid> = claimed
        .iter()
        .filter(|d| d.tenant == "a-big")
        .map(|d| d.message_id)
        .collect();
    big.sort();
    let mut expected: Vec<Uuid> = batch[30..36].iter().map(|m| m.id).collect();
    expected.extend(batch[..4].iter().map(|m| m.id));
    expected.sort();
    assert_eq!(big, expected);

    // A backlog with nothing at priority 0 is topped up too.
    subscribe(store, "urgent", &["u"]).await?;
    let mut batch = Vec::new();
    for _ in 0..20 {
        batch.push(message("a-big", "u")?.with_priority(1));
    }
    batch.push(message("b-small", "u")?);
    batch.push(message("c-small", "u")?);
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("urgent", vec![route("u", 1, 10)], 12)).await?;
    assert_eq!(counts(&claimed), [10, 1, 1]);

    // What the urgent top-up takes still keeps its ordering keys: of three
    // urgent "k" past the share, only the first.
    subscribe(store, "keyed", &["k"]).await?;
    let mut batch = Vec::new();
    for i in 0..12 {
        let m = message("a-big", "k")?.with_priority(3);
        batch.push(if (6..9).contains(&i) {
            m.with_ordering_key("k")
        } else {
            m
        });
    }
    batch.push(message("b-small", "k")?);
    batch.push(message("c-small", "k")?);
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("keyed", vec![route("k", 1, 10)], 12)).await?;
    let keyed: Vec<Uuid> = claimed
        .iter()
        .filter(|d| d.ordering_key.as_deref() == Some("k"))
        .map(|d| d.message_id)
        .collect();
    // a-big: its share of 4, then 6 more, of which one is the first "k"
    // and the other two "k" are passed over.
    assert_eq!((claimed.len(), keyed), (12, vec![batch[6].id]));
    Ok(())
}

/// A full turn continues after the tenant cursor it returns; a tenant with
/// only work the claimer cannot handle does not hold the turn; an empty or
/// partial turn starts the cursor over.
pub async fn tenant_turns_continue_after_the_cursor<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for tenant in ["a", "b", "c"] {
        batch.push(message(tenant, "t")?);
        batch.push(message(tenant, "t")?);
    }
    // Tenant "a0" has only work this worker cannot handle; it must not hold the turn.
    batch.push(message("a0", "unhandled")?);
    store.publish_batch(&batch).await?;

    let mut claim_params = params("all", vec![route("t", 1, 10)], 1);
    let mut served = Vec::new();
    for _ in 0..4 {
        let ClaimBatch {
            deliveries,
            next_tenant_cursor,
        } = store.claim(&claim_params).await?;
        served.push((
            deliveries
                .iter()
                .map(|d| d.tenant.clone())
                .collect::<Vec<_>>(),
            next_tenant_cursor.clone(),
        ));
        claim_params.tenant_cursor = next_tenant_cursor;
    }
    let expected = [
        (vec!["a".to_owned()], "a".to_owned()),
        (vec![], "a0".to_owned()),
        (vec!["b".to_owned()], "b".to_owned()),
        (vec!["c".to_owned()], "c".to_owned()),
    ];
    assert_eq!(served, expected);
    // Nothing after "c": the turn is empty and the cursor starts over.
    let last = store.claim(&claim_params).await?;
    assert!(last.deliveries.is_empty());
    assert_eq!(last.next_tenant_cursor, "");

    // A turn that is not full serves every tenant and resets the cursor.
    claim_params.tenant_cursor = String::new();
    claim_params.limit = 10;
    let all = store.claim(&claim_params).await?;
    assert_eq!(all.deliveries.len(), 3);
    assert_eq!(all.next_tenant_cursor, "");
    Ok(())
}

/// A tenant at its in-flight limit is skipped without spending attempts; a
/// settled delivery frees a slot.
pub async fn the_in_flight_limit_defers_a_tenant_without_spending_attempts<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for _ in 0..5 {
        batch.push(message("acme", "t")?);
    }
    batch.push(message("globex", "t")?);
    store.publish_batch(&batch).await?;
    let mut claim_params = params("all", vec![route("t", 1, 10)], 10);
    claim_params.tenant_in_flight_limit = Some(2);

    let first = claim(store, &claim_params).await?;
    let acme: Vec<&ClaimedDelivery> = first.iter().filter(|d| d.tenant == "acme").collect();
    assert_eq!(acme.len(), 2);
    assert_eq!(first.len(), 3);
    assert!(claim(store, &claim_params).await?.is_empty());

    store.complete_many(&[acme[0].lease()]).await?;
    let next = claim(store, &claim_params).await?;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].attempt, 1);
    Ok(())
}

/// A message delayed or scheduled is not offered before its time, and is
/// at it.
pub async fn a_delayed_message_waits_until_it_is_available<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let wait = Duration::from_secs(600);
    let delayed = message("acme", "t")?.delay(wait);
    let scheduled = message("acme", "t")?.available_at(Utc::now() + wait);
    store
        .publish_batch(&[delayed.clone(), scheduled.clone()])
        .await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    assert!(claim(store, &claim_params).await?.is_empty());
    fixture.pass_time(wait - Duration::from_secs(5)).await?;
    assert!(
        claim(store, &claim_params).await?.is_empty(),
        "offered before its time"
    );
    fixture.pass_time(Duration::from_secs(6)).await?;
    let claimed = claim(store, &claim_params).await?;
    assert_eq!(message_ids(&claimed), [delayed.id, scheduled.id]);
    Ok(())
}
