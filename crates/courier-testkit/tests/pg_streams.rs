//! PostgreSQL-only promises of native streams: ids are assigned at append
//! but become visible in commit order, and groups never skip an entry for
//! it. The behaviour every backend shares is in the stream conformance
//! suite (`tests/streams.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use courier::{GroupStart, NewStreamEntry, ReadNew, StreamEntryId, StreamKey, StreamStore};
use courier_testkit::{Backend, PgFixture};
use serde_json::json;

/// How long a test waits for an append to become readable.
const READABLE: Duration = Duration::from_secs(30);

fn entry(n: u64) -> NewStreamEntry {
    NewStreamEntry::new(json!({ "n": n }))
}

fn read(group: &str, consumer: &str, count: usize) -> ReadNew {
    ReadNew {
        group: group.into(),
        consumer: consumer.into(),
        count,
        block: None,
    }
}

fn numbers(entries: &[courier::DeliveredEntry]) -> Vec<u64> {
    entries
        .iter()
        .map(|d| d.entry.payload["n"].as_u64().unwrap_or(u64::MAX))
        .collect()
}

/// An entry of a transaction that has not committed holds back every entry
/// appended after it, even committed ones; when it commits, the group gets
/// both, in id order. Nothing is skipped, nothing is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_appending_transaction_delays_later_entries_and_loses_none() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let key = StreamKey::new("acme", "orders")?;
    store
        .ensure_group(&key, "billing", GroupStart::Beginning)
        .await?;

    let mut open = pg.pool.begin().await?;
    let first = store.append_on(&mut open, &key, &[entry(1)]).await?;
    let second = store.append(&key, &[entry(2)]).await?;
    assert!(
        first[0] < second[0],
        "ids follow the order they were assigned in"
    );

    // Entry 2 committed, but entry 1 below it may still commit: not yet.
    assert!(store
        .read_new(&key, &read("billing", "c1", 10))
        .await?
        .is_empty());
    open.commit().await?;
    // Other tests' open transactions may hold the horizon back a while.
    assert!(store.wait_until_readable(second[0], READABLE).await?);
    let got = store.read_new(&key, &read("billing", "c1", 10)).await?;
    assert_eq!(numbers(&got), vec![1, 2]);
    assert!(store
        .read_new(&key, &read("billing", "c1", 10))
        .await?
        .is_empty());
    Ok(())
}

/// A group created at the end is created in a snapshot: what the snapshot
/// saw is before it, what it did not see (still uncommitted) is after it,
/// whatever the ids say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_at_the_end_splits_entries_by_its_creation_snapshot() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let key = StreamKey::new("acme", "orders")?;

    // Entry 1's transaction takes its id first and commits after the group.
    let mut open = pg.pool.begin().await?;
    store.append_on(&mut open, &key, &[entry(1)]).await?;
    // Entry 0 commits before the group: its id is above entry 1's.
    store.append(&key, &[entry(0)]).await?;
    assert!(store.ensure_group(&key, "late", GroupStart::End).await?);
    open.commit().await?;
    let last = store.append(&key, &[entry(2)]).await?;
    assert!(store.wait_until_readable(last[0], READABLE).await?);

    let got = store.read_new(&key, &read("late", "c1", 10)).await?;
    assert_eq!(
        numbers(&got),
        vec![1, 2],
        "entry 0 was visible when the group was created"
    );

    // A group at the beginning gets all three, in id order.
    store
        .ensure_group(&key, "all", GroupStart::Beginning)
        .await?;
    let got = store.read_new(&key, &read("all", "c1", 10)).await?;
    assert_eq!(numbers(&got), vec![1, 0, 2]);
    Ok(())
}

/// 8 appenders with random delays between taking their ids and committing,
/// 20,000 entries, readers polling meanwhile: each group gets every entry
/// exactly once, and a group with one consumer gets them in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_entry_is_skipped_when_appends_commit_out_of_order() -> anyhow::Result<()> {
    const APPENDERS: u64 = 8;
    const PER_APPENDER: u64 = 2_500;
    let pg = PgFixture::with_connections(16).await?;
    let store = pg.courier().store().clone();
    let key = StreamKey::new("acme", "orders")?;
    store
        .ensure_group(&key, "ordered", GroupStart::Beginning)
        .await?;
    store
        .ensure_group(&key, "split", GroupStart::Beginning)
        .await?;
    let total = APPENDERS * PER_APPENDER;

    let mut appenders = Vec::new();
    for a in 0..APPENDERS {
        let store = store.clone();
        let key = key.clone();
        let pool = pg.pool.clone();
        appenders.push(tokio::spawn(async move {
            let mut n = a * PER_APPENDER;
            let end = n + PER_APPENDER;
            while n < end {
                let batch = fastrand::u64(1..=20).min(end - n);
                let entries: Vec<_> = (n..n + batch).map(entry).collect();
                let mut tx = pool.begin().await?;
                store.append_on(&mut tx, &key, &entries).await?;
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..8))).await;
                tx.commit().await?;
                n += batch;
            }
            anyhow::Ok(())
        }));
    }

    let ordered = Arc::new(tokio::sync::Mutex::new(Vec::<(StreamEntryId, u64)>::new()));
    let reader = {
        let store = store.clone();
        let key = key.clone();
        let seen = ordered.clone();
        tokio::spawn(async move {
            loop {
                if seen.lock().await.len() as u64 >= total {
                    return anyhow::Ok(());
                }
                let got = store.read_new(&key, &read("ordered", "only", 500)).await?;
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let ids: Vec<_> = got.iter().map(|d| d.entry.id).collect();
                store.ack(&key, "ordered", &ids).await?;
                seen.lock().await.extend(ids.into_iter().zip(numbers(&got)));
            }
        })
    };
    let seen_split = Arc::new(tokio::sync::Mutex::new(BTreeMap::<u64, u32>::new()));
    let mut splitters = Vec::new();
    for c in 0..3 {
        let store = store.clone();
        let key = key.clone();
        let seen = seen_split.clone();
        splitters.push(tokio::spawn(async move {
            let consumer = format!("c{c}");
            loop {
                if seen.lock().await.len() as u64 >= total {
                    return anyhow::Ok(());
                }
                let got = store.read_new(&key, &read("split", &consumer, 200)).await?;
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    continue;
                }
                let ids: Vec<_> = got.iter().map(|d| d.entry.id).collect();
                store.ack(&key, "split", &ids).await?;
                let mut seen = seen.lock().await;
                for n in numbers(&got) {
                    *seen.entry(n).or_default() += 1;
                }
            }
        }));
    }

    for appender in appenders {
        appender.await??;
    }
    // Every entry has committed; other tests' open transactions may still
    // hold the horizon back for a while, so wait generously, then count.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline
        && (!reader.is_finished() || splitters.iter().any(|s| !s.is_finished()))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reader.abort();
    for splitter in &splitters {
        splitter.abort();
    }
    let ordered = ordered.lock().await.clone();
    let ids: Vec<_> = ordered.iter().map(|(id, _)| *id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "one consumer's reads are in id order"
    );
    let got: BTreeSet<u64> = ordered.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        got.len() as u64,
        total,
        "the ordered group got every entry once"
    );
    assert_eq!(got, (0..total).collect::<BTreeSet<_>>());
    let split = seen_split.lock().await;
    assert_eq!(split.len() as u64, total, "the split group got every entry");
    assert!(
        split.values().all(|&n| n == 1),
        "no entry went to two consumers"
    );
    assert_eq!(store.pending_summary(&key, "split").await?.count, 0);
    Ok(())
}

/// A reader blocked on a stream wakes when another connection appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_read_wakes_when_another_store_appends() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let other = pg.named_store("appender").await?;
    let key = StreamKey::new("acme", "orders")?;
    store.ensure_group(&key, "g", GroupStart::End).await?;
    let reader = {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let mut blocked = read("g", "c1", 10);
            blocked.block = Some(Duration::from_secs(30));
            let got = store.read_new(&key, &blocked).await?;
            anyhow::Ok((got, std::time::Instant::now()))
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = other.append(&key, &[entry(7)]).await?;
    // Readable once no older writing transaction is open (other tests'
    // may be); from then on the blocked reader must return promptly.
    assert!(other.wait_until_readable(ids[0], READABLE).await?);
    let readable = std::time::Instant::now();
    let (got, returned) = reader.await??;
    assert_eq!(numbers(&got), vec![7]);
    let late = returned.saturating_duration_since(readable);
    assert!(
        late < Duration::from_secs(2),
        "returned {late:?} after the entry was readable"
    );
    Ok(())
}

/// Appends wake only the reads blocked on their own stream: a read blocked on
/// a quiet stream beside a busy one reads about as often as its poll
/// interval says, not once (or more) per append to the busy stream. Its
/// reads are counted by a trigger on the consumers table, which every read
/// of a group's new entries updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_to_one_stream_do_not_wake_reads_blocked_on_another() -> anyhow::Result<()> {
    const APPENDS: u64 = 100;
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let quiet = StreamKey::new("acme", "quiet")?;
    let busy = StreamKey::new("acme", "busy")?;
    store.ensure_group(&quiet, "g", GroupStart::End).await?;
    store.ensure_group(&busy, "g", GroupStart::End).await?;
    pg.execute(&format!(
        "CREATE TABLE {schema}.quiet_reads (at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE FUNCTION {schema}.count_quiet_read() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO {schema}.quiet_reads DEFAULT VALUES; RETURN NULL; END $$;
         CREATE TRIGGER quiet_reads AFTER INSERT OR UPDATE ON {schema}.stream_consumers
           FOR EACH ROW WHEN (NEW.stream = 'quiet') EXECUTE FUNCTION {schema}.count_quiet_read();",
        schema = pg.schema
    ))
    .await?;

    // A read blocked on the busy stream registers it as waited on (for its
    // block), so that appends to it notify.
    let busy_reader = {
        let store = store.clone();
        let busy = busy.clone();
        tokio::spawn(async move {
            let mut blocked = read("g", "c1", 1);
            blocked.block = Some(Duration::from_secs(10));
            store.read_new(&busy, &blocked).await
        })
    };
    let block = Duration::from_secs(2);
    let quiet_reader = {
        let store = store.clone();
        let quiet = quiet.clone();
        tokio::spawn(async move {
            let mut blocked = read("g", "c1", 10);
            blocked.block = Some(block);
            store.read_new(&quiet, &blocked).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let appender = pg.named_store("appender").await?;
    for n in 0..APPENDS {
        appender.append(&busy, &[entry(n)]).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        quiet_reader.await??.is_empty(),
        "nothing was appended to it"
    );
    assert!(!busy_reader.await??.is_empty());

    let reads = pg
        .scalar(&format!("SELECT count(*) FROM {}.quiet_reads", pg.schema))
        .await?;
    // Polling alone: one read per POLL_INTERVAL of the block, and the first.
    let polls =
        i64::try_from(block.as_millis() / courier::postgres::STREAM_POLL_INTERVAL.as_millis())?;
    assert!(
        reads <= polls + 10,
        "{reads} reads of the quiet stream in {block:?} beside {APPENDS} appends to another (polling alone: {polls})"
    );
    Ok(())
}

/// An appending transaction held open holds back the entries committed after
/// it, and the stream says for how long (the subscription's
/// `courier_stream_visibility_wait_seconds`); once it commits nothing waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_entry_s_wait_is_reported_until_it_is_readable() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let key = StreamKey::new("acme", "orders")?;
    store.ensure_group(&key, "g", GroupStart::End).await?;

    let mut open = pg.pool.begin().await?;
    store.append_on(&mut open, &key, &[entry(1)]).await?;
    let later = store.append(&key, &[entry(2)]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = store.visibility_wait(&key).await?;
    assert!(
        waited.is_some_and(|w| w >= Duration::from_millis(300)),
        "{waited:?}"
    );
    open.commit().await?;
    assert!(store.wait_until_readable(later[0], READABLE).await?);
    assert_eq!(store.visibility_wait(&key).await?, Some(Duration::ZERO));
    Ok(())
}

/// A claim racing a group deleted by hand (an operator's `DELETE FROM
/// stream_groups`) reports the group as not found, as it would have had the
/// delete come first, instead of a foreign-key error: the claim read the
/// group, waited for the deleting transaction on the consumers table's
/// foreign key, and found the group gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_racing_a_deleted_group_reports_it_not_found() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let claimer = pg.named_store("claimer").await?;
    let key = StreamKey::new("acme", "orders")?;
    store.ensure_group(&key, "g", GroupStart::Beginning).await?;

    let mut deleting = pg.pool.begin().await?;
    sqlx::query(&format!(
        "DELETE FROM {}.stream_groups WHERE tenant = 'acme' AND stream = 'orders' AND grp = 'g'",
        pg.schema
    ))
    .execute(&mut *deleting)
    .await?;
    let claim = tokio::spawn(async move {
        claimer
            .claim_idle(
                &key,
                &courier::ClaimIdle {
                    group: "g".into(),
                    consumer: "c1".into(),
                    min_idle: Duration::ZERO,
                    cursor: StreamEntryId::ZERO,
                    count: 10,
                },
            )
            .await
    });
    assert!(
        courier_testkit::eventually(Duration::from_secs(10), || pg.waits_on_a_lock("claimer"))
            .await,
        "the claim waits for the deleting transaction"
    );
    deleting.commit().await?;
    let outcome = claim.await?;
    assert!(
        matches!(outcome, Err(courier::StoreError::NotFound { .. })),
        "{outcome:?}"
    );
    Ok(())
}

/// A claim of idle entries skips a pending entry another claim is taking
/// over at that moment instead of waiting for it: after the wait only the
/// idle filter would be checked again, against the other claim's fresh
/// delivery time, and with a small `min_idle` it would still pass, handing
/// the entry to a second consumer. Here a transaction redelivers the entry
/// (as a claim does) and stays open while another claim, with a 20 ms
/// `min_idle`, runs 200 ms after it began; the claim takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_skips_an_entry_another_claim_is_taking_over() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let claimer = pg.named_store("claimer").await?;
    let key = StreamKey::new("acme", "orders")?;
    store.ensure_group(&key, "g", GroupStart::Beginning).await?;
    let appended = store.append(&key, &[entry(1)]).await?;
    // Other tests' open transactions may hold the entry back a moment.
    assert!(store.wait_until_readable(appended[0], READABLE).await?);
    assert_eq!(
        numbers(&store.read_new(&key, &read("g", "c0", 10)).await?),
        [1]
    );
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The other claim: it has taken the entry over and not committed yet.
    let mut taking = pg.pool.begin().await?;
    let taken = sqlx::query(&format!(
        "UPDATE {}.stream_pending SET delivered_at = statement_timestamp(), \
         deliveries = deliveries + 1 WHERE tenant = 'acme' AND stream = 'orders' AND grp = 'g'",
        pg.schema
    ))
    .execute(&mut *taking)
    .await?;
    assert_eq!(taken.rows_affected(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let claim = tokio::spawn({
        let key = key.clone();
        async move {
            claimer
                .claim_idle(
                    &key,
                    &courier::ClaimIdle {
                        group: "g".into(),
                        consumer: "c2".into(),
                        min_idle: Duration::from_millis(20),
                        cursor: StreamEntryId::ZERO,
                        count: 10,
                    },
                )
                .await
        }
    });
    // The claim either answers or waits for the other claim's row.
    assert!(
        courier_testkit::eventually(Duration::from_secs(10), || async {
            claim.is_finished() || pg.waits_on_a_lock("claimer").await
        })
        .await
    );
    taking.commit().await?;
    let claimed = claim.await??;
    assert!(
        claimed.entries.is_empty(),
        "the entry went to a second consumer: {:?}",
        numbers(&claimed.entries)
    );
    let detail = store
        .pending_detail(
            &key,
            "g",
            &courier::PendingQuery {
                after: StreamEntryId::ZERO,
                count: 10,
                consumer: None,
                min_idle: None,
            },
        )
        .await?;
    assert_eq!(detail.len(), 1);
    assert_eq!(detail[0].consumer, "c0");
    Ok(())
}

/// Entry `n` as a relay of message `message_id` writes it.
fn relayed(message_id: uuid::Uuid, n: u64) -> NewStreamEntry {
    NewStreamEntry {
        origin: Some(courier::EntryOrigin {
            message_id,
            tenant: "acme".into(),
            topic: "order.placed".into(),
            schema_version: 2,
        }),
        ..entry(n)
    }
}

/// The native relay's one-statement append: a message's first entry is
/// appended; another of the same message, in the same transaction or after
/// it committed, is not, and the first one's id comes back as a duplicate;
/// what a rolled-back transaction appended does not count; an entry without
/// an origin is refused and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_append_appends_a_message_once_and_reports_the_first_entry() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let key = StreamKey::new("acme", "relayed")?;
    let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());

    let mut rolled_back = pg.pool.begin().await?;
    let (_, duplicate) = store
        .relay_append_on(&mut rolled_back, &key, &relayed(a, 0))
        .await?;
    assert!(!duplicate);
    rolled_back.rollback().await?;

    let mut tx = pg.pool.begin().await?;
    let (first, duplicate) = store.relay_append_on(&mut tx, &key, &relayed(a, 1)).await?;
    assert!(!duplicate, "the rolled-back entry is not there");
    let again = store.relay_append_on(&mut tx, &key, &relayed(a, 2)).await?;
    assert_eq!(again, (first, true), "its own earlier append counts");
    let (other, duplicate) = store.relay_append_on(&mut tx, &key, &relayed(b, 3)).await?;
    assert!(!duplicate && other > first, "another message is appended");
    tx.commit().await?;

    let mut later = pg.pool.begin().await?;
    let after = store
        .relay_append_on(&mut later, &key, &relayed(b, 4))
        .await?;
    assert_eq!(after, (other, true), "a committed entry counts");
    let refused = store.relay_append_on(&mut later, &key, &entry(5)).await;
    assert!(
        matches!(&refused, Err(courier::StoreError::Invalid(e)) if e.field == "origin"),
        "{refused:?}"
    );
    later.commit().await?;

    assert!(store.wait_until_readable(other, READABLE).await?);
    let stored = store.range(&key, StreamEntryId::ZERO, 100).await?;
    let found: Vec<(u64, Option<courier::EntryOrigin>)> = stored
        .iter()
        .map(|e| {
            (
                e.payload["n"].as_u64().unwrap_or(u64::MAX),
                e.origin.clone(),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![(1, relayed(a, 1).origin), (3, relayed(b, 3).origin),]
    );
    Ok(())
}

/// Two relays appending one message to one stream at once (two
/// subscriptions relaying a topic into the same native stream, each in its
/// delivery's transaction) store it once: the second waits for the first
/// transaction and, once that committed, finds its entry; had the first
/// rolled back, the second appends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_relaying_one_message_at_once_store_it_once() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store().clone();
    let second_store = pg.named_store("second").await?;
    let key = StreamKey::new("acme", "relayed")?;
    // Relays `entry` on the second store, in a transaction it commits.
    let relay_second = |entry: NewStreamEntry| {
        let store = second_store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await?;
            let appended = store.relay_append_on(&mut tx, &key, &entry).await?;
            tx.commit().await?;
            anyhow::Ok(appended)
        })
    };
    let waiting = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !pg.waits_on_a_lock("second").await {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the second relay never waited for the first"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        anyhow::Ok(())
    };

    // The first commits while the second waits for it.
    let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let mut first = pg.pool.begin().await?;
    let (id, duplicate) = store
        .relay_append_on(&mut first, &key, &relayed(a, 0))
        .await?;
    assert!(!duplicate);
    let second = relay_second(relayed(a, 1));
    waiting().await?;
    first.commit().await?;
    let appended = tokio::time::timeout(Duration::from_secs(30), second).await???;
    assert_eq!(appended, (id, true), "the second found the first's entry");

    // The first rolls back while the second waits: the second appends.
    let mut first = pg.pool.begin().await?;
    store
        .relay_append_on(&mut first, &key, &relayed(b, 2))
        .await?;
    let second = relay_second(relayed(b, 3));
    waiting().await?;
    first.rollback().await?;
    let (other, duplicate) = tokio::time::timeout(Duration::from_secs(30), second).await???;
    assert!(!duplicate);

    assert!(store.wait_until_readable(other, READABLE).await?);
    let stored = store.range(&key, StreamEntryId::ZERO, 100).await?;
    let numbers: Vec<u64> = stored
        .iter()
        .map(|e| e.payload["n"].as_u64().unwrap_or(u64::MAX))
        .collect();
    assert_eq!(numbers, vec![0, 3], "one entry of each message");
    Ok(())
}
