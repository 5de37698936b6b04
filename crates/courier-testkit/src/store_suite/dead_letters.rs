//! Cases: operators' dead-letter work (list, inspect, retry, discard) and
//! retention.

use std::collections::HashSet;
use std::time::Duration;

use courier::{DeadLetterFilter, DeadLetterStore, Failure, OutboxStore};

use super::helpers::*;
use super::StoreFixture;

/// Retry and discard by ids for given tenants act, in one statement, only on
/// those tenants' dead letters: another tenant's id is left as it is and not
/// counted.
pub async fn dead_letters_by_id_for_tenants_leave_other_tenants_alone<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for tenant in ["t1", "t1", "t2", "t3"] {
        batch.push(message(tenant, "x")?);
    }
    store.publish_batch(&batch).await?;
    let claimed = claim(store, &params("all", vec![route("x", 1, 10)], 10)).await?;
    let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
    assert!(store.fail_many(&failures).await?.iter().all(|f| f.dead));
    let all_ids = ids(&claimed);
    let tenant_of = |id: i64| {
        claimed
            .iter()
            .find(|d| d.delivery_id == id)
            .map(|d| d.tenant.clone())
    };
    let t1_and_t3 = ["t1".to_owned(), "t3".to_owned()];

    // Every id named, t1's and t3's retried, t2's left dead.
    assert_eq!(
        store
            .retry_tenants_dead_letters(&all_ids, &t1_and_t3)
            .await?,
        3
    );
    for id in &all_ids {
        let dead = store.get_dead_letter(*id).await?.is_some();
        assert_eq!(dead, tenant_of(*id).as_deref() == Some("t2"), "{id}");
    }
    // Not visible to these tenants: nothing discarded, nothing counted.
    assert_eq!(
        store
            .discard_tenants_dead_letters(&all_ids, &["t1".to_owned()])
            .await?,
        0
    );
    assert_eq!(store.discard_tenants_dead_letters(&all_ids, &[]).await?, 0);
    assert_eq!(
        store
            .discard_tenants_dead_letters(&all_ids, &["t2".to_owned()])
            .await?,
        1
    );
    assert_eq!(
        fixture
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'dead'")
            .await?,
        0
    );
    Ok(())
}

/// Dead letters page by delivery id, filter by tenant, topic and
/// subscription, show their message, and can be retried (deliverable at
/// once, attempts reset, history kept) or discarded, by id or by filter.
pub async fn dead_letters_can_be_listed_inspected_retried_and_discarded<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for (tenant, topic) in [("t1", "x"), ("t1", "y"), ("t2", "x"), ("t2", "y")] {
        batch.push(message(tenant, topic)?);
    }
    store.publish_batch(&batch).await?;
    let both = params("all", vec![route("x", 1, 10), route("y", 1, 10)], 10);
    let claimed = claim(store, &both).await?;
    let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
    assert!(store.fail_many(&failures).await?.iter().all(|f| f.dead));
    let mut dead_ids = ids(&claimed);
    dead_ids.sort_unstable();

    let any = DeadLetterFilter::default();
    let page = store.list_dead_letters(&any, None, 3).await?;
    assert_eq!(page.items.len(), 3);
    assert_eq!(page.next_cursor, Some(dead_ids[2]));
    let rest = store.list_dead_letters(&any, page.next_cursor, 3).await?;
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.next_cursor, None);

    let t1 = DeadLetterFilter {
        tenant: Some("t1".into()),
        ..DeadLetterFilter::default()
    };
    let x = DeadLetterFilter {
        topic: Some("x".into()),
        ..DeadLetterFilter::default()
    };
    let nobody = DeadLetterFilter {
        subscription: Some("nobody".into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(store.list_dead_letters(&t1, None, 10).await?.items.len(), 2);
    assert_eq!(store.list_dead_letters(&x, None, 10).await?.items.len(), 2);
    assert!(store
        .list_dead_letters(&nobody, None, 10)
        .await?
        .items
        .is_empty());

    let one = store
        .get_dead_letter(dead_ids[0])
        .await?
        .ok_or_else(|| anyhow::anyhow!("missing dead letter"))?;
    assert_eq!((one.tenant.as_str(), one.topic.as_str()), ("t1", "x"));
    assert_eq!(json(&one.payload)?, serde_json::json!({"n": 1}));
    assert_eq!(one.message_id, batch[0].id);
    assert_eq!(one.subscription, "all");
    assert!(store.get_dead_letter(i64::MAX).await?.is_none());

    // Retry by id: deliverable at once, attempts reset, history kept.
    assert_eq!(store.retry_dead_letters(&[dead_ids[0]]).await?, 1);
    assert!(store.get_dead_letter(dead_ids[0]).await?.is_none());
    let again = claim(store, &params("all", vec![route("x", 1, 10)], 10)).await?;
    assert_eq!(ids(&again), [dead_ids[0]]);
    assert_eq!(again[0].attempt, 1);
    let states = store.message_deliveries(batch[0].id).await?;
    assert_eq!(states[0].errors.len(), 1);

    // Retry by filter.
    let t2 = DeadLetterFilter {
        tenant: Some("t2".into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(store.retry_dead_letters_matching(&t2).await?, 2);
    assert_eq!(
        store.list_dead_letters(&any, None, 10).await?.items.len(),
        1
    );

    // Discard by id, then by filter; a retried delivery is not dead and stays.
    assert_eq!(
        store
            .discard_dead_letters(&[dead_ids[1], dead_ids[0]])
            .await?,
        1
    );
    assert!(store.get_dead_letter(dead_ids[1]).await?.is_none());
    let claimed = claim(store, &both).await?;
    let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
    store.fail_many(&failures).await?;
    assert_eq!(store.discard_dead_letters_matching(&x).await?, 1);
    assert_eq!(store.discard_dead_letters_matching(&any).await?, 1);
    assert_eq!(
        fixture
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'dead'")
            .await?,
        0
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 1);
    Ok(())
}

/// Retention removes messages whose deliveries are all done (and those no
/// subscription wanted) and receipts older than it; dead letters and
/// pending work keep their messages.
pub async fn prune_removes_finished_messages_and_old_receipts_but_keeps_dead_letters<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "s", &["t"]).await?;
    let completed = message("acme", "t")?;
    let dead = message("acme", "t")?;
    let unrouted = message("acme", "nobody-listens")?;
    let pending = message("acme", "t")?;
    store
        .publish_batch(&[completed.clone(), dead.clone(), unrouted.clone()])
        .await?;
    let claimed = claim(store, &params("s", vec![route("t", 1, 10)], 10)).await?;
    store.complete_many(&[claimed[0].lease()]).await?;
    store
        .fail_many(&[failure(&claimed[1], "poison", None)])
        .await?;
    store.publish_batch(std::slice::from_ref(&pending)).await?;

    let report = store.prune(Duration::from_secs(3600), 100).await?;
    assert_eq!((report.messages, report.receipts), (0, 0));

    fixture.pass_time(Duration::from_secs(3601)).await?;
    let report = store.prune(Duration::from_secs(3600), 100).await?;
    assert_eq!((report.messages, report.receipts), (2, 1));
    let left: HashSet<String> = fixture
        .texts("SELECT CAST(id AS TEXT) FROM messages")
        .await?
        .into_iter()
        .collect();
    let expected: HashSet<String> = [dead.id.to_string(), pending.id.to_string()].into();
    assert_eq!(left, expected);
    assert!(store
        .get_dead_letter(claimed[1].delivery_id)
        .await?
        .is_some());
    Ok(())
}

/// Retention removes at most `batch` messages a pass.
pub async fn prune_works_in_batches<F: StoreFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    let mut batch = Vec::new();
    for _ in 0..5 {
        batch.push(message("acme", "t")?);
    }
    store.publish_batch(&batch).await?;
    fixture.pass_time(Duration::from_secs(1)).await?;
    assert_eq!(store.prune(Duration::ZERO, 2).await?.messages, 2);
    assert_eq!(store.prune(Duration::ZERO, 10).await?.messages, 3);
    Ok(())
}
