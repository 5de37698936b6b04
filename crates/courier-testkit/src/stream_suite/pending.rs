//! Cases: acks, what stays pending, the pending summary and detail, and
//! dead letters.

use std::collections::BTreeMap;

use courier_core::{
    dead_letter_entry, EntryOrigin, GroupStart, NewStreamEntry, PendingQuery, PendingSummary,
    StoreError, StreamEntryId, StreamStore,
};
use serde_json::json;
use uuid::Uuid;

use super::helpers::*;
use super::StreamFixture;

/// An ack counts only entries that were pending: an id never read or never
/// appended counts 0, a pending one 1, and acking it again 0.
pub async fn ack_counts_only_pending_entries<F: StreamFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("ack-counts")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 3).await?;
    let read = read_new(store, &key, "g", "c1", 2).await?;
    assert_eq!(ids(&read), appended[..2].to_vec());

    let beyond = StreamEntryId::new(appended[2].major.saturating_add(1_000_000), 0);
    assert_eq!(store.ack(&key, "g", &[beyond]).await?, 0, "never appended");
    assert_eq!(store.ack(&key, "g", &[appended[2]]).await?, 0, "never read");
    assert_eq!(store.ack(&key, "g", &[appended[0]]).await?, 1);
    assert_eq!(
        store.ack(&key, "g", &[appended[0]]).await?,
        0,
        "acked twice"
    );
    assert_eq!(
        store
            .ack(&key, "g", &[appended[0], appended[1], appended[2]])
            .await?,
        1,
        "only the one still pending counts"
    );
    assert_eq!(summary(store, &key, "g").await?, PendingSummary::default());
    Ok(())
}

/// Every id a client can write (each part up to `u64::MAX`) is an id like
/// any other, whatever a backend stores: ids above every entry are unknown
/// to acks, touches and take-backs (they count 0), and reads, claims and
/// listings after them find nothing; a trim to such an id removes every
/// entry and a group started after it sees none of them.
pub async fn ids_up_to_the_largest_are_ids_like_any_other<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("largest-ids")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 3).await?;
    let read = read_new(store, &key, "g", "c1", 3).await?;
    assert_eq!(ids(&read), appended);

    let largest = StreamEntryId::new(u64::MAX, u64::MAX);
    let beyond = [
        largest,
        StreamEntryId::new(u64::MAX, 0),
        StreamEntryId::new(appended[2].major, u64::MAX),
        StreamEntryId::new(1u64 << 63, 0),
    ];
    assert_eq!(store.ack(&key, "g", &beyond).await?, 0, "ack");
    assert_eq!(store.touch(&key, "g", "c1", &beyond).await?, 0, "touch");
    assert_eq!(
        store.uncount_deliveries(&key, "g", "c1", &beyond).await?,
        0,
        "uncount_deliveries"
    );
    // Known ids among them still count.
    let mut mixed = beyond.to_vec();
    mixed.push(appended[0]);
    assert_eq!(store.ack(&key, "g", &mixed).await?, 1, "ack of a mix");

    for after in beyond {
        assert!(
            store.range(&key, after, 10).await?.is_empty(),
            "range after {after}"
        );
        assert!(
            store
                .read_pending(&key, "g", "c1", after, 10)
                .await?
                .is_empty(),
            "read_pending after {after}"
        );
        let query = PendingQuery {
            after,
            count: 10,
            consumer: None,
            min_idle: None,
        };
        assert!(
            store.pending_detail(&key, "g", &query).await?.is_empty(),
            "pending_detail after {after}"
        );
        let claim = courier_core::ClaimIdle {
            cursor: after,
            min_idle: std::time::Duration::ZERO,
            ..claim("g", "c2", 10)
        };
        assert!(
            store.claim_idle(&key, &claim).await?.entries.is_empty(),
            "claim_idle from {after}"
        );
    }

    let late = format!("late-{}", Uuid::now_v7().simple());
    assert!(
        store
            .ensure_group(&key, &late, GroupStart::After(largest))
            .await?
    );
    append_numbered(store, &key, 3, 4).await?;
    assert!(read_new(store, &key, &late, "c1", 10).await?.is_empty());

    // A bound between entries, past what a part of a stored id may hold:
    // the entries above it are those of a later major part (on Redis an
    // entry appended in the same millisecond shares it, hence the filter).
    let all: Vec<StreamEntryId> = store
        .range(&key, StreamEntryId::ZERO, 10)
        .await?
        .iter()
        .map(|entry| entry.id)
        .collect();
    assert_eq!(all.len(), 4);
    let inside = StreamEntryId::new(appended[2].major, u64::MAX);
    let above: Vec<StreamEntryId> = all.iter().copied().filter(|id| *id > inside).collect();
    let ranged: Vec<StreamEntryId> = store
        .range(&key, inside, 10)
        .await?
        .iter()
        .map(|entry| entry.id)
        .collect();
    assert_eq!(ranged, above, "range after {inside}");
    let from_inside = format!("inside-{}", Uuid::now_v7().simple());
    assert!(
        store
            .ensure_group(&key, &from_inside, GroupStart::After(inside))
            .await?
    );
    assert_eq!(
        ids(&read_new(store, &key, &from_inside, "c1", 10).await?),
        above,
        "a group started after {inside}"
    );
    assert_eq!(
        store
            .trim(&key, courier_core::TrimBound::MinId(inside))
            .await?,
        u64::try_from(all.len() - above.len())?,
        "a trim to {inside} removes the entries below it"
    );

    assert_eq!(
        store
            .trim(&key, courier_core::TrimBound::MinId(largest))
            .await?,
        u64::try_from(above.len())?,
        "a trim to the largest id removes every entry left"
    );
    assert!(store.range(&key, StreamEntryId::ZERO, 10).await?.is_empty());
    Ok(())
}

/// An entry stays pending, across re-reads and claims, until it is acked,
/// whichever consumer read or claimed it; the ack ends it for the group.
pub async fn an_entry_stays_pending_until_acked_whoever_read_or_claimed_it<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("stays-pending")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 2).await?;
    let read = read_new(store, &key, "g", "reader", 10).await?;
    assert_eq!(ids(&read), appended);

    // Read again, by itself: still pending, for the reader.
    let reread = store
        .read_pending(&key, "g", "reader", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(pending_ids(&reread), appended);
    assert_eq!(summary(store, &key, "g").await?.count, 2);
    assert!(
        read_new(store, &key, "g", "other", 10).await?.is_empty(),
        "a pending entry is not handed out again as new"
    );

    // Claimed by another consumer: still pending, now for the claimer.
    fixture.age_pending(&key, "g", AGED).await?;
    let claimed = store.claim_idle(&key, &claim("g", "claimer", 10)).await?;
    assert_eq!(ids(&claimed.entries), appended);
    let pending = summary(store, &key, "g").await?;
    assert_eq!(pending.count, 2);
    assert_eq!(
        pending.consumers,
        BTreeMap::from([("claimer".to_owned(), 2)])
    );
    assert!(store
        .read_pending(&key, "g", "reader", StreamEntryId::ZERO, 10)
        .await?
        .is_empty());

    // The reader's ack (it no longer holds the entry) still ends it: pending
    // is per group, not per consumer.
    assert_eq!(store.ack(&key, "g", &appended[..1]).await?, 1);
    assert_eq!(store.ack(&key, "g", &appended[1..]).await?, 1);
    assert_eq!(summary(store, &key, "g").await?.count, 0);
    assert!(store
        .read_pending(&key, "g", "claimer", StreamEntryId::ZERO, 10)
        .await?
        .is_empty());
    Ok(())
}

/// The summary counts the group's pending entries, their lowest and highest
/// ids, and how many each consumer holds, leaving out consumers with none.
pub async fn the_pending_summary_counts_per_consumer<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("pending-summary")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    assert_eq!(summary(store, &key, "g").await?, PendingSummary::default());
    let appended = append_numbered(store, &key, 0, 6).await?;
    let first = read_new(store, &key, "g", "c1", 3).await?;
    let second = read_new(store, &key, "g", "c2", 2).await?;
    let third = read_new(store, &key, "g", "c3", 1).await?;
    assert_eq!(
        (first.len(), second.len(), third.len()),
        (3, 2, 1),
        "six entries in three reads"
    );
    // c3 acks its only entry, c1 its lowest.
    assert_eq!(store.ack(&key, "g", &[appended[5], appended[0]]).await?, 2);
    assert_eq!(
        summary(store, &key, "g").await?,
        PendingSummary {
            count: 4,
            lowest: Some(appended[1]),
            highest: Some(appended[4]),
            consumers: BTreeMap::from([("c1".to_owned(), 2), ("c2".to_owned(), 2)]),
        }
    );
    Ok(())
}

/// A group's lag counts the entries it has not handed out: reads lower it,
/// acks and claims do not, an append raises it; an unknown group is not
/// found.
pub async fn a_group_s_lag_counts_the_entries_it_has_not_handed_out<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let nothing = key("lag-nothing")?;
    let key = key("lag")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    assert_eq!(store.lag(&key, "g").await?, Some(0), "an empty stream");
    let appended = append_numbered(store, &key, 0, 5).await?;
    assert_eq!(store.lag(&key, "g").await?, Some(5));
    let read = read_new(store, &key, "g", "c1", 2).await?;
    assert_eq!(read.len(), 2);
    assert_eq!(store.lag(&key, "g").await?, Some(3), "two handed out");
    assert_eq!(store.ack(&key, "g", &appended[..2]).await?, 2);
    assert_eq!(store.lag(&key, "g").await?, Some(3), "acks leave the lag");
    append_numbered(store, &key, 5, 6).await?;
    assert_eq!(store.lag(&key, "g").await?, Some(4));
    assert!(store.ensure_group(&key, "late", GroupStart::End).await?);
    assert_eq!(
        store.lag(&key, "late").await?,
        Some(0),
        "a group at the end"
    );
    let missing = store.lag(&key, "nope").await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "{missing:?}"
    );
    let no_stream = store.lag(&nothing, "g").await;
    assert!(
        matches!(no_stream, Err(StoreError::NotFound { .. })),
        "{no_stream:?}"
    );
    Ok(())
}

/// Pending detail lists entries in id order with their consumer and
/// deliveries, and filters by consumer, by idle time and by position.
pub async fn pending_detail_filters_by_consumer_idle_time_and_position<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("pending-detail")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 4).await?;
    read_new(store, &key, "g", "c1", 2).await?;
    read_new(store, &key, "g", "c2", 2).await?;
    fixture.age_pending(&key, "g", AGED).await?;
    // c2 reads its entries again: they are fresh, and delivered twice.
    let reread = store
        .read_pending(&key, "g", "c2", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(pending_ids(&reread), appended[2..].to_vec());

    let all = PendingQuery {
        after: StreamEntryId::ZERO,
        count: 100,
        consumer: None,
        min_idle: None,
    };
    let detail = store.pending_detail(&key, "g", &all).await?;
    let listed: Vec<(StreamEntryId, &str, u64)> = detail
        .iter()
        .map(|d| (d.id, d.consumer.as_str(), d.deliveries))
        .collect();
    assert_eq!(
        listed,
        vec![
            (appended[0], "c1", 1),
            (appended[1], "c1", 1),
            (appended[2], "c2", 2),
            (appended[3], "c2", 2),
        ]
    );
    for aged in &detail[..2] {
        assert!(aged.idle >= MIN_IDLE, "{} is idle {:?}", aged.id, aged.idle);
    }
    for fresh in &detail[2..] {
        assert!(
            fresh.idle < MIN_IDLE,
            "{} is idle {:?}",
            fresh.id,
            fresh.idle
        );
    }

    let idle_ones = store
        .pending_detail(
            &key,
            "g",
            &PendingQuery {
                min_idle: Some(MIN_IDLE),
                ..all.clone()
            },
        )
        .await?;
    assert_eq!(
        idle_ones.iter().map(|d| d.id).collect::<Vec<_>>(),
        appended[..2].to_vec()
    );
    let of_c2 = store
        .pending_detail(
            &key,
            "g",
            &PendingQuery {
                consumer: Some("c2".to_owned()),
                ..all.clone()
            },
        )
        .await?;
    assert_eq!(
        of_c2.iter().map(|d| d.id).collect::<Vec<_>>(),
        appended[2..].to_vec()
    );
    let page = store
        .pending_detail(
            &key,
            "g",
            &PendingQuery {
                after: appended[0],
                count: 2,
                ..all.clone()
            },
        )
        .await?;
    assert_eq!(
        page.iter().map(|d| d.id).collect::<Vec<_>>(),
        appended[1..3].to_vec()
    );
    let none = store
        .pending_detail(
            &key,
            "g",
            &PendingQuery {
                consumer: Some("c2".to_owned()),
                min_idle: Some(MIN_IDLE),
                ..all
            },
        )
        .await?;
    assert!(none.is_empty(), "both filters apply: {none:?}");
    Ok(())
}

/// A dead letter appends the entry (payload, headers, origin, plus
/// `courier-original-id` and the other `courier-*` headers) to
/// `{stream}.dead` and acks it; a second dead letter of the same entry finds
/// it no longer pending, returns false and appends nothing.
pub async fn dead_letter_appends_to_the_dead_stream_and_acks_once<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("dead-letter")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let mut failing = NewStreamEntry::new(json!({"order": 7, "lines": [{"sku": "a"}]}));
    failing.headers.insert("trace".into(), "t-1".into());
    failing.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: TENANT.to_owned(),
        topic: "orders.created".to_owned(),
        schema_version: 2,
    });
    let appended = store.append(&key, &[failing.clone(), entry(1)]).await?;
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(ids(&read), appended);
    let errors = vec!["timeout".to_owned(), "refused: \"quoted\"".to_owned()];

    assert!(store.dead_letter(&key, "g", &read[0], &errors).await?);
    let dead = all_entries(store, &key.dead_letters()?).await?;
    assert_eq!(dead.len(), 1);
    let expected = dead_letter_entry(&key, &read[0], &errors);
    assert_eq!(dead[0].payload, failing.payload);
    assert_eq!(dead[0].headers, expected.headers);
    assert_eq!(
        dead[0].headers.get("courier-original-id"),
        Some(&appended[0].to_string())
    );
    assert_eq!(dead[0].headers.get("trace"), Some(&"t-1".to_owned()));
    assert_eq!(dead[0].origin, failing.origin);
    let pending = summary(store, &key, "g").await?;
    assert_eq!(
        (pending.count, pending.lowest),
        (1, Some(appended[1])),
        "the dead-lettered entry was acked, the other is still pending"
    );

    assert!(
        !store.dead_letter(&key, "g", &read[0], &errors).await?,
        "no longer pending"
    );
    assert_eq!(all_entries(store, &key.dead_letters()?).await?.len(), 1);
    assert_eq!(summary(store, &key, "g").await?.count, 1);
    // Acked by a consumer first: nothing to dead-letter either.
    assert_eq!(store.ack(&key, "g", &appended[1..]).await?, 1);
    assert!(!store.dead_letter(&key, "g", &read[1], &errors).await?);
    assert_eq!(all_entries(store, &key.dead_letters()?).await?.len(), 1);
    Ok(())
}

/// Two groups that both give up on the same (relayed) entry each append
/// their own dead letter: one group's dead letter neither acks the entry in
/// the other nor stops the other's.
pub async fn each_group_dead_letters_its_own_delivery_of_an_entry<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("dead-letter-two-groups")?;
    assert!(
        store
            .ensure_group(&key, "billing", GroupStart::Beginning)
            .await?
    );
    assert!(
        store
            .ensure_group(&key, "shipping", GroupStart::Beginning)
            .await?
    );
    let mut relayed = entry(1);
    relayed.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: TENANT.to_owned(),
        topic: "orders.created".to_owned(),
        schema_version: 1,
    });
    store.append(&key, &[relayed]).await?;
    let billing = read_new(store, &key, "billing", "c1", 10).await?;
    let shipping = read_new(store, &key, "shipping", "c1", 10).await?;
    assert!(
        store
            .dead_letter(&key, "billing", &billing[0], &["a".to_owned()])
            .await?
    );
    assert_eq!(summary(store, &key, "shipping").await?.count, 1);
    assert!(
        store
            .dead_letter(&key, "shipping", &shipping[0], &["b".to_owned()])
            .await?
    );
    let dead = all_entries(store, &key.dead_letters()?).await?;
    let errors: Vec<Option<&String>> = dead
        .iter()
        .map(|d| d.headers.get("courier-errors"))
        .collect();
    assert_eq!(
        errors,
        vec![Some(&r#"["a"]"#.to_owned()), Some(&r#"["b"]"#.to_owned())]
    );
    assert_eq!(summary(store, &key, "billing").await?.count, 0);
    assert_eq!(summary(store, &key, "shipping").await?.count, 0);
    Ok(())
}
