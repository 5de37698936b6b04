//! What the Redis store does on a real server: its encoding and foreign
//! entries, its scripts' atomicity, Redis's own consumer-group behaviours
//! (BUSYGROUP, NOGROUP, history reads, XAUTOCLAIM's cursor and trimmed ids),
//! its dedicated connections for blocking reads, and its errors when the
//! server is down or stalls. The backend-independent promises of
//! `StreamStore` are the testkit's conformance suite's.
//!
//! Each test works under a key prefix of its own (`t_{uuid}:`) and deletes
//! its keys at the end, so the tests run in parallel on one server
//! (`REDIS_URL`, default `redis://127.0.0.1:6379`).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use courier_core::{
    ClaimIdle, ConsumerRemoval, DeliveredEntry, EntryOrigin, GroupStart, NewStreamEntry,
    PendingEntry, PendingQuery, ReadNew, StoreError, StreamEntryId, StreamKey, StreamStore,
    TrimBound,
};
use courier_redis::redis::{self, FromRedisValue, Value};
use courier_redis::{RedisConfig, RedisStreamStore};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

const GROUP: &str = "billing";
const LAST_ID: StreamEntryId = StreamEntryId::new(u64::MAX, u64::MAX);

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A store under a fresh key prefix; [`Fixture::cleanup`] deletes its keys.
struct Fixture {
    store: RedisStreamStore,
    key: StreamKey,
}

async fn fixture() -> TestResult<Fixture> {
    let prefix = format!("t_{}:", Uuid::new_v4().simple());
    Ok(Fixture {
        store: RedisStreamStore::connect(&url(), &prefix).await?,
        key: StreamKey::new("acme", "orders")?,
    })
}

impl Fixture {
    fn redis_key(&self) -> String {
        self.store.redis_key(&self.key)
    }

    async fn raw<T: FromRedisValue>(&self, command: &redis::Cmd) -> TestResult<T> {
        Ok(command.query_async(&mut self.store.connection()).await?)
    }

    /// Appends `n` entries `{"n": i}` and returns their ids.
    async fn append_n(&self, n: usize) -> TestResult<Vec<StreamEntryId>> {
        let entries: Vec<_> = (0..n)
            .map(|i| NewStreamEntry::new(json!({"n": i})))
            .collect();
        Ok(self.store.append(&self.key, &entries).await?)
    }

    async fn read(&self, consumer: &str, count: usize) -> TestResult<Vec<DeliveredEntry>> {
        Ok(self
            .store
            .read_new(&self.key, &read_new(consumer, count, None))
            .await?)
    }

    /// Makes `id`'s pending entry look idle for `idle` without counting a
    /// delivery (`XCLAIM ... IDLE ... JUSTID` to its own consumer).
    async fn make_idle(&self, consumer: &str, id: StreamEntryId, idle: Duration) -> TestResult {
        let mut command = redis::cmd("XCLAIM");
        command
            .arg(self.redis_key())
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(id.to_string())
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID");
        self.raw::<Value>(&command).await?;
        Ok(())
    }

    async fn xlen(&self, key: &str) -> TestResult<u64> {
        self.raw(redis::cmd("XLEN").arg(key)).await
    }

    async fn cleanup(self) -> TestResult {
        let pattern = format!("{}*", self.store.key_prefix());
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .raw(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            if !keys.is_empty() {
                self.raw::<i64>(redis::cmd("DEL").arg(keys)).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

fn read_new(consumer: &str, count: usize, block: Option<Duration>) -> ReadNew {
    ReadNew {
        group: GROUP.to_owned(),
        consumer: consumer.to_owned(),
        count,
        block,
    }
}

fn claim(consumer: &str, min_idle: Duration, cursor: StreamEntryId, count: usize) -> ClaimIdle {
    ClaimIdle {
        group: GROUP.to_owned(),
        consumer: consumer.to_owned(),
        min_idle,
        cursor,
        count,
    }
}

fn all_pending(count: usize) -> PendingQuery {
    PendingQuery {
        after: StreamEntryId::ZERO,
        count,
        consumer: None,
        min_idle: None,
    }
}

fn invalid_field<T: Debug>(result: Result<T, StoreError>) -> &'static str {
    match result {
        Err(StoreError::Invalid(error)) => error.field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn assert_not_found<T: Debug>(result: Result<T, StoreError>, operation: &str) {
    match result {
        Err(StoreError::NotFound { what }) => {
            assert!(what.contains(GROUP), "{operation}: {what}")
        }
        other => panic!("{operation}: expected NotFound, got {other:?}"),
    }
}

fn assert_transient<T: Debug>(result: Result<T, StoreError>, what: &str) {
    match result {
        Err(error) => assert!(error.is_transient(), "{what}: not transient: {error}"),
        Ok(value) => panic!("{what}: expected an error, got {value:?}"),
    }
}

fn present(entries: &[PendingEntry]) -> Vec<(StreamEntryId, u64)> {
    entries
        .iter()
        .filter_map(|entry| match entry {
            PendingEntry::Present(delivered) => Some((delivered.entry.id, delivered.deliveries)),
            PendingEntry::Deleted(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn appended_entries_are_stored_as_documented_fields_and_read_back_as_written() -> TestResult {
    let f = fixture().await?;
    let plain = NewStreamEntry::new(json!({"n": 1, "nested": [true, null]}));
    let mut relayed = NewStreamEntry::new(json!("text"));
    relayed.headers.insert("trace".into(), "abc".into());
    relayed.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: "acme".into(),
        topic: "invoice.paid".into(),
        schema_version: 2,
    });
    let ids = f
        .store
        .append(&f.key, &[plain.clone(), relayed.clone()])
        .await?;
    assert!(ids[0] < ids[1]);
    assert_eq!(
        f.redis_key(),
        format!("{}acme:orders", f.store.key_prefix())
    );

    let raw: Vec<(String, Vec<String>)> = f
        .raw(redis::cmd("XRANGE").arg(f.redis_key()).arg("-").arg("+"))
        .await?;
    assert_eq!(raw[0].1, ["payload", r#"{"n":1,"nested":[true,null]}"#]);
    let origin = relayed.origin.clone().ok_or("origin")?;
    assert_eq!(
        raw[1].1,
        [
            "payload".to_owned(),
            r#""text""#.to_owned(),
            "headers".to_owned(),
            r#"{"trace":"abc"}"#.to_owned(),
            "message_id".to_owned(),
            origin.message_id.to_string(),
            "tenant".to_owned(),
            "acme".to_owned(),
            "topic".to_owned(),
            "invoice.paid".to_owned(),
            "schema_version".to_owned(),
            "2".to_owned(),
        ]
    );

    let back = f.store.range(&f.key, StreamEntryId::ZERO, 10).await?;
    assert_eq!(back.len(), 2);
    for (entry, written) in back.iter().zip([&plain, &relayed]) {
        assert_eq!(
            (&entry.payload, &entry.headers, &entry.origin),
            (&written.payload, &written.headers, &written.origin)
        );
    }
    let later = f.append_n(1).await?;
    assert!(later[0] > ids[1], "ids keep increasing");
    f.cleanup().await
}

#[tokio::test]
async fn an_empty_or_invalid_batch_is_refused_before_anything_is_written() -> TestResult {
    let f = fixture().await?;
    assert_eq!(invalid_field(f.store.append(&f.key, &[]).await), "entries");
    let big = NewStreamEntry::new(json!("x".repeat(courier_core::MAX_PAYLOAD_BYTES)));
    let ok = NewStreamEntry::new(json!(1));
    assert_eq!(
        invalid_field(f.store.append(&f.key, &[ok.clone(), big]).await),
        "payload"
    );
    let mut crowded = NewStreamEntry::new(json!(1));
    for i in 0..=courier_core::MAX_HEADERS {
        crowded.headers.insert(format!("h{i}"), String::new());
    }
    assert_eq!(
        invalid_field(f.store.append(&f.key, &[ok, crowded]).await),
        "headers"
    );
    let exists: i64 = f.raw(redis::cmd("EXISTS").arg(f.redis_key())).await?;
    assert_eq!(exists, 0, "nothing was written");
    f.cleanup().await
}

#[tokio::test]
async fn a_batch_whose_second_entry_fails_leaves_the_stream_as_it_was() -> TestResult {
    let f = fixture().await?;
    let first = f.append_n(1).await?;
    // One id is left after this: the batch's first XADD takes it and the
    // second fails ("the stream has exhausted the last possible ID").
    f.raw::<()>(redis::cmd("XSETID").arg(f.redis_key()).arg(format!(
        "{}-{}",
        u64::MAX,
        u64::MAX - 1
    )))
    .await?;
    let failed = f
        .store
        .append(
            &f.key,
            &[NewStreamEntry::new(json!(1)), NewStreamEntry::new(json!(2))],
        )
        .await;
    match &failed {
        Err(StoreError::Database { transient, .. }) => assert!(!transient),
        other => panic!("expected a database error, got {other:?}"),
    }
    assert_eq!(
        f.xlen(&f.redis_key()).await?,
        1,
        "the first XADD was undone"
    );
    let ids: Vec<_> = f
        .store
        .range(&f.key, StreamEntryId::ZERO, 10)
        .await?
        .into_iter()
        .map(|entry| entry.id)
        .collect();
    assert_eq!(ids, first);
    // The undone entry's id is not reused: the stream stays at its last id.
    assert!(f.append_n(1).await.is_err());
    assert_eq!(f.xlen(&f.redis_key()).await?, 1);

    // A key of another type is refused without being touched.
    let other = StreamKey::new("acme", "not-a-stream")?;
    f.raw::<()>(redis::cmd("SET").arg(f.store.redis_key(&other)).arg("keep"))
        .await?;
    assert!(f
        .store
        .append(&other, &[NewStreamEntry::new(json!(1))])
        .await
        .is_err());
    let kept: String = f
        .raw(redis::cmd("GET").arg(f.store.redis_key(&other)))
        .await?;
    assert_eq!(kept, "keep");
    f.cleanup().await
}

#[tokio::test]
async fn foreign_entries_read_as_objects_of_their_fields() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let foreign: [&[&[u8]]; 5] = [
        &[b"sensor", b"12", b"unit", b"C"],
        &[b"payload", b"not json"],
        &[b"payload", b"1", b"extra", b"x"],
        &[b"payload", b"1", b"headers", b"[1,2]"],
        &[b"bin\xff", b"\x00\xfe"],
    ];
    for fields in foreign {
        let mut command = redis::cmd("XADD");
        command.arg(f.redis_key()).arg("*");
        for field in fields {
            command.arg(*field);
        }
        f.raw::<String>(&command).await?;
    }
    let expected = [
        json!({"sensor": "12", "unit": "C"}),
        json!({"payload": "not json"}),
        json!({"payload": "1", "extra": "x"}),
        json!({"payload": "1", "headers": "[1,2]"}),
        json!({"bin\u{fffd}": "\u{0}\u{fffd}"}),
    ];
    let ranged = f.store.range(&f.key, StreamEntryId::ZERO, 10).await?;
    let read = f.read("c1", 10).await?;
    assert_eq!(ranged.len(), 5);
    assert_eq!(read.len(), 5);
    for ((entry, delivered), payload) in ranged.iter().zip(&read).zip(&expected) {
        assert_eq!(&entry.payload, payload);
        assert!(entry.headers.is_empty() && entry.origin.is_none());
        assert_eq!(&delivered.entry, entry);
    }
    let pending = f
        .store
        .read_pending(&f.key, GROUP, "c1", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(pending.len(), 5);
    f.cleanup().await
}

#[tokio::test]
async fn ensuring_a_group_again_returns_false_and_does_not_move_it() -> TestResult {
    let f = fixture().await?;
    assert!(
        f.store.ensure_group(&f.key, GROUP, GroupStart::End).await?,
        "created, with its stream (MKSTREAM)"
    );
    let exists: i64 = f.raw(redis::cmd("EXISTS").arg(f.redis_key())).await?;
    assert_eq!(exists, 1);
    let ids = f.append_n(3).await?;
    let first = f.read("c1", 1).await?;
    assert_eq!(first[0].entry.id, ids[0]);

    assert!(
        !f.store
            .ensure_group(&f.key, GROUP, GroupStart::Beginning)
            .await?
    );
    let next = f.read("c1", 10).await?;
    assert_eq!(
        next.iter().map(|e| e.entry.id).collect::<Vec<_>>(),
        ids[1..],
        "BUSYGROUP left the group where it was"
    );
    assert_eq!(f.store.pending_summary(&f.key, GROUP).await?.count, 3);

    // The other starts.
    for (group, start, expected) in [
        ("from-start", GroupStart::Beginning, &ids[..]),
        ("after-first", GroupStart::After(ids[0]), &ids[1..]),
        ("at-end", GroupStart::End, &ids[..0]),
    ] {
        assert!(f.store.ensure_group(&f.key, group, start).await?);
        let read = ReadNew {
            group: group.to_owned(),
            ..read_new("c1", 10, None)
        };
        let got: Vec<_> = f
            .store
            .read_new(&f.key, &read)
            .await?
            .into_iter()
            .map(|e| e.entry.id)
            .collect();
        assert_eq!(got, expected, "{group}");
    }
    f.cleanup().await
}

#[tokio::test]
async fn every_operation_on_a_missing_group_is_not_found() -> TestResult {
    let f = fixture().await?;
    let missing_stream = f.key.clone();
    let other_group = StreamKey::new("acme", "with-other-group")?;
    f.store
        .ensure_group(&other_group, "other", GroupStart::Beginning)
        .await?;
    f.store
        .append(&other_group, &[NewStreamEntry::new(json!(1))])
        .await?;
    let entry = f.store.range(&other_group, StreamEntryId::ZERO, 1).await?;
    let entry = DeliveredEntry {
        entry: entry.into_iter().next().ok_or("no entry")?,
        deliveries: 1,
    };
    for key in [&missing_stream, &other_group] {
        let s = &f.store;
        assert_not_found(s.read_new(key, &read_new("c", 1, None)).await, "read_new");
        assert_not_found(
            s.read_new(key, &read_new("c", 1, Some(Duration::from_millis(50))))
                .await,
            "blocking read_new",
        );
        assert_not_found(
            s.read_pending(key, GROUP, "c", StreamEntryId::ZERO, 1)
                .await,
            "read_pending",
        );
        assert_not_found(
            s.claim_idle(key, &claim("c", Duration::ZERO, StreamEntryId::ZERO, 1))
                .await,
            "claim_idle",
        );
        assert_not_found(s.ack(key, GROUP, &[entry.entry.id]).await, "ack");
        assert_not_found(s.pending_summary(key, GROUP).await, "pending_summary");
        assert_not_found(
            s.pending_detail(key, GROUP, &all_pending(1)).await,
            "pending_detail",
        );
        assert_not_found(
            s.pending_detail(
                key,
                GROUP,
                &PendingQuery {
                    after: LAST_ID,
                    ..all_pending(1)
                },
            )
            .await,
            "pending_detail after the last id",
        );
        assert_not_found(s.consumers(key, GROUP).await, "consumers");
        assert_not_found(s.delete_consumer(key, GROUP, "c").await, "delete_consumer");
        assert_not_found(s.dead_letter(key, GROUP, &entry, &[]).await, "dead_letter");
    }
    let dead = f.store.redis_key(&other_group.dead_letters()?);
    let exists: i64 = f.raw(redis::cmd("EXISTS").arg(dead)).await?;
    assert_eq!(exists, 0, "no dead letter was written");
    f.cleanup().await
}

#[tokio::test]
async fn a_history_read_counts_a_delivery_refreshes_it_and_reports_trimmed_entries_deleted(
) -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(4).await?;
    let read = f.read("c1", 3).await?;
    assert!(read.iter().all(|e| e.deliveries == 1));
    f.read("c2", 1).await?; // ids[3], someone else's
    for id in &ids[..3] {
        f.make_idle("c1", *id, Duration::from_secs(60)).await?;
    }
    assert_eq!(f.store.trim(&f.key, TrimBound::MinId(ids[1])).await?, 1);

    let again = f
        .store
        .read_pending(&f.key, GROUP, "c1", StreamEntryId::ZERO, 10)
        .await?;
    assert_eq!(again.len(), 3, "only c1's own entries");
    assert_eq!(again[0], PendingEntry::Deleted(ids[0]));
    assert_eq!(present(&again), [(ids[1], 2), (ids[2], 2)]);
    if let PendingEntry::Present(delivered) = &again[1] {
        assert_eq!(delivered.entry.payload, json!({"n": 1}));
    }

    // Redis counted and refreshed the entries still there, not the trimmed one.
    let detail = f
        .store
        .pending_detail(&f.key, GROUP, &all_pending(10))
        .await?;
    let by_id: BTreeMap<_, _> = detail.iter().map(|d| (d.id, d)).collect();
    assert_eq!(by_id[&ids[0]].deliveries, 1);
    assert!(by_id[&ids[0]].idle >= Duration::from_secs(60));
    assert_eq!(by_id[&ids[1]].deliveries, 2);
    assert!(by_id[&ids[1]].idle < Duration::from_secs(30), "refreshed");
    assert_eq!(by_id[&ids[3]].deliveries, 1, "c2's entry untouched");

    let third = f
        .store
        .read_pending(&f.key, GROUP, "c1", ids[1], 10)
        .await?;
    assert_eq!(present(&third), [(ids[2], 3)], "after is exclusive");
    let first_only = f
        .store
        .read_pending(&f.key, GROUP, "c1", StreamEntryId::ZERO, 1)
        .await?;
    assert_eq!(first_only, [PendingEntry::Deleted(ids[0])]);
    f.cleanup().await
}

#[tokio::test]
async fn a_claim_reports_trimmed_ids_and_drops_them_from_pending() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(3).await?;
    f.read("c1", 3).await?;
    for id in &ids {
        f.make_idle("c1", *id, Duration::from_secs(60)).await?;
    }
    assert_eq!(f.store.trim(&f.key, TrimBound::MaxLen(2)).await?, 1);

    let claimed = f
        .store
        .claim_idle(
            &f.key,
            &claim("c2", Duration::from_secs(30), StreamEntryId::ZERO, 10),
        )
        .await?;
    assert_eq!(claimed.deleted, [ids[0]]);
    assert_eq!(
        claimed
            .entries
            .iter()
            .map(|e| (e.entry.id, e.deliveries))
            .collect::<Vec<_>>(),
        [(ids[1], 2), (ids[2], 2)],
        "the claim counted a delivery"
    );
    assert_eq!(claimed.entries[0].entry.payload, json!({"n": 1}));
    assert_eq!(
        claimed.next,
        StreamEntryId::ZERO,
        "the scan reached the end"
    );

    let summary = f.store.pending_summary(&f.key, GROUP).await?;
    assert_eq!(summary.count, 2, "the trimmed id left pending");
    assert_eq!(summary.lowest, Some(ids[1]));
    assert_eq!(summary.consumers, BTreeMap::from([("c2".to_owned(), 2)]));
    f.cleanup().await
}

#[tokio::test]
async fn a_claim_takes_only_entries_idle_long_enough() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(2).await?;
    f.read("c1", 2).await?;
    f.make_idle("c1", ids[0], Duration::from_secs(60)).await?;
    let idle = claim("c2", Duration::from_secs(30), StreamEntryId::ZERO, 10);

    let claimed = f.store.claim_idle(&f.key, &idle).await?;
    assert_eq!(claimed.entries.len(), 1);
    assert_eq!(claimed.entries[0].entry.id, ids[0]);
    assert_eq!(claimed.entries[0].deliveries, 2);
    assert!(claimed.deleted.is_empty());

    let detail = f
        .store
        .pending_detail(&f.key, GROUP, &all_pending(10))
        .await?;
    assert_eq!(detail[0].consumer, "c2");
    assert!(
        detail[0].idle < Duration::from_secs(30),
        "the claim refreshed it"
    );
    assert_eq!(detail[1].consumer, "c1");
    assert!(f.store.claim_idle(&f.key, &idle).await?.entries.is_empty());
    f.cleanup().await
}

#[tokio::test]
async fn claims_reach_idle_entries_behind_many_busy_ones_by_following_the_cursor() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(30).await?;
    f.read("c1", 30).await?;
    // 25 busy entries, then 5 idle ones: more than 10 x count busy ones
    // come before the first idle one.
    for id in &ids[25..] {
        f.make_idle("c1", *id, Duration::from_secs(60)).await?;
    }
    let mut cursor = StreamEntryId::ZERO;
    let mut calls = Vec::new();
    loop {
        let claimed = f
            .store
            .claim_idle(&f.key, &claim("c2", Duration::from_secs(30), cursor, 2))
            .await?;
        calls.push(
            claimed
                .entries
                .iter()
                .map(|e| e.entry.id)
                .collect::<Vec<_>>(),
        );
        cursor = claimed.next;
        if cursor == StreamEntryId::ZERO {
            break;
        }
        assert!(calls.len() < 20, "the cursor must come back to 0-0");
    }
    assert!(
        calls[0].is_empty(),
        "one call scans at most 20 entries, all busy"
    );
    assert_eq!(calls.concat(), ids[25..]);
    f.cleanup().await
}

#[tokio::test]
async fn ack_counts_only_ids_that_were_pending() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(3).await?;
    f.read("c1", 2).await?;
    let unknown = StreamEntryId::new(1, 1);
    assert_eq!(
        f.store
            .ack(&f.key, GROUP, &[ids[0], ids[0], ids[2], unknown])
            .await?,
        1
    );
    assert_eq!(f.store.ack(&f.key, GROUP, &[ids[0]]).await?, 0);
    assert_eq!(f.store.pending_summary(&f.key, GROUP).await?.count, 1);
    assert_eq!(invalid_field(f.store.ack(&f.key, GROUP, &[]).await), "ids");

    // Many ids at once (the script acks in chunks).
    let many = f.append_n(2_500).await?;
    f.read("c1", 2_501).await?; // ids[2] and the 2,500
    assert_eq!(f.store.ack(&f.key, GROUP, &many).await?, 2_500);
    f.cleanup().await
}

#[tokio::test]
async fn pending_summary_and_detail_page_and_filter_like_xpending() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let empty = f.store.pending_summary(&f.key, GROUP).await?;
    assert_eq!((empty.count, empty.lowest, empty.highest), (0, None, None));
    assert!(empty.consumers.is_empty());

    let ids = f.append_n(3).await?;
    f.read("a", 2).await?;
    f.read("b", 1).await?;
    f.read("idle-reader", 1).await?; // nothing left: a consumer with none
    let summary = f.store.pending_summary(&f.key, GROUP).await?;
    assert_eq!(summary.count, 3);
    assert_eq!(
        (summary.lowest, summary.highest),
        (Some(ids[0]), Some(ids[2]))
    );
    assert_eq!(
        summary.consumers,
        BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)])
    );

    let detail = f
        .store
        .pending_detail(&f.key, GROUP, &all_pending(10))
        .await?;
    assert_eq!(
        detail
            .iter()
            .map(|d| (d.id, d.consumer.as_str(), d.deliveries))
            .collect::<Vec<_>>(),
        [(ids[0], "a", 1), (ids[1], "a", 1), (ids[2], "b", 1)]
    );
    let page = |query: PendingQuery| {
        let store = f.store.clone();
        let key = f.key.clone();
        async move {
            let rows = store.pending_detail(&key, GROUP, &query).await?;
            Ok::<_, StoreError>(rows.into_iter().map(|d| d.id).collect::<Vec<_>>())
        }
    };
    assert_eq!(
        page(PendingQuery {
            after: ids[0],
            ..all_pending(10)
        })
        .await?,
        ids[1..]
    );
    assert_eq!(page(all_pending(1)).await?, ids[..1]);
    assert_eq!(
        page(PendingQuery {
            consumer: Some("b".into()),
            ..all_pending(10)
        })
        .await?,
        ids[2..]
    );
    f.make_idle("a", ids[1], Duration::from_secs(60)).await?;
    assert_eq!(
        page(PendingQuery {
            min_idle: Some(Duration::from_secs(30)),
            ..all_pending(10)
        })
        .await?,
        ids[1..2]
    );
    assert!(page(PendingQuery {
        after: LAST_ID,
        ..all_pending(10)
    })
    .await?
    .is_empty());
    f.cleanup().await
}

#[tokio::test]
async fn consumers_are_listed_by_name_with_pending_counts_and_idle_times() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    f.append_n(2).await?;
    f.read("zed", 2).await?;
    f.read("amy", 2).await?; // nothing left, but Amy now exists
    let consumers = f.store.consumers(&f.key, GROUP).await?;
    assert_eq!(
        consumers
            .iter()
            .map(|c| (c.name.as_str(), c.pending))
            .collect::<Vec<_>>(),
        [("amy", 0), ("zed", 2)]
    );
    assert!(consumers.iter().all(|c| c.idle < Duration::from_secs(10)));
    f.cleanup().await
}

#[tokio::test]
async fn deleting_a_consumer_with_pending_entries_is_refused_and_keeps_them_pending() -> TestResult
{
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(2).await?;
    f.read("busy", 2).await?;
    f.read("done", 1).await?;

    assert_eq!(
        f.store.delete_consumer(&f.key, GROUP, "busy").await?,
        ConsumerRemoval::HasPending(2)
    );
    let summary = f.store.pending_summary(&f.key, GROUP).await?;
    assert_eq!(summary.consumers, BTreeMap::from([("busy".to_owned(), 2)]));

    assert_eq!(
        f.store.delete_consumer(&f.key, GROUP, "done").await?,
        ConsumerRemoval::Deleted
    );
    assert_eq!(
        f.store.delete_consumer(&f.key, GROUP, "done").await?,
        ConsumerRemoval::NotFound
    );
    assert_eq!(
        f.store.delete_consumer(&f.key, GROUP, "never").await?,
        ConsumerRemoval::NotFound
    );
    let names: Vec<_> = f
        .store
        .consumers(&f.key, GROUP)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["busy"]);

    f.store.ack(&f.key, GROUP, &ids).await?;
    assert_eq!(
        f.store.delete_consumer(&f.key, GROUP, "busy").await?,
        ConsumerRemoval::Deleted
    );
    f.cleanup().await
}

#[tokio::test]
async fn range_reads_above_an_id_and_makes_nothing_pending() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let ids = f.append_n(5).await?;
    let page = |after, count| {
        let store = f.store.clone();
        let key = f.key.clone();
        async move {
            let entries = store.range(&key, after, count).await?;
            Ok::<_, StoreError>(entries.into_iter().map(|e| e.id).collect::<Vec<_>>())
        }
    };
    assert_eq!(page(StreamEntryId::ZERO, 2).await?, ids[..2]);
    assert_eq!(page(ids[1], 10).await?, ids[2..]);
    assert!(page(ids[4], 10).await?.is_empty());
    assert!(page(LAST_ID, 10).await?.is_empty());
    let missing = StreamKey::new("acme", "missing")?;
    assert!(f
        .store
        .range(&missing, StreamEntryId::ZERO, 10)
        .await?
        .is_empty());
    assert_eq!(
        invalid_field(f.store.range(&f.key, StreamEntryId::ZERO, 0).await),
        "count"
    );
    assert_eq!(f.store.pending_summary(&f.key, GROUP).await?.count, 0);
    f.cleanup().await
}

#[tokio::test]
async fn trims_are_exact() -> TestResult {
    let f = fixture().await?;
    let ids = f.append_n(10).await?;
    assert_eq!(f.store.trim(&f.key, TrimBound::MaxLen(7)).await?, 3);
    assert_eq!(f.xlen(&f.redis_key()).await?, 7);
    assert_eq!(f.store.trim(&f.key, TrimBound::MinId(ids[5])).await?, 2);
    let left = f.store.range(&f.key, StreamEntryId::ZERO, 10).await?;
    assert_eq!(left[0].id, ids[5]);
    assert_eq!(f.store.trim(&f.key, TrimBound::MaxLen(u64::MAX)).await?, 0);
    assert_eq!(f.store.trim(&f.key, TrimBound::MaxLen(0)).await?, 5);
    let missing = StreamKey::new("acme", "missing")?;
    assert_eq!(f.store.trim(&missing, TrimBound::MaxLen(0)).await?, 0);
    f.cleanup().await
}

/// Whether a dedicated connection of `store` is blocked in Redis now.
async fn blocked_read(f: &Fixture) -> TestResult<bool> {
    let name = format!("name=courier-read:{}", f.store.key_prefix());
    let clients: String = f.raw(redis::cmd("CLIENT").arg("LIST")).await?;
    Ok(clients.lines().any(|line| {
        let fields: Vec<_> = line.split(' ').collect();
        fields.contains(&name.as_str())
            && fields.iter().any(|field| {
                field
                    .strip_prefix("flags=")
                    .is_some_and(|flags| flags.contains('b'))
            })
    }))
}

async fn wait_until_blocked(f: &Fixture) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !blocked_read(f).await? {
        if Instant::now() > deadline {
            return Err("the blocking read never blocked in Redis".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_blocking_read_waits_on_its_own_connection_and_returns_when_an_entry_arrives(
) -> TestResult {
    let f = fixture().await?;
    let earlier = f.append_n(1).await?; // before the group's start: never read
    f.store.ensure_group(&f.key, GROUP, GroupStart::End).await?;
    let block = Duration::from_secs(10);
    let reader = {
        let store = f.store.clone();
        let key = f.key.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let read = store.read_new(&key, &read_new("c1", 10, Some(block))).await;
            (read, started.elapsed())
        })
    };
    wait_until_blocked(&f).await?;

    // Meanwhile the shared connection serves everyone else at once.
    let started = Instant::now();
    f.store.ping().await?;
    assert_eq!(f.store.ack(&f.key, GROUP, &earlier).await?, 0);
    assert_eq!(f.store.pending_summary(&f.key, GROUP).await?.count, 0);
    let other_commands = started.elapsed();
    assert!(
        other_commands < Duration::from_secs(1),
        "commands waited {other_commands:?} behind the blocking read"
    );
    assert!(blocked_read(&f).await?, "still blocked meanwhile");

    let appended = Instant::now();
    let ids = f.append_n(1).await?;
    let (read, took) = tokio::time::timeout(Duration::from_secs(5), reader).await??;
    let read = read?;
    assert!(
        appended.elapsed() < Duration::from_secs(2),
        "returned {:?} after the append",
        appended.elapsed()
    );
    assert!(took < block, "returned before its block ended ({took:?})");
    assert_eq!(read.len(), 1);
    assert_eq!((read[0].entry.id, read[0].deliveries), (ids[0], 1));
    assert_eq!(
        f.store.idle_blocking_connections(),
        1,
        "kept for the next read"
    );
    f.cleanup().await
}

#[tokio::test]
async fn a_blocking_read_with_nothing_to_read_returns_empty_when_its_block_ends() -> TestResult {
    let f = fixture().await?;
    f.store.ensure_group(&f.key, GROUP, GroupStart::End).await?;
    let started = Instant::now();
    let read = f
        .store
        .read_new(&f.key, &read_new("c1", 1, Some(Duration::from_millis(200))))
        .await?;
    let took = started.elapsed();
    assert!(read.is_empty());
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // A zero block reads without blocking (BLOCK 0 would wait forever).
    let started = Instant::now();
    let read = f
        .store
        .read_new(&f.key, &read_new("c1", 1, Some(Duration::ZERO)))
        .await?;
    assert!(read.is_empty());
    assert!(started.elapsed() < Duration::from_secs(1));
    f.cleanup().await
}

#[tokio::test]
async fn concurrent_blocking_reads_each_take_a_connection_and_share_the_entries() -> TestResult {
    let f = fixture().await?;
    f.store.ensure_group(&f.key, GROUP, GroupStart::End).await?;
    let readers: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|consumer| {
            let store = f.store.clone();
            let key = f.key.clone();
            tokio::spawn(async move {
                store
                    .read_new(&key, &read_new(consumer, 1, Some(Duration::from_secs(10))))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clients: String = f.raw(redis::cmd("CLIENT").arg("LIST")).await?;
        let name = format!("name=courier-read:{}", f.store.key_prefix());
        let blocked = clients
            .lines()
            .filter(|line| line.split(' ').any(|field| field == name) && line.contains(" flags=b "))
            .count();
        if blocked == 2 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{blocked} of 2 reads blocked").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ids = f.append_n(2).await?;
    let mut got = Vec::new();
    for reader in readers {
        let read = tokio::time::timeout(Duration::from_secs(5), reader).await???;
        got.extend(read.into_iter().map(|e| e.entry.id));
    }
    got.sort();
    assert_eq!(got, ids, "each entry went to one reader");
    f.cleanup().await
}

#[tokio::test]
async fn a_dead_letter_appends_to_the_dead_stream_and_acks_in_one_step() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    let mut entry = NewStreamEntry::new(json!({"order": 7}));
    entry.headers.insert("trace".into(), "abc".into());
    entry.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: "acme".into(),
        topic: "order.placed".into(),
        schema_version: 1,
    });
    let ids = f.store.append(&f.key, &[entry.clone()]).await?;
    let delivered = f
        .read("c1", 1)
        .await?
        .into_iter()
        .next()
        .ok_or("no entry")?;
    let errors = ["boom".to_owned(), "bang".to_owned()];

    assert!(
        f.store
            .dead_letter(&f.key, GROUP, &delivered, &errors)
            .await?
    );
    let dead_key = f.key.dead_letters()?;
    assert_eq!(
        f.store.redis_key(&dead_key),
        format!("{}acme:orders.dead", f.store.key_prefix())
    );
    let dead = f.store.range(&dead_key, StreamEntryId::ZERO, 10).await?;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, entry.payload);
    assert_eq!(dead[0].origin, entry.origin);
    let mut headers = entry.headers.clone();
    headers.extend([
        ("courier-original-id".to_owned(), ids[0].to_string()),
        ("courier-original-stream".to_owned(), "orders".to_owned()),
        ("courier-deliveries".to_owned(), "1".to_owned()),
        ("courier-errors".to_owned(), r#"["boom","bang"]"#.to_owned()),
    ]);
    assert_eq!(dead[0].headers, headers);
    assert_eq!(
        f.store.pending_summary(&f.key, GROUP).await?.count,
        0,
        "acked"
    );

    assert!(
        !f.store
            .dead_letter(&f.key, GROUP, &delivered, &errors)
            .await?
    );
    assert_eq!(
        f.xlen(&f.store.redis_key(&dead_key)).await?,
        1,
        "the second dead letter appended nothing"
    );
    f.cleanup().await
}

#[tokio::test]
async fn a_dead_letter_that_cannot_be_appended_leaves_the_entry_pending() -> TestResult {
    let f = fixture().await?;
    f.store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    f.append_n(1).await?;
    let delivered = f
        .read("c1", 1)
        .await?
        .into_iter()
        .next()
        .ok_or("no entry")?;
    let dead_key = f.store.redis_key(&f.key.dead_letters()?);
    f.raw::<()>(redis::cmd("SET").arg(&dead_key).arg("in the way"))
        .await?;

    assert!(f
        .store
        .dead_letter(&f.key, GROUP, &delivered, &[])
        .await
        .is_err());
    let summary = f.store.pending_summary(&f.key, GROUP).await?;
    assert_eq!(summary.count, 1, "not acked either");
    f.cleanup().await
}

#[tokio::test]
async fn a_server_that_is_down_gives_a_transient_error_promptly() -> TestResult {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let mut config = RedisConfig::new("t_down:");
    config.connection_timeout = Duration::from_secs(1);
    config.reconnect_retries = 1;
    let started = Instant::now();
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        RedisStreamStore::connect_with(&format!("redis://127.0.0.1:{port}"), config),
    )
    .await?;
    assert_transient(connected, "connecting to a closed port");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_with_a_transient_error() -> TestResult {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    // Accepts connections and never answers.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut config = RedisConfig::new("t_silent:");
    config.connection_timeout = Duration::from_millis(300);
    config.reconnect_retries = 0;
    let started = Instant::now();
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        RedisStreamStore::connect_with(&format!("redis://{address}"), config),
    )
    .await?;
    assert_transient(connected, "connecting to a silent server");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    silent.abort();
    Ok(())
}

/// A TCP proxy to Redis whose client-to-server direction can be stalled,
/// for its first connection (the store's shared one) and for the others (its
/// dedicated ones) apart: bytes sent while stalled are held back, not lost,
/// as in a network stall.
struct StallableProxy {
    url: String,
    shared: watch::Sender<bool>,
    dedicated: watch::Sender<bool>,
}

async fn stallable_proxy() -> TestResult<StallableProxy> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let upstream_address = url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let (shared, shared_stalled) = watch::channel(false);
    let (dedicated, dedicated_stalled) = watch::channel(false);
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream_address).await else {
                return;
            };
            let mut stalled = if first {
                shared_stalled.clone()
            } else {
                dedicated_stalled.clone()
            };
            first = false;
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buffer).await {
                    if n == 0 || stalled.wait_for(|s| !*s).await.is_err() {
                        return;
                    }
                    if server_write.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
        }
    });
    Ok(StallableProxy {
        url: format!("redis://{address}"),
        shared,
        dedicated,
    })
}

#[tokio::test]
async fn a_stalled_server_times_commands_and_blocking_reads_out_with_transient_errors() -> TestResult
{
    let proxy = stallable_proxy().await?;
    let prefix = format!("t_{}:", Uuid::new_v4().simple());
    let mut config = RedisConfig::new(prefix);
    config.response_timeout = Duration::from_millis(300);
    config.connection_timeout = Duration::from_millis(300);
    let store = RedisStreamStore::connect_with(&proxy.url, config).await?;
    let key = StreamKey::new("acme", "orders")?;
    store.ensure_group(&key, GROUP, GroupStart::End).await?;
    let block = Some(Duration::from_millis(200));
    // A blocking read, so that one dedicated connection is open and pooled.
    assert!(store
        .read_new(&key, &read_new("c1", 1, block))
        .await?
        .is_empty());
    assert_eq!(store.idle_blocking_connections(), 1);

    proxy.shared.send(true)?;
    let started = Instant::now();
    assert_transient(
        tokio::time::timeout(Duration::from_secs(10), store.ping()).await?,
        "a command",
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    proxy.shared.send(false)?;
    let mut recovered = false;
    for _ in 0..50 {
        if store.ping().await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "the shared connection works again once the server answers"
    );

    // The blocking read's wait stalls: it gives up after its block plus the
    // response timeout.
    proxy.dedicated.send(true)?;
    let started = Instant::now();
    assert_transient(
        tokio::time::timeout(
            Duration::from_secs(10),
            store.read_new(&key, &read_new("c1", 1, block)),
        )
        .await?,
        "a blocking read",
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "block plus response timeout: {took:?}"
    );
    assert_eq!(
        store.idle_blocking_connections(),
        0,
        "the stalled one was closed"
    );
    proxy.dedicated.send(false)?;
    assert!(store
        .read_new(&key, &read_new("c1", 1, block))
        .await?
        .is_empty());
    redis::cmd("DEL")
        .arg(store.redis_key(&key))
        .exec_async(&mut store.connection())
        .await?;
    Ok(())
}

#[tokio::test]
async fn bad_prefixes_urls_and_reads_are_refused_before_anything_is_sent() -> TestResult {
    for prefix in ["a b", "tab\t", "é", &"p".repeat(65)] {
        assert_eq!(
            invalid_field(RedisStreamStore::connect(&url(), prefix).await),
            "key_prefix",
            "{prefix:?}"
        );
    }
    assert_eq!(
        invalid_field(RedisStreamStore::connect("http://nope", "").await),
        "url"
    );
    let f = fixture().await?;
    assert_eq!(
        f.store.with_prefix("a b").err().map(|e| e.field),
        Some("key_prefix")
    );
    let s = &f.store;
    assert_eq!(
        invalid_field(s.read_new(&f.key, &read_new("c", 0, None)).await),
        "count"
    );
    assert_eq!(
        invalid_field(
            s.read_new(&f.key, &read_new("c", 1, Some(Duration::from_secs(31))))
                .await
        ),
        "block_ms"
    );
    assert_eq!(
        invalid_field(s.read_new(&f.key, &read_new("a:b", 1, None)).await),
        "consumer"
    );
    assert_eq!(
        invalid_field(
            s.read_pending(&f.key, GROUP, "c", StreamEntryId::ZERO, 0)
                .await
        ),
        "count"
    );
    assert_eq!(
        invalid_field(s.ensure_group(&f.key, "bad group", GroupStart::End).await),
        "group"
    );
    f.cleanup().await
}

#[tokio::test]
async fn stores_with_other_prefixes_share_the_server_but_not_the_keys() -> TestResult {
    let f = fixture().await?;
    let other = f
        .store
        .with_prefix(&format!("{}other:", f.store.key_prefix()))?;
    f.append_n(2).await?;
    assert!(other
        .range(&f.key, StreamEntryId::ZERO, 10)
        .await?
        .is_empty());
    assert_eq!(
        other.redis_key(&f.key),
        format!("{}other:acme:orders", f.store.key_prefix())
    );
    assert_eq!(other.backend(), "redis");
    other.ping().await?;
    f.cleanup().await
}

/// A stream another program writes at a key of its own is read, acked and
/// dead-lettered through a store that maps a stream key to it; nothing is
/// written under the prefix, and bad raw keys are refused naming the field.
#[tokio::test]
async fn a_raw_key_is_read_acked_and_dead_lettered_in_place() -> TestResult {
    let f = fixture().await?;
    // Under the fixture's prefix only so that cleanup finds it; the store
    // addresses it verbatim, not as `{prefix}{tenant}:{stream}`.
    let raw = format!("{}legacy-orders", f.store.key_prefix());
    let store = f.store.with_raw_key(&f.key, &raw)?;
    assert_eq!(store.redis_key(&f.key), raw);
    let dead = f.key.dead_letters()?;
    assert_eq!(store.redis_key(&dead), format!("{raw}.dead"));
    let other = StreamKey::new("acme", "other")?;
    assert_eq!(store.redis_key(&other), f.store.redis_key(&other));

    store
        .ensure_group(&f.key, GROUP, GroupStart::Beginning)
        .await?;
    for n in ["7", "8"] {
        f.raw::<String>(redis::cmd("XADD").arg(&raw).arg("*").arg("order_id").arg(n))
            .await?;
    }
    let read = store.read_new(&f.key, &read_new("c1", 10, None)).await?;
    let payloads: Vec<_> = read.iter().map(|d| d.entry.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![json!({"order_id": "7"}), json!({"order_id": "8"})]
    );
    assert_eq!(store.ack(&f.key, GROUP, &[read[0].entry.id]).await?, 1);
    assert!(
        store
            .dead_letter(&f.key, GROUP, &read[1], &["boom".to_owned()])
            .await?
    );
    let dead_entries: i64 = f.raw(redis::cmd("XLEN").arg(format!("{raw}.dead"))).await?;
    assert_eq!(dead_entries, 1);
    assert_eq!(store.pending_summary(&f.key, GROUP).await?.count, 0);
    let under_prefix: i64 = f.raw(redis::cmd("EXISTS").arg(f.redis_key())).await?;
    assert_eq!(
        under_prefix, 0,
        "nothing written at {{prefix}}{{tenant}}:{{stream}}"
    );

    for bad in ["", "has space", "x.dead", &"k".repeat(513)] {
        let refused = f.store.with_raw_key(&f.key, bad).err();
        assert_eq!(refused.map(|e| e.field), Some("redis_key"), "{bad:?}");
    }
    f.cleanup().await
}
