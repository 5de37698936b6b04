//! Cases: message priorities — higher first within a tenant's share of each
//! claim, tenants still taking turns first, ordering keys still in order.

use courier::{ClaimedDelivery, NewMessage, OutboxStore, StoreError};
use uuid::Uuid;

use super::helpers::*;
use super::StoreFixture;

/// The backlog the overtaking case queues ahead of its urgent message.
const BACKLOG: usize = 100_000;

/// A priority-9 message enqueued behind 100,000 priority-0 messages of its
/// tenant is taken by the very next claim (counted in claims, not time),
/// after claims have already walked into the backlog; the backlog then goes
/// on in enqueue order, and priority-0 messages enqueued after the urgent
/// one wait their turn behind the backlog.
pub async fn a_priority_message_overtakes_a_100_000_message_backlog_in_one_claim<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let backlog: Vec<NewMessage> = (0..BACKLOG)
        .map(|_| message("acme", "t"))
        .collect::<anyhow::Result<_>>()?;
    for chunk in backlog.chunks(10_000) {
        store.publish_batch(chunk).await?;
    }
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    // Claims already under way: the store has floors for acme by now.
    let mut taken = 0;
    for _ in 0..3 {
        let claimed = claim(store, &claim_params).await?;
        assert!(claimed.iter().all(|d| d.priority == 0));
        let leases: Vec<_> = claimed.iter().map(ClaimedDelivery::lease).collect();
        store.complete_many(&leases).await?;
        taken += claimed.len();
    }
    assert_eq!(taken, 30);

    let urgent = message("acme", "t")?.with_priority(9);
    let later: Vec<NewMessage> = (0..5)
        .map(|_| message("acme", "t"))
        .collect::<anyhow::Result<_>>()?;
    store.publish_batch(std::slice::from_ref(&urgent)).await?;
    store.publish_batch(&later).await?;

    let one = params("all", vec![route("t", 1, 10)], 1);
    let mut claims = 0;
    let found = loop {
        claims += 1;
        let claimed = claim(store, &one).await?;
        anyhow::ensure!(!claimed.is_empty(), "a claim found nothing");
        let leases: Vec<_> = claimed.iter().map(ClaimedDelivery::lease).collect();
        store.complete_many(&leases).await?;
        if claimed.iter().any(|d| d.message_id == urgent.id) {
            break claimed;
        }
        anyhow::ensure!(
            claims < 100,
            "the priority-9 message was not claimed in 100 claims"
        );
    };
    assert_eq!(
        claims, 1,
        "the priority-9 message waited {claims} claims behind a priority-0 backlog"
    );
    assert_eq!(found[0].priority, 9);
    // The backlog resumes where it was, oldest first, ahead of what came
    // after the urgent message.
    let next = claim(store, &params("all", vec![route("t", 1, 10)], 3)).await?;
    assert_eq!(
        message_ids(&next),
        backlog[30..33].iter().map(|m| m.id).collect::<Vec<Uuid>>()
    );
    Ok(())
}

/// Tenants take turns first: each gets its share of a claim whatever the
/// priorities of the others; within its share a tenant's highest priority
/// comes first, oldest first within a priority, then its priority-0 work in
/// enqueue order.
pub async fn priorities_order_a_tenant_s_share_and_tenants_still_take_turns<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let a_plain: Vec<NewMessage> = (0..3)
        .map(|_| message("a", "t"))
        .collect::<anyhow::Result<_>>()?;
    let a_three = message("a", "t")?.with_priority(3);
    let a_seven = message("a", "t")?.with_priority(7);
    let a_seven_later = message("a", "t")?.with_priority(7);
    let b_plain: Vec<NewMessage> = (0..4)
        .map(|_| message("b", "t"))
        .collect::<anyhow::Result<_>>()?;
    let mut batch = a_plain.clone();
    batch.extend([a_three.clone(), a_seven.clone(), a_seven_later.clone()]);
    batch.extend(b_plain.clone());
    store.publish_batch(&batch).await?;

    let claim_params = params("all", vec![route("t", 1, 10)], 4);
    let first = claim(store, &claim_params).await?;
    let of = |tenant: &str, claimed: &[ClaimedDelivery]| -> Vec<Uuid> {
        let mut mine: Vec<&ClaimedDelivery> =
            claimed.iter().filter(|d| d.tenant == tenant).collect();
        mine.sort_by_key(|d| (std::cmp::Reverse(d.priority), d.delivery_id));
        mine.iter().map(|d| d.message_id).collect()
    };
    assert_eq!(
        of("a", &first),
        [a_seven.id, a_seven_later.id],
        "a's share starts with its priority-7 messages, oldest first"
    );
    assert_eq!(
        of("b", &first),
        [b_plain[0].id, b_plain[1].id],
        "b's share is not taken by a's priorities"
    );
    let second = claim(store, &claim_params).await?;
    assert_eq!(of("a", &second), [a_three.id, a_plain[0].id]);
    assert_eq!(of("b", &second), [b_plain[2].id, b_plain[3].id]);
    let third = claim(store, &claim_params).await?;
    assert_eq!(of("a", &third), [a_plain[1].id, a_plain[2].id]);
    Ok(())
}

/// A priority does not overtake an ordering key: a priority-9 message waits
/// for the earlier message of its key like any other.
pub async fn a_priority_message_keeps_its_place_in_its_ordering_key<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let head = message("acme", "t")?.with_ordering_key("order-1");
    let urgent = message("acme", "t")?
        .with_ordering_key("order-1")
        .with_priority(9);
    let unkeyed = message("acme", "t")?;
    store
        .publish_batch(&[head.clone(), urgent.clone(), unkeyed.clone()])
        .await?;
    let claim_params = params("all", vec![route("t", 1, 10)], 10);
    let claimed = claim(store, &claim_params).await?;
    let mut got = message_ids(&claimed);
    got.sort();
    let mut expected = vec![head.id, unkeyed.id];
    expected.sort();
    assert_eq!(
        got, expected,
        "the keyed priority-9 message overtook its key"
    );
    let leases: Vec<_> = claimed.iter().map(ClaimedDelivery::lease).collect();
    store.complete_many(&leases).await?;
    assert_eq!(
        message_ids(&claim(store, &claim_params).await?),
        [urgent.id]
    );
    Ok(())
}

/// A priority outside 0 to 9 is refused, naming the field, whether it comes
/// through the store or as plain SQL; plain SQL may set a valid one, and it
/// is kept on the message and honoured by the claim.
pub async fn priorities_outside_0_to_9_are_refused_and_plain_sql_sets_them<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    for bad in [-1, 10] {
        match store
            .publish_batch(&[message("acme", "t")?.with_priority(bad)])
            .await
        {
            Err(StoreError::Invalid(error)) => assert_eq!(error.field, "priority"),
            other => panic!("priority {bad} was not refused: {other:?}"),
        }
        let refused = fixture
            .execute(&format!(
                "INSERT INTO messages (tenant, topic, payload, priority) VALUES ('acme', 't', '{{}}', {bad})"
            ))
            .await;
        assert!(refused.is_err(), "plain SQL stored priority {bad}");
    }
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 0);

    store.publish_batch(&[message("acme", "t")?]).await?;
    fixture
        .execute(
            "INSERT INTO messages (tenant, topic, payload, priority) VALUES ('acme', 't', '{\"n\": 2}', 6)",
        )
        .await?;
    let first = claim(store, &params("all", vec![route("t", 1, 10)], 1)).await?;
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].priority, 6,
        "the plain-SQL priority-6 message came second"
    );
    let (stored, _) = courier::AdminStore::get_message(store, first[0].message_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the message is gone"))?;
    assert_eq!(stored.priority, 6);
    Ok(())
}
