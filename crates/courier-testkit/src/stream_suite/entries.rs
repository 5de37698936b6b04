//! Cases: appending, ranges, trims, what an entry carries, and the input
//! every operation refuses.

use std::time::Duration;

use courier_core::{
    ClaimIdle, EntryOrigin, GroupStart, NewStreamEntry, PendingQuery, ReadNew, StreamEntry,
    StreamEntryId, StreamStore, TrimBound, MAX_HEADERS, MAX_PAYLOAD_BYTES, MAX_STREAM_BATCH,
};
use serde_json::json;
use uuid::Uuid;

use super::helpers::*;
use super::StreamFixture;

/// Refused input names its field and stores nothing: counts of 0 or above
/// [`MAX_STREAM_BATCH`], blocks above 30 s, malformed names, oversized or
/// malformed entries (one bad entry refuses its whole batch).
pub async fn invalid_input_is_refused_naming_the_field_and_stores_nothing<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("invalid-input")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 2).await?;

    let mut too_many_headers = entry(9);
    for n in 0..=MAX_HEADERS {
        too_many_headers.headers.insert(format!("h{n}"), "v".into());
    }
    assert_invalid(
        store.append(&key, &[entry(8), too_many_headers]).await,
        "headers",
        "an entry with too many headers",
    )?;
    let too_large = NewStreamEntry::new(json!({ "blob": "x".repeat(MAX_PAYLOAD_BYTES) }));
    assert_invalid(
        store.append(&key, &[too_large]).await,
        "payload",
        "an oversized payload",
    )?;
    let mut bad_origin = entry(9);
    bad_origin.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: "not a tenant".into(),
        topic: "t".into(),
        schema_version: 1,
    });
    assert_invalid(
        store.append(&key, &[bad_origin]).await,
        "tenant",
        "an origin with a malformed tenant",
    )?;
    assert_refused(
        store
            .append(&key, &numbered(0, MAX_STREAM_BATCH as i64 + 1))
            .await,
        "an append over the batch limit",
    )?;
    assert_invalid(store.append(&key, &[]).await, "entries", "an empty append")?;

    assert_invalid(
        store.ensure_group(&key, "bad group", GroupStart::End).await,
        "group",
        "ensure_group with a malformed group",
    )?;
    let valid = read("g", "c1", 10);
    for (read_new, field, what) in [
        (
            ReadNew {
                count: 0,
                ..valid.clone()
            },
            "count",
            "read_new of 0",
        ),
        (
            ReadNew {
                count: MAX_STREAM_BATCH + 1,
                ..valid.clone()
            },
            "count",
            "read_new over the limit",
        ),
        (
            ReadNew {
                block: Some(Duration::from_secs(31)),
                ..valid.clone()
            },
            "block_ms",
            "read_new blocking 31 s",
        ),
        (
            ReadNew {
                consumer: "bad consumer".into(),
                ..valid.clone()
            },
            "consumer",
            "read_new with a malformed consumer",
        ),
        (
            ReadNew {
                group: "bad/group".into(),
                ..valid.clone()
            },
            "group",
            "read_new with a malformed group",
        ),
    ] {
        assert_invalid(store.read_new(&key, &read_new).await, field, what)?;
    }
    assert_invalid(
        store
            .read_pending(&key, "g", "c1", StreamEntryId::ZERO, 0)
            .await,
        "count",
        "read_pending of 0",
    )?;
    assert_invalid(
        store
            .read_pending(&key, "g", "c1", StreamEntryId::ZERO, MAX_STREAM_BATCH + 1)
            .await,
        "count",
        "read_pending over the limit",
    )?;
    assert_invalid(
        store
            .read_pending(&key, "g", "", StreamEntryId::ZERO, 10)
            .await,
        "consumer",
        "read_pending with an empty consumer",
    )?;
    let valid_claim = ClaimIdle {
        min_idle: Duration::ZERO,
        ..claim("g", "c1", 10)
    };
    for (claim_idle, field, what) in [
        (
            ClaimIdle {
                count: 0,
                ..valid_claim.clone()
            },
            "count",
            "claim_idle of 0",
        ),
        (
            ClaimIdle {
                count: MAX_STREAM_BATCH + 1,
                ..valid_claim.clone()
            },
            "count",
            "claim_idle over the limit",
        ),
        (
            ClaimIdle {
                consumer: "-dash-first".into(),
                ..valid_claim.clone()
            },
            "consumer",
            "claim_idle with a malformed consumer",
        ),
    ] {
        assert_invalid(store.claim_idle(&key, &claim_idle).await, field, what)?;
    }
    assert_invalid(
        store.range(&key, StreamEntryId::ZERO, 0).await,
        "count",
        "range of 0",
    )?;
    assert_invalid(
        store
            .range(&key, StreamEntryId::ZERO, MAX_STREAM_BATCH + 1)
            .await,
        "count",
        "range over the limit",
    )?;
    let query = PendingQuery {
        after: StreamEntryId::ZERO,
        count: 0,
        consumer: None,
        min_idle: None,
    };
    assert_invalid(
        store.pending_detail(&key, "g", &query).await,
        "count",
        "pending_detail of 0",
    )?;
    assert_invalid(
        store
            .pending_detail(
                &key,
                "g",
                &PendingQuery {
                    count: 10,
                    consumer: Some("bad consumer".into()),
                    ..query
                },
            )
            .await,
        "consumer",
        "pending_detail for a malformed consumer",
    )?;
    assert_invalid(
        store.delete_consumer(&key, "g", "bad consumer").await,
        "consumer",
        "delete_consumer of a malformed consumer",
    )?;
    let many_ids = vec![appended[0]; MAX_STREAM_BATCH + 1];
    assert_refused(
        store.ack(&key, "g", &many_ids).await,
        "an ack over the batch limit",
    )?;

    // Nothing was stored: no entry appended, no consumer created, nothing
    // handed out or acked.
    assert_eq!(entry_ids(&all_entries(store, &key).await?), appended);
    assert!(store.consumers(&key, "g").await?.is_empty());
    assert_eq!(summary(store, &key, "g").await?.count, 0);
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(ids(&read), appended);
    Ok(())
}

/// Appended ids increase strictly within a batch and above every id the
/// stream held before, also after a trim removed every entry (the newest
/// included), so a group whose cursor passed the trimmed entries still sees
/// the next append.
pub async fn appended_ids_increase_above_every_earlier_id_even_after_a_trim<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("ids-increase")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let first = append_numbered(store, &key, 0, 3).await?;
    let second = append_numbered(store, &key, 3, 8).await?;
    assert_eq!((first.len(), second.len()), (3, 5));
    let all: Vec<StreamEntryId> = first.iter().chain(&second).copied().collect();
    assert!(
        all.windows(2).all(|pair| pair[0] < pair[1]),
        "ids not strictly increasing: {all:?}"
    );
    assert_eq!(ids(&read_new(store, &key, "g", "c1", 100).await?), all);
    assert_eq!(store.ack(&key, "g", &all).await?, 8);

    assert_eq!(store.trim(&key, TrimBound::MaxLen(0)).await?, 8);
    assert!(all_entries(store, &key).await?.is_empty());
    let after_trim = store.append(&key, &[entry(8)]).await?;
    assert!(
        after_trim[0] > all[7],
        "{} after a trim is not above {}",
        after_trim[0],
        all[7]
    );
    assert_eq!(
        ids(&read_new(store, &key, "g", "c1", 100).await?),
        after_trim,
        "the group's cursor is below the new entry"
    );
    Ok(())
}

/// A range returns up to `count` entries above an id, in order, outside any
/// group: nothing becomes pending and the group still reads every entry.
pub async fn range_reads_after_an_id_without_making_anything_pending<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("range")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let appended = append_numbered(store, &key, 0, 5).await?;
    let page = store.range(&key, appended[1], 2).await?;
    assert_eq!(entry_ids(&page), appended[2..4].to_vec());
    assert_eq!(page[0].payload, json!({"n": 2}));
    assert_eq!(entry_ids(&all_entries(store, &key).await?), appended);
    assert!(store.range(&key, appended[4], 10).await?.is_empty());
    let nowhere = super::helpers::key("range-nowhere")?;
    assert!(store
        .range(&nowhere, StreamEntryId::ZERO, 10)
        .await?
        .is_empty());

    assert_eq!(summary(store, &key, "g").await?.count, 0);
    assert!(store.consumers(&key, "g").await?.is_empty());
    let read = read_new(store, &key, "g", "c1", 10).await?;
    assert_eq!(ids(&read), appended);
    assert_eq!(deliveries(&read), vec![1; 5]);
    Ok(())
}

/// A trim to a length keeps the newest entries, a trim to an id keeps those
/// at or above it; each returns how many it removed.
pub async fn trim_keeps_the_newest_entries_or_those_from_an_id<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("trim")?;
    let appended = append_numbered(store, &key, 0, 6).await?;
    assert_eq!(store.trim(&key, TrimBound::MinId(appended[2])).await?, 2);
    assert_eq!(
        entry_ids(&all_entries(store, &key).await?),
        appended[2..].to_vec()
    );
    assert_eq!(store.trim(&key, TrimBound::MinId(appended[0])).await?, 0);
    assert_eq!(store.trim(&key, TrimBound::MaxLen(2)).await?, 2);
    assert_eq!(
        entry_ids(&all_entries(store, &key).await?),
        appended[4..].to_vec()
    );
    assert_eq!(store.trim(&key, TrimBound::MaxLen(10)).await?, 0);
    assert_eq!(store.trim(&key, TrimBound::MaxLen(2)).await?, 0);
    assert_eq!(
        entry_ids(&all_entries(store, &key).await?),
        appended[4..].to_vec()
    );
    let nowhere = super::helpers::key("trim-nowhere")?;
    assert_eq!(store.trim(&nowhere, TrimBound::MaxLen(0)).await?, 0);
    Ok(())
}

/// What is appended comes back exactly, through a range and a group read:
/// nested JSON, unicode and escapes, an empty object, an array; headers
/// (unicode, empty values, none); the origin or its absence.
pub async fn payloads_headers_and_origins_round_trip<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("round-trip")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let mut nested = NewStreamEntry::new(json!({
        "order": {"id": 42, "lines": [{"sku": "a-1", "qty": 2, "price": 9.5}, {"sku": "b", "gift": true}]},
        "note": null,
        "tags": [],
        "depth": {"a": {"b": {"c": {"d": [1, [2, [3]]]}}}}
    }));
    nested.headers.insert("trace-id".into(), "abc-123".into());
    nested.headers.insert("empty".into(), String::new());
    let mut unicode = NewStreamEntry::new(json!({
        "text": "héllo wörld ✓ 日本語 🎉",
        "escapes": "quote \" backslash \\ newline \n tab \t",
        "ключ": "значение"
    }));
    unicode
        .headers
        .insert("ünïcödé-kéy".into(), "välue ✓ 🎉".into());
    unicode.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: "tenant-7".into(),
        topic: "orders.created".into(),
        schema_version: 3,
    });
    let empty = NewStreamEntry::new(json!({}));
    let array = NewStreamEntry::new(json!([1, "two", {"three": 3}]));
    // PostgreSQL's jsonb writes the largest doubles out in full (309
    // digits): they must read back as the same numbers.
    let extremes = NewStreamEntry::new(json!({
        "max": f64::MAX, "lowest": f64::MIN, "tiny": 5e-324, "big": 1e300,
        "u64": u64::MAX, "i64": i64::MIN
    }));
    let written = vec![nested, unicode, empty, array, extremes];

    let appended = store.append(&key, &written).await?;
    let expected: Vec<StreamEntry> = written
        .iter()
        .zip(&appended)
        .map(|(new, id)| StreamEntry {
            id: *id,
            payload: new.payload.clone(),
            headers: new.headers.clone(),
            origin: new.origin.clone(),
        })
        .collect();
    assert_eq!(all_entries(store, &key).await?, expected, "through a range");
    let read = read_new(store, &key, "g", "c1", 10).await?;
    let delivered: Vec<StreamEntry> = read.into_iter().map(|d| d.entry).collect();
    assert_eq!(delivered, expected, "through a group read");
    Ok(())
}
