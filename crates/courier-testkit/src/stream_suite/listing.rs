//! Cases: listing streams (`StreamStore::list_streams`): the order, the
//! tenant filter, paging, and each group's consumers, pending entries and
//! lag.
//!
//! Every case lists the whole of its fixture's data (its own file, schema or
//! key prefix), so the streams it made are the only ones there.

use courier_core::{
    GroupStart, GroupSummary, StreamEntryId, StreamKey, StreamPage, StreamStore, StreamSummary,
    MAX_STREAM_PAGE,
};

use super::helpers::*;
use super::StreamFixture;

/// The streams [`tenants_and_streams`] makes, in listing order, with what
/// the listing must say of them.
struct Made {
    /// (tenant, stream, length, newest id).
    streams: Vec<(String, String, u64, Option<StreamEntryId>)>,
}

/// Two tenants whose names sort differently in byte order than in most
/// collations (`Beta` < `acme`, `Audit` < `orders`, `a-z` < `ab`), a
/// stream with only a group, and a dead-letter stream made by a dead letter.
async fn tenants_and_streams<S: StreamStore>(store: &S) -> anyhow::Result<Made> {
    let stream = |tenant: &str, stream: &str| StreamKey::new(tenant, stream);
    let orders = stream("acme", "orders")?;
    let orders_ids = append_numbered(store, &orders, 0, 3).await?;
    assert!(
        store
            .ensure_group(&orders, "g", GroupStart::Beginning)
            .await?
    );
    let read = read_new(store, &orders, "g", "c1", 1).await?;
    anyhow::ensure!(read.len() == 1, "read {} entries, not 1", read.len());
    assert!(
        store
            .dead_letter(&orders, "g", &read[0], &["gave up".to_owned()])
            .await?
    );
    let dead = all_entries(store, &orders.dead_letters()?).await?;
    anyhow::ensure!(dead.len() == 1, "{} dead letters, not 1", dead.len());
    let audit_ids = append_numbered(store, &stream("acme", "Audit")?, 0, 2).await?;
    let dashed_ids = append_numbered(store, &stream("acme", "a-z")?, 0, 1).await?;
    let plain_ids = append_numbered(store, &stream("acme", "ab")?, 0, 4).await?;
    assert!(
        store
            .ensure_group(&stream("acme", "empty")?, "g", GroupStart::End)
            .await?
    );
    let beta_ids = append_numbered(store, &stream("Beta", "orders")?, 0, 1).await?;
    let made = |tenant: &str, stream: &str, ids: &[StreamEntryId]| {
        (
            tenant.to_owned(),
            stream.to_owned(),
            ids.len() as u64,
            ids.last().copied(),
        )
    };
    Ok(Made {
        streams: vec![
            made("Beta", "orders", &beta_ids),
            made("acme", "Audit", &audit_ids),
            made("acme", "a-z", &dashed_ids),
            made("acme", "ab", &plain_ids),
            made("acme", "empty", &[]),
            made("acme", "orders", &orders_ids),
            made("acme", "orders.dead", &[dead[0].id]),
        ],
    })
}

/// (tenant, stream, length, newest id) of each stream of `page`.
fn shown(page: &StreamPage) -> Vec<(String, String, u64, Option<StreamEntryId>)> {
    page.items
        .iter()
        .map(|s| (s.tenant.clone(), s.stream.clone(), s.length, s.last_id))
        .collect()
}

/// The listed stream `tenant`/`stream`.
fn listed<'p>(
    page: &'p StreamPage,
    tenant: &str,
    stream: &str,
) -> anyhow::Result<&'p StreamSummary> {
    page.items
        .iter()
        .find(|s| s.tenant == tenant && s.stream == stream)
        .ok_or_else(|| anyhow::anyhow!("{tenant}/{stream} is not listed: {page:?}"))
}

/// Every tenant's streams are listed by (tenant, stream) in byte order, a
/// dead-letter stream and a stream with a group but no entry among them,
/// each with its length and newest id; one page holds them all, so there is
/// no next one.
pub async fn streams_of_every_tenant_are_listed_in_byte_order_with_lengths_and_last_ids<
    F: StreamFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    assert_eq!(
        store.list_streams(None, None, 100).await?,
        StreamPage::default(),
        "nothing yet"
    );
    let made = tenants_and_streams(store).await?;
    let page = store.list_streams(None, None, 100).await?;
    assert_eq!(shown(&page), made.streams);
    assert_eq!(page.next, None);
    let orders = listed(&page, "acme", "orders")?;
    assert_eq!(
        orders
            .groups
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>(),
        ["g"]
    );
    let empty = listed(&page, "acme", "empty")?;
    assert_eq!(
        empty
            .groups
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>(),
        ["g"]
    );
    assert!(listed(&page, "acme", "ab")?.groups.is_empty());
    Ok(())
}

/// A tenant filter lists only those tenants' streams; tenants without
/// streams add nothing, an empty filter lists nothing, and a tenant that
/// breaks the name grammar is refused naming `tenant`.
pub async fn a_tenant_filter_lists_only_its_tenants_streams<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let made = tenants_and_streams(store).await?;
    let of = |tenant: &str| {
        made.streams
            .iter()
            .filter(|s| s.0 == tenant)
            .cloned()
            .collect::<Vec<_>>()
    };
    let beta = store
        .list_streams(Some(&["Beta".to_owned()]), None, 100)
        .await?;
    assert_eq!(shown(&beta), of("Beta"));
    let acme = store
        .list_streams(Some(&["nobody".to_owned(), "acme".to_owned()]), None, 100)
        .await?;
    assert_eq!(shown(&acme), of("acme"));
    assert_eq!(acme.next, None);
    let both = store
        .list_streams(Some(&["acme".to_owned(), "Beta".to_owned()]), None, 100)
        .await?;
    assert_eq!(shown(&both), made.streams);
    assert_eq!(
        store.list_streams(Some(&[]), None, 100).await?,
        StreamPage::default()
    );
    assert_invalid(
        store
            .list_streams(Some(&["acme".to_owned(), "a:b".to_owned()]), None, 100)
            .await,
        "tenant",
        "a tenant outside the grammar",
    )?;
    Ok(())
}

/// Pages of one stream, each continuing after the last, walk every stream
/// once in listing order, and only the last page has no next; with a tenant
/// filter they walk that tenant's. A limit of 0 is taken as 1, and one
/// above the most a page holds as that most.
pub async fn paging_with_limit_one_walks_every_stream_once<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let made = tenants_and_streams(store).await?;
    for tenants in [None, Some(vec!["acme".to_owned()])] {
        let mut walked = Vec::new();
        let mut after: Option<StreamKey> = None;
        for _ in 0..=made.streams.len() {
            let page = store
                .list_streams(tenants.as_deref(), after.as_ref(), 1)
                .await?;
            anyhow::ensure!(page.items.len() <= 1, "a page of {:?}", shown(&page));
            walked.extend(shown(&page));
            match page.next {
                Some(next) => {
                    let last = walked.last().map(|s| (s.0.as_str(), s.1.as_str()));
                    assert_eq!(last, Some((next.tenant(), next.stream())));
                    after = Some(next);
                }
                None => break,
            }
        }
        let expected: Vec<_> = made
            .streams
            .iter()
            .filter(|s| tenants.as_ref().is_none_or(|t| t.contains(&s.0)))
            .cloned()
            .collect();
        assert_eq!(walked, expected, "tenants {tenants:?}");
    }
    let first = store.list_streams(None, None, 0).await?;
    assert_eq!(shown(&first), made.streams[..1].to_vec(), "limit 0 is 1");
    let second = store.list_streams(None, first.next.as_ref(), 2).await?;
    assert_eq!(shown(&second), made.streams[1..3].to_vec());
    let rest = store
        .list_streams(None, second.next.as_ref(), MAX_STREAM_PAGE + 1)
        .await?;
    assert_eq!(shown(&rest), made.streams[3..].to_vec());
    assert_eq!(rest.next, None);
    Ok(())
}

/// A group's pending count and lag follow its reads and acks: of 5
/// entries, a group that read 3 and acked 1 has 2 pending and 2 to read,
/// its cursor at the third; a group that read nothing has all 5 to read.
/// The lag is the one [`StreamStore::lag`] reports.
pub async fn a_group_s_pending_and_lag_follow_reads_and_acks<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("lagging")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    assert!(
        store
            .ensure_group(&key, "idle", GroupStart::Beginning)
            .await?
    );
    let appended = append_numbered(store, &key, 0, 5).await?;
    let read = read_new(store, &key, "g", "c1", 3).await?;
    assert_eq!(ids(&read), appended[..3].to_vec());
    assert_eq!(store.ack(&key, "g", &appended[..1]).await?, 1);

    let page = store.list_streams(None, None, 10).await?;
    let summary = listed(&page, TENANT, "lagging")?;
    assert_eq!(
        (summary.length, summary.last_id),
        (5, appended.last().copied())
    );
    assert_eq!(
        summary.groups,
        vec![
            GroupSummary {
                name: "g".into(),
                consumers: 1,
                pending: 2,
                last_delivered: appended[2],
                lag: Some(2),
            },
            GroupSummary {
                name: "idle".into(),
                consumers: 0,
                pending: 0,
                last_delivered: StreamEntryId::ZERO,
                lag: Some(5),
            },
        ]
    );
    for group in &summary.groups {
        assert_eq!(
            group.lag,
            store.lag(&key, &group.name).await?,
            "{}",
            group.name
        );
    }
    Ok(())
}

/// A group's consumers are counted whether or not anything is pending for
/// them, each group its own, and a deleted consumer no more.
pub async fn a_group_s_consumers_are_counted<F: StreamFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("consumed")?;
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    assert!(store.ensure_group(&key, "h", GroupStart::Beginning).await?);
    append_numbered(store, &key, 0, 2).await?;
    for consumer in ["c1", "c2", "c3"] {
        read_new(store, &key, "g", consumer, 1).await?;
    }
    read_new(store, &key, "h", "c1", 10).await?;
    let counts = |page: &StreamPage| -> anyhow::Result<Vec<(String, u64, u64)>> {
        Ok(listed(page, TENANT, "consumed")?
            .groups
            .iter()
            .map(|g| (g.name.clone(), g.consumers, g.pending))
            .collect())
    };
    let page = store.list_streams(None, None, 10).await?;
    assert_eq!(
        counts(&page)?,
        [("g".to_owned(), 3, 2), ("h".to_owned(), 1, 2)],
        "c3 read nothing but is a consumer"
    );
    assert_eq!(
        store.delete_consumer(&key, "g", "c3").await?,
        courier_core::ConsumerRemoval::Deleted
    );
    let page = store.list_streams(None, None, 10).await?;
    assert_eq!(
        counts(&page)?,
        [("g".to_owned(), 2, 2), ("h".to_owned(), 1, 2)]
    );
    Ok(())
}
