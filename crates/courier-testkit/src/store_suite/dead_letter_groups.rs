//! Cases: dead letters grouped by the fingerprint of their last failure, and
//! the fingerprint as a filter of retry, discard, count and list.

use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::{
    error_fingerprint, DeadLetterFilter, DeadLetterGroup, DeadLetterStore, ErrorKind, Failure,
    OutboxStore, RescueParams, StoreError,
};
use uuid::Uuid;

use super::helpers::*;
use super::StoreFixture;

/// How `subscription` fails its claimed deliveries of `topic`: `limit` of
/// them, dead-lettered at once with `kind` and the message `text(i)` makes.
async fn kill<S: OutboxStore>(
    store: &S,
    subscription: &str,
    topic: &str,
    limit: usize,
    kind: ErrorKind,
    text: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    // A claim may take tenants in turns: claim until `limit` are held.
    let mut claimed = Vec::new();
    for _ in 0..20 {
        if claimed.len() == limit {
            break;
        }
        let more = params(
            subscription,
            vec![route(topic, 1, 10)],
            limit - claimed.len(),
        );
        claimed.extend(claim(store, &more).await?);
    }
    assert_eq!(claimed.len(), limit, "{subscription}/{topic}");
    let failures: Vec<Failure> = claimed
        .iter()
        .enumerate()
        .map(|(i, d)| Failure {
            lease: d.lease(),
            error: text(i),
            kind,
            retry_in: None,
        })
        .collect();
    let applied = store.fail_many(&failures).await?;
    assert_eq!(applied.len(), limit);
    assert!(applied.iter().all(|f| f.dead));
    Ok(())
}

/// The group of `fingerprint` in `groups`.
fn group<'g>(
    groups: &'g [DeadLetterGroup],
    fingerprint: &str,
) -> anyhow::Result<&'g DeadLetterGroup> {
    groups
        .iter()
        .find(|g| g.fingerprint == fingerprint)
        .ok_or_else(|| anyhow::anyhow!("no group {fingerprint} in {groups:#?}"))
}

/// The oldest and newest `dead_at` of the dead letters `filter` lists.
async fn dead_at_range<S: DeadLetterStore>(
    store: &S,
    filter: &DeadLetterFilter,
) -> anyhow::Result<(usize, Option<DateTime<Utc>>, Option<DateTime<Utc>>)> {
    let mut times = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_dead_letters(filter, after, 1000).await?;
        times.extend(page.items.iter().filter_map(|d| d.dead_at));
        match page.next_cursor {
            Some(key) => after = Some(key),
            None => break,
        }
    }
    Ok((
        times.len(),
        times.iter().min().copied(),
        times.iter().max().copied(),
    ))
}

fn by_fingerprint(fingerprint: &str) -> DeadLetterFilter {
    DeadLetterFilter {
        fingerprint: Some(fingerprint.to_owned()),
        ..DeadLetterFilter::default()
    }
}

/// Three distinct failures over 300 dead letters make three groups with the
/// right counts, subscriptions, topics and first and last `dead_at` (the
/// listing's), largest first; numbers and ids in the messages do not split
/// a group, a webhook's status does. Groups honour the tenant filter.
/// Retrying one group by its fingerprint (for one tenant, then all) and
/// discarding another leave the remaining groups exactly as they were.
pub async fn dead_letters_group_by_failure_and_a_group_is_retried_or_discarded_alone<
    F: StoreFixture,
>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "orders", &["a", "b"]).await?;
    subscribe(store, "billing", &["c"]).await?;
    let mut messages = Vec::new();
    for topic in ["a", "b", "c"] {
        for i in 0..100 {
            let tenant = if i % 2 == 0 { "t1" } else { "t2" };
            messages.push(message(tenant, topic)?);
        }
    }
    store.publish_batch(&messages).await?;

    let missing = |i: usize| {
        format!(
            "permanent failure: customer {} not found (request {i})",
            Uuid::new_v4()
        )
    };
    let unavailable = |i: usize| {
        format!("webhook of subscription orders answered 503 Service Unavailable: queue {i} full")
    };
    let not_found =
        |i: usize| format!("webhook of subscription billing answered 404 Not Found: no route {i}");
    let missing_fp = error_fingerprint(ErrorKind::Permanent, &missing(1));
    let unavailable_fp = error_fingerprint(ErrorKind::Retry, &unavailable(1));
    let not_found_fp = error_fingerprint(ErrorKind::Retry, &not_found(1));

    // `missing` starts before the other two and ends after them.
    kill(store, "orders", "a", 50, ErrorKind::Permanent, missing).await?;
    fixture.pass_time(Duration::from_secs(60)).await?;
    kill(store, "orders", "b", 100, ErrorKind::Retry, unavailable).await?;
    kill(store, "billing", "c", 50, ErrorKind::Retry, not_found).await?;
    fixture.pass_time(Duration::from_secs(60)).await?;
    kill(store, "orders", "a", 50, ErrorKind::Permanent, missing).await?;
    kill(store, "billing", "c", 50, ErrorKind::Permanent, missing).await?;

    let any = DeadLetterFilter::default();
    let groups = store.dead_letter_groups(&any, 100).await?;
    let order: Vec<(&str, u64)> = groups
        .iter()
        .map(|g| (g.fingerprint.as_str(), g.count))
        .collect();
    assert_eq!(
        order,
        [
            (missing_fp.as_str(), 150),
            (unavailable_fp.as_str(), 100),
            (not_found_fp.as_str(), 50)
        ],
        "largest first"
    );
    let strings = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    let expected = [
        (
            &missing_fp,
            strings(&["billing", "orders"]),
            strings(&["a", "c"]),
            "permanent failure: customer ",
        ),
        (
            &unavailable_fp,
            strings(&["orders"]),
            strings(&["b"]),
            "webhook of subscription orders answered 503",
        ),
        (
            &not_found_fp,
            strings(&["billing"]),
            strings(&["c"]),
            "webhook of subscription billing answered 404",
        ),
    ];
    for (fingerprint, subscriptions, topics, sample) in &expected {
        let g = group(&groups, fingerprint)?;
        assert_eq!(&g.subscriptions, subscriptions, "{fingerprint}");
        assert_eq!(&g.topics, topics, "{fingerprint}");
        assert!(g.sample_error.starts_with(sample), "{g:?}");
        let (listed, oldest, newest) = dead_at_range(store, &by_fingerprint(fingerprint)).await?;
        assert_eq!(
            listed as u64, g.count,
            "{fingerprint}: the listing by fingerprint"
        );
        assert_eq!(
            store
                .count_dead_letters(&by_fingerprint(fingerprint))
                .await?,
            g.count
        );
        assert_eq!(
            (g.first_seen, g.last_seen),
            (oldest, newest),
            "{fingerprint}"
        );
    }
    let (missing_g, unavailable_g) = (
        group(&groups, &missing_fp)?,
        group(&groups, &unavailable_fp)?,
    );
    assert!(
        missing_g.first_seen < unavailable_g.first_seen,
        "{groups:#?}"
    );
    assert!(missing_g.last_seen > unavailable_g.last_seen, "{groups:#?}");

    // A tenant sees its own dead letters' groups only.
    let t1 = DeadLetterFilter {
        tenant: Some("t1".into()),
        ..DeadLetterFilter::default()
    };
    let t1_groups = store.dead_letter_groups(&t1, 100).await?;
    let t1_counts: Vec<(&str, u64)> = t1_groups
        .iter()
        .map(|g| (g.fingerprint.as_str(), g.count))
        .collect();
    assert_eq!(
        t1_counts,
        [
            (missing_fp.as_str(), 75),
            (unavailable_fp.as_str(), 50),
            (not_found_fp.as_str(), 25)
        ]
    );
    let nobody = DeadLetterFilter {
        tenant: Some("nobody".into()),
        ..DeadLetterFilter::default()
    };
    assert!(store.dead_letter_groups(&nobody, 100).await?.is_empty());
    let one = store
        .dead_letter_groups(&by_fingerprint(&not_found_fp), 100)
        .await?;
    assert_eq!(one.len(), 1);
    assert_eq!(&one[0], group(&groups, &not_found_fp)?);
    assert_eq!(
        store.dead_letter_groups(&any, 1).await?.len(),
        1,
        "the limit"
    );

    // Retry one group, one tenant's part first: the others do not move.
    let unavailable_t1 = DeadLetterFilter {
        tenant: Some("t1".into()),
        fingerprint: Some(unavailable_fp.clone()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        store.retry_dead_letters_matching(&unavailable_t1).await?,
        50
    );
    let after_t1 = store.dead_letter_groups(&any, 100).await?;
    assert_eq!(group(&after_t1, &unavailable_fp)?.count, 50);
    assert!(store
        .dead_letter_groups(&unavailable_t1, 100)
        .await?
        .is_empty());
    assert_eq!(
        store
            .retry_dead_letters_matching(&by_fingerprint(&unavailable_fp))
            .await?,
        50
    );
    let after_retry = store.dead_letter_groups(&any, 100).await?;
    assert_eq!(
        after_retry,
        [
            group(&groups, &missing_fp)?.clone(),
            group(&groups, &not_found_fp)?.clone()
        ],
        "the other groups are untouched"
    );
    assert_eq!(
        store
            .count_dead_letters(&by_fingerprint(&unavailable_fp))
            .await?,
        0,
        "the retried group is deliverable again"
    );

    // Discard another: the last one stays as it was.
    assert_eq!(
        store
            .discard_dead_letters_matching(&by_fingerprint(&not_found_fp))
            .await?,
        50
    );
    assert_eq!(
        store.dead_letter_groups(&any, 100).await?,
        [group(&groups, &missing_fp)?.clone()]
    );

    // A fingerprint that is none is refused by name everywhere.
    let bad = by_fingerprint("NOT-A-FINGERPRINT");
    let refused = |result: Result<u64, StoreError>| matches!(result, Err(StoreError::Invalid(ref e)) if e.field == "fingerprint");
    assert!(matches!(
        store.dead_letter_groups(&bad, 10).await,
        Err(StoreError::Invalid(ref e)) if e.field == "fingerprint"
    ));
    assert!(refused(store.count_dead_letters(&bad).await));
    assert!(refused(store.retry_dead_letters_matching(&bad).await));
    assert!(refused(store.discard_dead_letters_matching(&bad).await));
    assert_eq!(store.count_dead_letters(&any).await?, 150);
    Ok(())
}

/// Deliveries dead-lettered by the rescuer (their lease expired at the last
/// attempt) group under the expiry's own fingerprint: every expiry is one
/// group, whichever worker held the lease.
pub async fn rescued_dead_letters_group_as_one_expiry<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "s", &["x"]).await?;
    store
        .publish_batch(&[message("t1", "x")?, message("t1", "x")?])
        .await?;
    let mut first = params("s", vec![route("x", 1, 1)], 1);
    first.worker_id = "worker-a".into();
    assert_eq!(claim(store, &first).await?.len(), 1);
    let mut second = first.clone();
    second.worker_id = "host-b".into();
    assert_eq!(claim(store, &second).await?.len(), 1);
    fixture.expire_leases("s").await?;
    assert_eq!(store.rescue_expired(&RescueParams::at_once(10)).await?, 2);
    let groups = store
        .dead_letter_groups(&DeadLetterFilter::default(), 10)
        .await?;
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_eq!(groups[0].fingerprint, courier::lease_expired_fingerprint());
    assert_eq!(groups[0].count, 2);
    assert!(groups[0].sample_error.starts_with("lease expired"));
    Ok(())
}
