//! Cases: where groups start, what a second ensure does, how groups and
//! consumers share a stream, missing groups, and deleting consumers.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use courier_core::{ConsumerRemoval, GroupStart, PendingQuery, StreamEntryId, StreamStore};

use super::helpers::*;
use super::StreamFixture;

/// A group created at the end sees only entries appended after it.
pub async fn a_group_at_the_end_sees_only_later_entries<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("group-at-end")?;
    append_numbered(store, &key, 0, 3).await?;
    assert!(store.ensure_group(&key, "g", GroupStart::End).await?);
    let later = append_numbered(store, &key, 3, 5).await?;
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(
        ids(&read),
        later,
        "only the entries appended after the group"
    );
    assert!(read_new(store, &key, "g", "c1", 10).await?.is_empty());

    // At the end of an empty stream: every entry is later.
    let empty = super::helpers::key("group-at-end-empty")?;
    assert!(store.ensure_group(&empty, "g", GroupStart::End).await?);
    let appended = append_numbered(store, &empty, 0, 2).await?;
    assert_eq!(
        ids(&read_new(store, &empty, "g", "c1", 10).await?),
        appended
    );
    Ok(())
}

/// A group created after an id sees only the entries above it.
pub async fn a_group_after_an_id_sees_only_the_entries_after_it<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("group-after-id")?;
    let appended = append_numbered(store, &key, 0, 5).await?;
    assert!(
        store
            .ensure_group(&key, "g", GroupStart::After(appended[2]))
            .await?
    );
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(ids(&read), appended[3..].to_vec());
    let payloads: Vec<_> = read.iter().map(|d| d.entry.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![serde_json::json!({"n": 3}), serde_json::json!({"n": 4})]
    );
    Ok(())
}

/// A group created at the beginning sees every entry the stream holds, in
/// order, each delivered once.
pub async fn a_group_at_the_beginning_sees_every_entry<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("group-at-beginning")?;
    let appended = append_numbered(store, &key, 0, 4).await?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(ids(&read), appended);
    assert_eq!(deliveries(&read), vec![1; 4]);
    Ok(())
}

/// Ensuring an existing group returns false and moves nothing: neither to
/// the end nor back to the beginning.
pub async fn a_second_ensure_leaves_the_group_where_it_is<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("second-ensure")?;
    let appended = append_numbered(store, &key, 0, 6).await?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let first = read_new(store, &key, "g", "c1", 2).await?;
    assert_eq!(ids(&first), appended[..2].to_vec());

    assert!(!store.ensure_group(&key, "g", GroupStart::End).await?);
    assert!(!store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    assert!(
        !store
            .ensure_group(&key, "g", GroupStart::After(appended[4]))
            .await?
    );
    let rest = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(
        ids(&rest),
        appended[2..].to_vec(),
        "the group continues where it was"
    );
    assert_eq!(summary(store, &key, "g").await?.count, 6);
    Ok(())
}

/// Two groups on one stream each get every entry, independently of each
/// other's reads and acks.
pub async fn two_groups_each_see_every_entry<F: StreamFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("two-groups")?;
    assert!(store.ensure_group(&key, "billing", GroupStart::End).await?);
    assert!(
        store
            .ensure_group(&key, "shipping", GroupStart::End)
            .await?
    );
    let appended = append_numbered(store, &key, 0, 5).await?;
    let billing = read_new(store, &key, "billing", "c1", 10).await?;
    let shipping = read_new(store, &key, "shipping", "c1", 10).await?;
    assert_eq!(ids(&billing), appended);
    assert_eq!(
        ids(&shipping),
        appended,
        "one group's read takes nothing from the other"
    );
    assert_eq!(store.ack(&key, "billing", &appended).await?, 5);
    assert_eq!(summary(store, &key, "billing").await?.count, 0);
    assert_eq!(
        summary(store, &key, "shipping").await?.count,
        5,
        "one group's acks do not touch the other's pending entries"
    );
    assert_eq!(store.ack(&key, "shipping", &appended).await?, 5);
    Ok(())
}

/// Consumers of one group split its entries: each entry goes to exactly one
/// of them, and together they get all.
pub async fn the_consumers_of_a_group_split_its_entries<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("consumers-split")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 30).await?;
    let mut by_consumer: BTreeMap<&str, Vec<StreamEntryId>> = BTreeMap::new();
    let consumers = ["c1", "c2", "c3"];
    for turn in 0..20 {
        let consumer = consumers[turn % consumers.len()];
        let read = read_new(store, &key, "g", consumer, 4).await?;
        by_consumer.entry(consumer).or_default().extend(ids(&read));
    }
    let mut seen = HashSet::new();
    for (consumer, got) in &by_consumer {
        for id in got {
            assert!(
                seen.insert(*id),
                "{id} was handed to {consumer} and another"
            );
        }
    }
    let mut all: Vec<StreamEntryId> = seen.into_iter().collect();
    all.sort();
    assert_eq!(all, appended, "together the consumers got every entry");
    let pending = summary(store, &key, "g").await?;
    let expected: BTreeMap<String, u64> = by_consumer
        .iter()
        .map(|(consumer, got)| ((*consumer).to_owned(), got.len() as u64))
        .collect();
    assert_eq!(pending.consumers, expected);
    Ok(())
}

/// Every group operation on a group the stream does not have fails with
/// `NotFound`, and none of them writes anything: no entry is handed out,
/// acked or dead-lettered, and no consumer appears once the group exists.
pub async fn operations_on_a_missing_group_are_not_found_and_write_nothing<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("missing-group")?;
    let appended = append_numbered(store, &key, 0, 3).await?;
    // Another group exists, so the stream does: only the group is missing.
    assert!(
        store
            .ensure_group(&key, "other", GroupStart::Beginning)
            .await?
    );
    let other = read_new(store, &key, "other", "c1", 10).await?;

    assert_not_found(
        store.read_new(&key, &read("missing", "c1", 10)).await,
        "read_new",
    )?;
    let mut blocking = read("missing", "c1", 10);
    blocking.block = Some(Duration::from_millis(200));
    assert_not_found(store.read_new(&key, &blocking).await, "blocking read_new")?;
    assert_not_found(
        store
            .read_pending(&key, "missing", "c1", StreamEntryId::ZERO, 10)
            .await,
        "read_pending",
    )?;
    assert_not_found(
        store.claim_idle(&key, &claim("missing", "c1", 10)).await,
        "claim_idle",
    )?;
    assert_not_found(store.ack(&key, "missing", &appended).await, "ack")?;
    assert_not_found(
        store.pending_summary(&key, "missing").await,
        "pending_summary",
    )?;
    let query = PendingQuery {
        after: StreamEntryId::ZERO,
        count: 10,
        consumer: None,
        min_idle: None,
    };
    assert_not_found(
        store.pending_detail(&key, "missing", &query).await,
        "pending_detail",
    )?;
    assert_not_found(store.consumers(&key, "missing").await, "consumers")?;
    assert_not_found(
        store.delete_consumer(&key, "missing", "c1").await,
        "delete_consumer",
    )?;
    assert_not_found(
        store
            .dead_letter(&key, "missing", &other[0], &["boom".to_owned()])
            .await,
        "dead_letter",
    )?;
    // A group on a stream that does not exist at all.
    let nowhere = super::helpers::key("missing-group-nowhere")?;
    assert_not_found(
        store.read_new(&nowhere, &read("g", "c1", 10)).await,
        "read_new on a missing stream",
    )?;

    // Nothing was written: the other group's entry is still pending, nothing
    // was dead-lettered, and the group, created now, starts from scratch.
    assert_eq!(summary(store, &key, "other").await?.count, 3);
    assert!(all_entries(store, &key.dead_letters()?).await?.is_empty());
    assert!(
        store
            .ensure_group(&key, "missing", GroupStart::Beginning)
            .await?
    );
    assert!(store.consumers(&key, "missing").await?.is_empty());
    assert_eq!(summary(store, &key, "missing").await?.count, 0);
    let read = read_new(store, &key, "missing", "c1", 10).await?;
    assert_eq!(ids(&read), appended);
    Ok(())
}

/// A consumer with pending entries is not deleted (and keeps them); one
/// without is; an unknown one is reported as not found.
pub async fn deleting_a_consumer_is_refused_while_it_has_pending_entries<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("delete-consumer")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    append_numbered(store, &key, 0, 3).await?;
    let busy = read_new(store, &key, "g", "busy", 2).await?;
    let idle = read_new(store, &key, "g", "idle", 2).await?;
    assert_eq!((busy.len(), idle.len()), (2, 1));
    assert_eq!(store.ack(&key, "g", &ids(&idle)).await?, 1);

    let consumers = store.consumers(&key, "g").await?;
    let listed: Vec<(&str, u64)> = consumers
        .iter()
        .map(|c| (c.name.as_str(), c.pending))
        .collect();
    assert_eq!(listed, vec![("busy", 2), ("idle", 0)]);

    assert_eq!(
        store.delete_consumer(&key, "g", "busy").await?,
        ConsumerRemoval::HasPending(2)
    );
    let pending = summary(store, &key, "g").await?;
    assert_eq!(pending.count, 2);
    assert_eq!(pending.consumers.get("busy"), Some(&2));
    let reread = store
        .read_pending(&key, "g", "busy", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(pending_ids(&reread), ids(&busy), "it keeps its entries");

    assert_eq!(
        store.delete_consumer(&key, "g", "idle").await?,
        ConsumerRemoval::Deleted
    );
    let names: Vec<String> = store
        .consumers(&key, "g")
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, vec!["busy".to_owned()]);
    assert_eq!(
        store.delete_consumer(&key, "g", "idle").await?,
        ConsumerRemoval::NotFound
    );
    assert_eq!(
        store.delete_consumer(&key, "g", "nobody").await?,
        ConsumerRemoval::NotFound
    );
    Ok(())
}
