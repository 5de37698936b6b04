//! Stream subscriptions' receipts (`courier::StreamReceipts`) on PostgreSQL
//! and SQLite: a lookup finds exactly the receipts recorded (plain handlers'
//! batches, transactional handlers' single receipts, correlation ids of no
//! entry), recording counts only new receipts, receipts recorded without
//! that check are found once however often stored, the two kinds see each
//! other,
//! and retention removes them. PostgreSQL stores a plain batch as runs of
//! entry ids (migration 0017); these cases cross its run boundaries (span
//! and length), ids at the ends of the u64 range and streams whose names
//! hold colons. Each case runs once per backend.

use std::collections::BTreeSet;
use std::time::Duration;

use courier::{HandlerError, OutboxStore, ReceiptOutcome, StreamEntryId, StreamReceipts, TxWork};

fn correlation(subscription: &str, stream: &str, id: StreamEntryId) -> String {
    format!("{subscription}:{stream}:{id}")
}

/// 2,500 entry ids: 1,500 dense ones (ten minors per major), then 1,000
/// sparse ones (7 majors apart), so one batch crosses runs of either bound
/// (1,000 entries, 1,000 majors).
fn spread(from: u64) -> Vec<StreamEntryId> {
    let dense = (0..1_500_u64).map(|k| StreamEntryId::new(from + k / 10, k % 10));
    let sparse = (0..1_000_u64).map(|k| StreamEntryId::new(from + 200 + k * 7, 0));
    dense.chain(sparse).collect()
}

async fn find<R: StreamReceipts>(
    receipts: &R,
    subscription: &str,
    ids: &[String],
) -> anyhow::Result<BTreeSet<String>> {
    Ok(receipts
        .find_stream_receipts(subscription, ids)
        .await?
        .into_iter()
        .collect())
}

fn no_work<C: Send + 'static>() -> TxWork<C> {
    Box::new(|_conn: &mut C| Box::pin(async { Ok::<(), HandlerError>(()) }))
}

async fn a_lookup_finds_exactly_the_recorded_receipts<R: StreamReceipts>(
    receipts: R,
) -> anyhow::Result<()> {
    let ids = spread(1_700_000_000_000);
    let recorded: Vec<String> = ids
        .iter()
        .map(|id| correlation("billing", "orders", *id))
        .collect();
    assert_eq!(
        receipts
            .record_stream_receipts("billing", &recorded)
            .await?,
        2_500
    );

    // Every recorded id is found, looked up all at once, in a batch of
    // 100 from the middle, or alone.
    assert_eq!(
        find(&receipts, "billing", &recorded).await?,
        recorded.iter().cloned().collect()
    );
    assert_eq!(
        find(&receipts, "billing", &recorded[1_200..1_300]).await?,
        recorded[1_200..1_300].iter().cloned().collect()
    );
    assert_eq!(
        find(&receipts, "billing", &recorded[2_499..]).await?,
        recorded[2_499..].iter().cloned().collect()
    );
    // Two ids far apart (7,000 majors), as a claim's page may hold.
    let apart = [recorded[0].clone(), recorded[2_499].clone()];
    assert_eq!(
        find(&receipts, "billing", &apart).await?,
        apart.iter().cloned().collect()
    );

    // Nothing else is: a neighbouring minor or major, the same ids on
    // another stream (whose name shares a prefix) or of another
    // subscription, and the ids before and after all of them.
    let mut strangers = Vec::new();
    for id in [ids[0], ids[1_000], ids[1_600], ids[2_499]] {
        strangers.push(correlation(
            "billing",
            "orders",
            StreamEntryId::new(id.major, 1_000),
        ));
        strangers.push(correlation("billing", "orders:eu", id));
        strangers.push(correlation("billing", "order", id));
        strangers.push(correlation("shipping", "orders", id));
    }
    // Between sparse ids (7 majors apart, after the dense ones).
    for id in [ids[1_600], ids[2_499]] {
        strangers.push(correlation(
            "billing",
            "orders",
            StreamEntryId::new(id.major + 1, 0),
        ));
    }
    strangers.push(correlation("billing", "orders", StreamEntryId::new(1, 0)));
    strangers.push(correlation(
        "billing",
        "orders",
        StreamEntryId::new(u64::MAX, u64::MAX),
    ));
    assert_eq!(
        find(&receipts, "billing", &strangers).await?,
        BTreeSet::new()
    );
    assert_eq!(
        find(&receipts, "shipping", &recorded[..10]).await?,
        BTreeSet::new(),
        "another subscription's lookup"
    );

    // A mixed lookup finds the recorded half only.
    let mut mixed = strangers.clone();
    mixed.extend(recorded[..50].iter().cloned());
    assert_eq!(
        find(&receipts, "billing", &mixed).await?,
        recorded[..50].iter().cloned().collect()
    );
    Ok(())
}

async fn recording_counts_only_new_receipts<R: StreamReceipts>(receipts: R) -> anyhow::Result<()> {
    let ids = spread(50_000);
    let all: Vec<String> = ids
        .iter()
        .map(|id| correlation("billing", "a:b", *id))
        .collect();
    assert_eq!(
        receipts
            .record_stream_receipts("billing", &all[..1_000])
            .await?,
        1_000
    );
    assert_eq!(
        receipts
            .record_stream_receipts("billing", &all[..1_000])
            .await?,
        0,
        "recorded again"
    );
    // Half old, half new, with a duplicate in the call.
    let mut overlap = all[500..1_500].to_vec();
    overlap.push(all[1_400].clone());
    assert_eq!(
        receipts.record_stream_receipts("billing", &overlap).await?,
        500
    );
    assert_eq!(
        find(&receipts, "billing", &all).await?,
        all[..1_500].iter().cloned().collect()
    );

    // Ids at both ends of the u64 range, and correlation ids that name no
    // entry (free text, a non-canonical id).
    let edges = vec![
        correlation("billing", "a:b", StreamEntryId::new(0, 0)),
        correlation("billing", "a:b", StreamEntryId::new(u64::MAX, 0)),
        correlation("billing", "a:b", StreamEntryId::new(u64::MAX, u64::MAX)),
        correlation("billing", "a:b", StreamEntryId::new(i64::MAX as u64, 7)),
        correlation("billing", "a:b", StreamEntryId::new(1 << 63, 7)),
        "billing:a:b:0050000-0".to_owned(),
        "an order's own key".to_owned(),
    ];
    assert_eq!(receipts.record_stream_receipts("billing", &edges).await?, 7);
    assert_eq!(receipts.record_stream_receipts("billing", &edges).await?, 0);
    assert_eq!(
        find(&receipts, "billing", &edges).await?,
        edges.iter().cloned().collect()
    );
    let near_edges = vec![
        correlation("billing", "a:b", StreamEntryId::new(0, 1)),
        correlation("billing", "a:b", StreamEntryId::new(u64::MAX - 1, 0)),
        correlation("billing", "a:b", StreamEntryId::new(i64::MAX as u64, 6)),
        "billing:a:b:050000-0".to_owned(),
        "an order's own key!".to_owned(),
    ];
    assert_eq!(
        find(&receipts, "billing", &near_edges).await?,
        BTreeSet::new()
    );
    Ok(())
}

async fn receipts_recorded_as_new_are_found_exactly_once<R: StreamReceipts>(
    receipts: R,
) -> anyhow::Result<()> {
    // What a subscription records after its handlers ran: ids it looked up
    // and found no receipt of, across run bounds, at the ends of the u64
    // range, and correlation ids of no entry.
    let mut all: Vec<String> = spread(90_000)
        .into_iter()
        .map(|id| correlation("billing", "a:b", id))
        .collect();
    all.push(correlation("billing", "a:b", StreamEntryId::new(0, 0)));
    all.push(correlation(
        "billing",
        "a:b",
        StreamEntryId::new(u64::MAX, u64::MAX),
    ));
    all.push("an order's own key".to_owned());
    receipts
        .record_new_stream_receipts("billing", &all[..1_200])
        .await?;
    receipts
        .record_new_stream_receipts("billing", &all[1_200..])
        .await?;
    let expected: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(find(&receipts, "billing", &all).await?, expected);
    assert_eq!(
        find(
            &receipts,
            "billing",
            &[correlation(
                "billing",
                "a:b",
                StreamEntryId::new(90_000, 10)
            )]
        )
        .await?,
        BTreeSet::new(),
        "a neighbour of a recorded id"
    );

    // Another consumer recorded some of them meanwhile (a claim race): they
    // may be stored twice, and a lookup still returns each once.
    receipts
        .record_new_stream_receipts("billing", &all[1_100..1_300])
        .await?;
    let found = receipts.find_stream_receipts("billing", &all).await?;
    assert_eq!(found.len(), all.len(), "each found once");
    assert_eq!(found.into_iter().collect::<BTreeSet<_>>(), expected);
    // They are receipts like any other: recording them again adds none.
    assert_eq!(receipts.record_stream_receipts("billing", &all).await?, 0);
    Ok(())
}

async fn transactional_and_plain_receipts_see_each_other<R>(receipts: R) -> anyhow::Result<()>
where
    R: StreamReceipts<Connection: Send + 'static>,
{
    let id = |major| correlation("billing", "orders", StreamEntryId::new(major, 0));
    // A transactional handler's receipt: found by a lookup, not recorded
    // again by a plain batch that holds it.
    assert!(matches!(
        receipts
            .run_with_stream_receipt("billing", &id(10), no_work())
            .await?,
        ReceiptOutcome::Applied
    ));
    assert_eq!(
        find(&receipts, "billing", &[id(9), id(10), id(11)]).await?,
        BTreeSet::from([id(10)])
    );
    assert_eq!(
        receipts
            .record_stream_receipts("billing", &[id(9), id(10), id(11)])
            .await?,
        2
    );
    // A plain batch's receipt: the transactional work is skipped.
    assert!(matches!(
        receipts
            .run_with_stream_receipt("billing", &id(11), no_work())
            .await?,
        ReceiptOutcome::AlreadyApplied
    ));
    assert!(matches!(
        receipts
            .run_with_stream_receipt("billing", &id(10), no_work())
            .await?,
        ReceiptOutcome::AlreadyApplied
    ));
    assert_eq!(
        find(&receipts, "billing", &[id(9), id(10), id(11), id(12)]).await?,
        BTreeSet::from([id(9), id(10), id(11)])
    );
    Ok(())
}

async fn retention_removes_every_kind_of_receipt<R>(receipts: R) -> anyhow::Result<()>
where
    R: StreamReceipts<Connection: Send + 'static> + OutboxStore,
{
    let plain: Vec<String> = spread(7_000)
        .into_iter()
        .map(|id| correlation("billing", "orders", id))
        .collect();
    receipts.record_stream_receipts("billing", &plain).await?;
    let single = correlation("billing", "orders", StreamEntryId::new(1, 0));
    receipts
        .run_with_stream_receipt("billing", &single, no_work())
        .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;

    let mut removed = 0;
    loop {
        let report = receipts.prune(Duration::ZERO, 100).await?;
        if report.receipts == 0 {
            break;
        }
        removed += report.receipts;
    }
    assert_eq!(removed, 2_501);
    let mut all = plain.clone();
    all.push(single);
    assert_eq!(find(&receipts, "billing", &all).await?, BTreeSet::new());
    Ok(())
}

macro_rules! stream_receipt_tests {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    let fixture = courier_testkit::PgFixture::new().await?;
                    super::$case(courier_testkit::Backend::courier(&fixture).store().clone()).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    let fixture = courier_testkit::SqliteFixture::new().await?;
                    super::$case(courier_testkit::Backend::courier(&fixture).store().clone()).await
                }
            )*
        }
    };
}

stream_receipt_tests!(
    a_lookup_finds_exactly_the_recorded_receipts,
    recording_counts_only_new_receipts,
    receipts_recorded_as_new_are_found_exactly_once,
    transactional_and_plain_receipts_see_each_other,
    retention_removes_every_kind_of_receipt,
);
