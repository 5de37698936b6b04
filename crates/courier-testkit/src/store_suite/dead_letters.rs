//! Cases: operators' dead-letter work (list, inspect, retry, discard) and
//! retention.

use std::collections::HashSet;
use std::time::Duration;

use courier::{
    DeadLetter, DeadLetterFilter, DeadLetterKey, DeadLetterStore, Failure, OutboxStore, StoreError,
    TransactionalOutcome,
};
use futures_util::FutureExt;

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

/// Dead letters page by (dead_at, delivery id), filter by tenant, topic and
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
    assert_eq!(
        page.next_cursor.map(|key| key.delivery_id),
        page.items.last().map(|d| d.delivery_id)
    );
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
    let applied = message("acme", "t")?;
    let completed = message("acme", "t")?;
    let dead = message("acme", "t")?;
    let unrouted = message("acme", "nobody-listens")?;
    let pending = message("acme", "t")?;
    store
        .publish_batch(&[
            applied.clone(),
            completed.clone(),
            dead.clone(),
            unrouted.clone(),
        ])
        .await?;
    let claimed = claim(store, &params("s", vec![route("t", 1, 10)], 10)).await?;
    // Transactional work leaves a receipt; a plain completion none.
    let work = tx_work(|_conn| async { Ok(()) }.boxed());
    assert!(matches!(
        store.run_transactional(&claimed[0], work).await?,
        TransactionalOutcome::Applied
    ));
    store.complete_many(&[claimed[1].lease()]).await?;
    store
        .fail_many(&[failure(&claimed[2], "poison", None)])
        .await?;
    store.publish_batch(std::slice::from_ref(&pending)).await?;

    let report = store.prune(Duration::from_secs(3600), 100).await?;
    assert_eq!((report.messages, report.receipts), (0, 0));

    fixture.pass_time(Duration::from_secs(3601)).await?;
    let report = store.prune(Duration::from_secs(3600), 100).await?;
    assert_eq!((report.messages, report.receipts), (3, 1));
    let left: HashSet<String> = fixture
        .texts("SELECT CAST(id AS TEXT) FROM messages")
        .await?
        .into_iter()
        .collect();
    let expected: HashSet<String> = [dead.id.to_string(), pending.id.to_string()].into();
    assert_eq!(left, expected);
    assert!(store
        .get_dead_letter(claimed[2].delivery_id)
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

/// Dead-letters every delivery of topic `x` `subscription` can claim now
/// (claiming until nothing is left: a claim may take tenants in turns);
/// returns their ids, ascending.
async fn kill_all<S: OutboxStore + DeadLetterStore>(
    store: &S,
    subscription: &str,
) -> anyhow::Result<Vec<i64>> {
    let mut killed = Vec::new();
    for _ in 0..10 {
        let claimed = claim(store, &params(subscription, vec![route("x", 1, 10)], 10)).await?;
        if claimed.is_empty() {
            killed.sort_unstable();
            return Ok(killed);
        }
        let failures: Vec<Failure> = claimed.iter().map(|d| failure(d, "bad", None)).collect();
        assert!(store.fail_many(&failures).await?.iter().all(|f| f.dead));
        killed.extend(ids(&claimed));
    }
    anyhow::bail!("claims do not run dry")
}

/// Every dead letter `filter` lists, walking pages of `limit`.
async fn walk<S: DeadLetterStore>(
    store: &S,
    filter: &DeadLetterFilter,
    limit: usize,
) -> anyhow::Result<Vec<DeadLetter>> {
    let mut walked = Vec::new();
    let mut after: Option<DeadLetterKey> = None;
    for _ in 0..100 {
        let page = store.list_dead_letters(filter, after, limit).await?;
        assert!(page.items.len() <= limit);
        walked.extend(page.items);
        match page.next_cursor {
            Some(key) => after = Some(key),
            None => return Ok(walked),
        }
    }
    anyhow::bail!("pagination does not end")
}

/// The message id and the half-open `[dead_after, dead_before)` range of
/// `dead_at` narrow the listing, the count, and retry and discard by
/// filter alike; pages walk (dead_at, id) in order, each dead letter once;
/// an empty range is refused naming `dead_before`.
pub async fn dead_letters_filter_by_message_and_dead_time_everywhere<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let early = [message("t1", "x")?, message("t1", "x")?];
    store.publish_batch(&early).await?;
    let early_ids = kill_all(store, "all").await?;
    // An hour ago, by the database clock, these died.
    fixture.pass_time(Duration::from_secs(3600)).await?;
    let late = [message("t1", "x")?, message("t2", "x")?];
    store.publish_batch(&late).await?;
    let late_ids = kill_all(store, "all").await?;

    let any = DeadLetterFilter::default();
    let walked = walk(store, &any, 1).await?;
    let mut order: Vec<i64> = walked.iter().map(|d| d.delivery_id).collect();
    // The early ones died an hour before the late ones.
    order[..2].sort_unstable();
    order[2..].sort_unstable();
    let expected: Vec<i64> = early_ids.iter().chain(&late_ids).copied().collect();
    assert_eq!(order, expected, "oldest first, each once");
    let keys: Vec<_> = walked.iter().map(|d| (d.dead_at, d.delivery_id)).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");

    let first_late = walked
        .iter()
        .filter(|d| late_ids.contains(&d.delivery_id))
        .filter_map(|d| d.dead_at)
        .min()
        .ok_or_else(|| anyhow::anyhow!("no dead_at"))?;
    let first_early = walked
        .iter()
        .filter_map(|d| d.dead_at)
        .min()
        .ok_or_else(|| anyhow::anyhow!("no dead_at"))?;
    let since = DeadLetterFilter {
        dead_after: Some(first_late),
        ..DeadLetterFilter::default()
    };
    let until = DeadLetterFilter {
        dead_before: Some(first_late),
        ..DeadLetterFilter::default()
    };
    let between = DeadLetterFilter {
        dead_after: Some(first_early),
        dead_before: Some(first_late),
        ..DeadLetterFilter::default()
    };
    let one_message = DeadLetterFilter {
        message_id: Some(late[1].id),
        ..DeadLetterFilter::default()
    };
    let listed = |dead: Vec<DeadLetter>| {
        let mut ids: Vec<i64> = dead.iter().map(|d| d.delivery_id).collect();
        ids.sort_unstable();
        ids
    };
    // Half-open: the bound itself is in `since`, not in `until`.
    assert_eq!(listed(walk(store, &since, 1).await?), late_ids);
    assert_eq!(listed(walk(store, &until, 1).await?), early_ids);
    assert_eq!(listed(walk(store, &between, 10).await?), early_ids);
    let by_message = walk(store, &one_message, 10).await?;
    assert_eq!(by_message.len(), 1);
    assert_eq!(by_message[0].message_id, late[1].id);
    for (filter, n) in [
        (&any, 4),
        (&since, 2),
        (&until, 2),
        (&between, 2),
        (&one_message, 1),
    ] {
        assert_eq!(store.count_dead_letters(filter).await?, n, "{filter:?}");
    }

    let empty = DeadLetterFilter {
        dead_after: Some(first_late),
        dead_before: Some(first_late),
        ..DeadLetterFilter::default()
    };
    let refused = |result: Result<u64, StoreError>| match result {
        Err(StoreError::Invalid(error)) => error.field == "dead_before",
        _ => false,
    };
    assert!(refused(store.count_dead_letters(&empty).await));
    assert!(refused(store.retry_dead_letters_matching(&empty).await));
    assert!(refused(store.discard_dead_letters_matching(&empty).await));
    assert!(matches!(
        store.list_dead_letters(&empty, None, 10).await,
        Err(StoreError::Invalid(_))
    ));

    // Retry and discard by filter act on what the filter names, nothing else.
    assert_eq!(store.retry_dead_letters_matching(&until).await?, 2);
    assert_eq!(store.discard_dead_letters_matching(&one_message).await?, 1);
    let left = walk(store, &any, 10).await?;
    assert_eq!(listed(left), [late_ids[0]]);
    assert_eq!(
        fixture
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available'")
            .await?,
        2
    );
    Ok(())
}
