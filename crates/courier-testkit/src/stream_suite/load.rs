//! Cases under load: consumers in stores of their own (as separate processes
//! would be) racing over one group while a producer appends, and a consumer
//! that dies holding entries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier_core::{GroupStart, ReadNew, StreamEntryId, StreamStore};
use tokio::time::Instant;

use super::helpers::*;
use super::StreamFixture;

/// Entries the producer appends in the load case.
const LOAD_ENTRIES: u64 = 20_000;

/// Entries per append in the load case.
const LOAD_BATCH: u64 = 100;

/// How long the load case may take before it is a failure.
const LOAD_DEADLINE: Duration = Duration::from_secs(240);

/// Four consumers, each on a store of its own, read (blocking) and ack while
/// a producer appends 20,000 entries in batches of 100: every entry is
/// delivered to exactly one consumer exactly once, every ack counts, and
/// nothing is left pending.
pub async fn concurrent_consumers_ack_every_entry_exactly_once<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let key = key("load-consumers")?;
    let producer = fixture.store().clone();
    assert!(
        producer
            .ensure_group(&key, "g", GroupStart::Beginning)
            .await?
    );
    let acked_total = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + LOAD_DEADLINE;

    let mut consumers = tokio::task::JoinSet::new();
    for index in 0..4 {
        let store = fixture.open_store().await?;
        let (key, acked_total) = (key.clone(), Arc::clone(&acked_total));
        consumers.spawn(async move {
            let read = ReadNew {
                block: Some(Duration::from_millis(200)),
                ..super::helpers::read("g", &format!("c{index}"), 50)
            };
            let mut got: Vec<StreamEntryId> = Vec::new();
            while acked_total.load(Ordering::SeqCst) < LOAD_ENTRIES {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "c{index} timed out with {} acked in all",
                    acked_total.load(Ordering::SeqCst)
                );
                let delivered = store.read_new(&key, &read).await?;
                if delivered.is_empty() {
                    continue;
                }
                anyhow::ensure!(
                    delivered.iter().all(|d| d.deliveries == 1),
                    "a new entry delivered before"
                );
                let batch = ids(&delivered);
                let acked = store.ack(&key, "g", &batch).await?;
                anyhow::ensure!(
                    acked == batch.len() as u64,
                    "c{index} acked {acked} of its {} pending entries",
                    batch.len()
                );
                acked_total.fetch_add(acked, Ordering::SeqCst);
                got.extend(batch);
            }
            Ok::<_, anyhow::Error>(got)
        });
    }

    let mut appended = Vec::with_capacity(LOAD_ENTRIES as usize);
    for batch in 0..LOAD_ENTRIES / LOAD_BATCH {
        let from = i64::try_from(batch * LOAD_BATCH)?;
        let ids = producer
            .append(&key, &numbered(from, from + LOAD_BATCH as i64))
            .await?;
        anyhow::ensure!(ids.len() as u64 == LOAD_BATCH);
        appended.extend(ids);
    }

    let mut delivered_per_id: HashMap<StreamEntryId, u32> = HashMap::new();
    while let Some(joined) = consumers.join_next().await {
        for id in joined?? {
            *delivered_per_id.entry(id).or_default() += 1;
        }
    }
    assert_eq!(
        acked_total.load(Ordering::SeqCst),
        LOAD_ENTRIES,
        "acks counted in all"
    );
    assert_eq!(
        delivered_per_id.len(),
        appended.len(),
        "distinct entries acked"
    );
    for id in &appended {
        assert_eq!(
            delivered_per_id.get(id),
            Some(&1),
            "{id} acked a wrong number of times"
        );
    }
    let pending = summary(&producer, &key, "g").await?;
    assert_eq!(pending.count, 0, "left pending: {pending:?}");
    Ok(())
}

/// A consumer that reads 50 entries, acks 10 and dies (its store dropped)
/// leaves 40 pending; once they are idle, another consumer claims exactly
/// those 40, each on its second delivery.
pub async fn a_killed_consumer_s_unacked_entries_are_claimed_with_a_second_delivery<
    F: StreamFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let key = key("killed-consumer")?;
    let store = fixture.store();
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 60).await?;
    {
        let victim = fixture.open_store().await?;
        let read = read_new(&victim, &key, "g", "victim", 50).await?;
        assert_eq!(ids(&read), appended[..50].to_vec());
        assert_eq!(victim.ack(&key, "g", &appended[..10]).await?, 10);
        drop(victim);
    }
    assert_eq!(summary(store, &key, "g").await?.count, 40);
    fixture.age_pending(&key, "g", AGED).await?;

    let answers = claim_all(store, &key, claim("g", "survivor", 100), 10).await?;
    let claimed: Vec<_> = answers.into_iter().flat_map(|a| a.entries).collect();
    assert_eq!(ids(&claimed), appended[10..50].to_vec());
    assert!(
        claimed.iter().all(|d| d.deliveries == 2),
        "deliveries {:?}",
        deliveries(&claimed)
    );
    let pending = summary(store, &key, "g").await?;
    assert_eq!(pending.count, 40);
    assert_eq!(pending.consumers.get("survivor"), Some(&40));
    assert_eq!(pending.consumers.get("victim"), None);
    // The ten never read are still new.
    assert_eq!(
        ids(&read_new(store, &key, "g", "survivor", 100).await?),
        appended[50..].to_vec()
    );
    Ok(())
}
