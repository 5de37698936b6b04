//! Cases: delivery counts, idle claims, following a claim's cursor, and
//! pending entries whose entries were trimmed.

use std::collections::BTreeMap;
use std::time::Duration;

use courier_core::{
    ClaimIdle, GroupStart, PendingEntry, PendingQuery, StreamEntryId, StreamStore, TrimBound,
};

use super::helpers::*;
use super::StreamFixture;

/// Every delivery counts: the first read 1, then each re-read of one's own
/// pending entries and each claim one more, whoever does it.
pub async fn claims_and_own_pending_reads_count_deliveries<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("delivery-counts")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 2).await?;
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(deliveries(&read), vec![1, 1]);

    let reread = store
        .read_pending(&key, "g", "c1", StreamEntryId::ZERO, 10)
        .await?;
    let counts: Vec<(StreamEntryId, u64)> = reread
        .iter()
        .map(|entry| match entry {
            PendingEntry::Present(delivered) => Ok((delivered.entry.id, delivered.deliveries)),
            PendingEntry::Deleted(id) => Err(anyhow::anyhow!("{id} reads as deleted")),
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(counts, vec![(appended[0], 2), (appended[1], 2)]);
    // Only entries above `after`: the second is delivered a third time.
    let above = store.read_pending(&key, "g", "c1", appended[0], 10).await?;
    assert_eq!(pending_ids(&above), appended[1..].to_vec());

    fixture.age_pending(&key, "g", AGED).await?;
    // Aging delivers nothing; the claim is one more delivery of each.
    let claimed = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert_eq!(ids(&claimed.entries), appended);
    assert_eq!(deliveries(&claimed.entries), vec![3, 4]);
    assert_eq!(
        claimed.entries[0].entry.payload,
        serde_json::json!({"n": 0})
    );

    let by_claimer = store
        .read_pending(&key, "g", "c2", StreamEntryId::ZERO, 1)
        .await?;
    match by_claimer.as_slice() {
        [PendingEntry::Present(delivered)] => {
            assert_eq!((delivered.entry.id, delivered.deliveries), (appended[0], 4));
        }
        other => anyhow::bail!("the claimer's re-read of one: {other:?}"),
    }
    let detail = store
        .pending_detail(
            &key,
            "g",
            &courier_core::PendingQuery {
                after: StreamEntryId::ZERO,
                count: 10,
                consumer: None,
                min_idle: None,
            },
        )
        .await?;
    let listed: Vec<(StreamEntryId, &str, u64)> = detail
        .iter()
        .map(|d| (d.id, d.consumer.as_str(), d.deliveries))
        .collect();
    assert_eq!(listed, vec![(appended[0], "c2", 4), (appended[1], "c2", 4)]);
    Ok(())
}

/// A claim takes only entries idle at least its `min_idle`: none right after
/// they were read, none that are idle less, all once they are idle enough.
pub async fn nothing_below_the_idle_time_is_claimed<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("claim-idle-time")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 3).await?;
    read_new(store, &key, "g", "c1", 10).await?;

    let fresh = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert!(fresh.entries.is_empty(), "claimed fresh entries: {fresh:?}");
    assert!(fresh.deleted.is_empty());
    assert_eq!(fresh.next, StreamEntryId::ZERO);

    fixture
        .age_pending(&key, "g", Duration::from_secs(10))
        .await?;
    let short = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert!(
        short.entries.is_empty(),
        "claimed entries idle 10 s with min_idle 60 s: {short:?}"
    );
    let pending = summary(store, &key, "g").await?;
    assert_eq!(pending.consumers, BTreeMap::from([("c1".to_owned(), 3)]));

    let long_enough = store
        .claim_idle(
            &key,
            &ClaimIdle {
                min_idle: Duration::from_secs(5),
                ..claim("g", "c2", 10)
            },
        )
        .await?;
    assert_eq!(ids(&long_enough.entries), appended);
    assert_eq!(
        summary(store, &key, "g").await?.consumers,
        BTreeMap::from([("c2".to_owned(), 3)])
    );
    Ok(())
}

/// A touch restarts the idle time of the consumer's own pending entries
/// without counting a delivery, so a claim of idle entries passes them by;
/// entries pending to another consumer are left alone.
pub async fn a_touch_keeps_own_pending_entries_from_idle_claims<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("touch")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 3).await?;
    read_new(store, &key, "g", "c1", 2).await?;
    read_new(store, &key, "g", "c3", 1).await?;
    fixture.age_pending(&key, "g", AGED).await?;

    // Entry 2 is c3's: c1's touch leaves it idle.
    assert_eq!(store.touch(&key, "g", "c1", &appended).await?, 2);
    let claimed = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert_eq!(ids(&claimed.entries), appended[2..].to_vec());
    assert_eq!(deliveries(&claimed.entries), vec![2]);
    assert_eq!(
        summary(store, &key, "g").await?.consumers,
        BTreeMap::from([("c1".to_owned(), 2), ("c2".to_owned(), 1)])
    );
    // Touched, not delivered: once idle they are claimed at delivery 2.
    fixture.age_pending(&key, "g", AGED).await?;
    let later = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert_eq!(ids(&later.entries), appended);
    assert_eq!(deliveries(&later.entries), vec![2, 2, 3]);
    // Acked or unknown ids touch nothing.
    store.ack(&key, "g", &appended).await?;
    assert_eq!(store.touch(&key, "g", "c2", &appended).await?, 0);

    // A touched entry that was trimmed stays pending, and is reported
    // deleted by its consumer's re-read (Redis's XCLAIM alone would drop
    // it from the pending list).
    let late = append_numbered(store, &key, 3, 4).await?;
    read_new(store, &key, "g", "c1", 1).await?;
    assert_eq!(store.trim(&key, TrimBound::MaxLen(0)).await?, 4);
    store.touch(&key, "g", "c1", &late).await?;
    let reread = store
        .read_pending(&key, "g", "c1", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(reread, vec![PendingEntry::Deleted(late[0])]);
    Ok(())
}

/// Taking back a delivery (of an entry read but not handled) drops its
/// count by one, never below 0, and leaves its consumer and idle time as
/// they were; entries pending to another consumer, acked or unknown are
/// left alone.
pub async fn a_delivery_taken_back_is_not_counted<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("uncount")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 3).await?;
    read_new(store, &key, "g", "c1", 2).await?;
    read_new(store, &key, "g", "c3", 1).await?;
    fixture.age_pending(&key, "g", AGED).await?;

    // Entry 2 is c3's: c1 takes back only its own two.
    assert_eq!(
        store.uncount_deliveries(&key, "g", "c1", &appended).await?,
        2
    );
    let counts = |detail: Vec<courier_core::PendingDetail>| {
        detail
            .into_iter()
            .map(|d| (d.consumer, d.deliveries))
            .collect::<Vec<_>>()
    };
    let all = PendingQuery {
        after: StreamEntryId::ZERO,
        count: 10,
        consumer: None,
        min_idle: None,
    };
    assert_eq!(
        counts(store.pending_detail(&key, "g", &all).await?),
        vec![
            ("c1".to_owned(), 0),
            ("c1".to_owned(), 0),
            ("c3".to_owned(), 1)
        ]
    );
    // Still idle: a claim takes all three, the taken-back ones at their
    // first counted delivery.
    let claimed = store.claim_idle(&key, &claim("g", "c2", 10)).await?;
    assert_eq!(ids(&claimed.entries), appended);
    assert_eq!(deliveries(&claimed.entries), vec![1, 1, 2]);
    // Never below 0.
    let first = &appended[..1];
    assert_eq!(store.uncount_deliveries(&key, "g", "c2", first).await?, 1);
    assert_eq!(store.uncount_deliveries(&key, "g", "c2", first).await?, 1);
    let reread = store
        .read_pending(&key, "g", "c2", StreamEntryId::ZERO, 1)
        .await?;
    match reread.as_slice() {
        [PendingEntry::Present(entry)] => assert_eq!(entry.deliveries, 1),
        other => anyhow::bail!("expected entry 0 present, got {other:?}"),
    }
    // Acked or unknown ids are left alone.
    store.ack(&key, "g", &appended).await?;
    assert_eq!(
        store.uncount_deliveries(&key, "g", "c2", &appended).await?,
        0
    );
    Ok(())
}

/// Idle entries behind more than ten times `count` busy (recently delivered)
/// ones are reached by following `next` until `0-0`, each claimed once: a
/// backend may scan a bounded stretch per call (Redis scans 10 × count).
pub async fn claims_reach_idle_entries_behind_busy_ones_by_following_next<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("claim-follows-next")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let count = 2;
    let busy = 25;
    let appended = append_numbered(store, &key, 0, busy + 5).await?;
    read_new(store, &key, "g", "c1", 100).await?;
    fixture.age_pending(&key, "g", AGED).await?;
    // The first 25 are delivered again now: busy. The last five stay idle.
    let refreshed = store
        .read_pending(&key, "g", "c1", StreamEntryId::ZERO, busy as usize)
        .await?;
    assert_eq!(pending_ids(&refreshed), appended[..busy as usize].to_vec());

    let answers = claim_all(store, &key, claim("g", "c2", count), 100).await?;
    let mut claimed = Vec::new();
    for answer in &answers {
        assert!(answer.entries.len() <= count, "more than count: {answer:?}");
        assert!(answer.deleted.is_empty());
        claimed.extend(ids(&answer.entries));
    }
    assert_eq!(
        claimed,
        appended[busy as usize..].to_vec(),
        "exactly the idle entries, once each, in id order"
    );
    let pending = summary(store, &key, "g").await?;
    assert_eq!(
        pending.consumers,
        BTreeMap::from([("c1".to_owned(), busy as u64), ("c2".to_owned(), 5)])
    );
    Ok(())
}

/// Entries trimmed while pending stay pending: the owner's re-read reports
/// them deleted (in place, in id order) and leaves them pending, and a claim
/// reports them in `deleted` and drops them from pending, taking over only
/// the entries that still exist. (Two groups: a re-read delivers again, so
/// the claim runs in a group nobody re-read; both are aged before the trim,
/// while every entry still exists.)
pub async fn trimmed_pending_entries_are_reported_deleted<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("trimmed-pending")?;
    assert!(
        store
            .ensure_group(&key, "reread", GroupStart::Beginning)
            .await?
    );
    assert!(
        store
            .ensure_group(&key, "claimed", GroupStart::Beginning)
            .await?
    );
    let appended = append_numbered(store, &key, 0, 4).await?;
    assert_eq!(read_new(store, &key, "reread", "c1", 10).await?.len(), 4);
    assert_eq!(read_new(store, &key, "claimed", "c1", 10).await?.len(), 4);
    fixture.age_pending(&key, "reread", AGED).await?;
    fixture.age_pending(&key, "claimed", AGED).await?;
    assert_eq!(store.trim(&key, TrimBound::MaxLen(2)).await?, 2);

    let reread = store
        .read_pending(&key, "reread", "c1", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(pending_ids(&reread), appended);
    assert!(matches!(reread[0], PendingEntry::Deleted(id) if id == appended[0]));
    assert!(matches!(reread[1], PendingEntry::Deleted(id) if id == appended[1]));
    for (entry, n) in reread[2..].iter().zip([2, 3]) {
        match entry {
            PendingEntry::Present(delivered) => {
                assert_eq!(delivered.entry.payload, serde_json::json!({ "n": n }));
            }
            PendingEntry::Deleted(id) => anyhow::bail!("{id} was not trimmed"),
        }
    }
    assert_eq!(
        summary(store, &key, "reread").await?.count,
        4,
        "a re-read leaves trimmed entries pending"
    );

    let answers = claim_all(store, &key, claim("claimed", "c2", 10), 10).await?;
    let mut claimed = Vec::new();
    let mut deleted = Vec::new();
    for answer in answers {
        claimed.extend(ids(&answer.entries));
        deleted.extend(answer.deleted);
    }
    deleted.sort();
    assert_eq!(claimed, appended[2..].to_vec());
    assert_eq!(deleted, appended[..2].to_vec());
    let pending = summary(store, &key, "claimed").await?;
    assert_eq!(pending.count, 2, "the claim dropped the trimmed entries");
    assert_eq!(pending.lowest, Some(appended[2]));
    assert_eq!(pending.consumers, BTreeMap::from([("c2".to_owned(), 2)]));
    assert_eq!(
        summary(store, &key, "reread").await?.count,
        4,
        "another group's claim drops nothing here"
    );
    Ok(())
}
