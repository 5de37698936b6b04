//! The admin suite: what operators see and control — messages with their
//! per-subscription state, listings and their filters, counts of open work,
//! subscriptions, pausing and readiness — run against PostgreSQL and SQLite.

use std::collections::HashSet;
use std::time::Duration;

use courier::{
    handler_fn, AdminStore, CancelOutcome, ClaimParams, DeliveryStats, DeliveryTotals,
    HandlerError, Message, MessageFilter, MessageKey, NewMessage, OutboxStore, Route, StatsKey,
    StoreError, SubscriptionSpec,
};
use courier_testkit::{
    backend_tests, completed_by, events, eventually, states_of, Backend, CallCounter, Event,
    PgFixture,
};
use uuid::Uuid;

fn counting(counter: CallCounter) -> impl courier::Handler<Payload = Event> {
    handler_fn(move |message: Message<Event>| {
        let counter = counter.clone();
        async move {
            counter.record(message.id, message.payload.n);
            Ok::<(), HandlerError>(())
        }
    })
}

fn rejecting() -> impl courier::Handler<Payload = Event> {
    handler_fn(|_message: Message<Event>| async {
        Err::<(), _>(HandlerError::permanent("rejected"))
    })
}

/// Claims one delivery of `subscription` on `topic` and leaves it running.
async fn claim_one<B: Backend>(backend: &B, subscription: &str, topic: &str) -> anyhow::Result<()> {
    let batch = backend
        .courier()
        .store()
        .claim(&ClaimParams {
            subscription: subscription.to_owned(),
            routes: vec![Route {
                topic: topic.to_owned(),
                schema_version: 1,
                max_attempts: 10,
            }],
            limit: 1,
            lease: Duration::from_secs(300),
            worker_id: "admin-test".to_owned(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: None,
        })
        .await?;
    anyhow::ensure!(
        batch.deliveries.len() == 1,
        "claimed {:?}",
        batch.deliveries
    );
    Ok(())
}

/// Runs `postgres`, or `sqlite` when the backend refuses it: the two dialects
/// share no time arithmetic or bookkeeping table name.
async fn execute_either<B: Backend>(
    backend: &B,
    postgres: &str,
    sqlite: &str,
) -> anyhow::Result<u64> {
    match backend.execute(postgres).await {
        Ok(rows) => Ok(rows),
        Err(_) => backend.execute(sqlite).await,
    }
}

fn filter() -> MessageFilter {
    MessageFilter::default()
}

async fn listed<B: Backend>(backend: &B, filter: &MessageFilter) -> anyhow::Result<Vec<Uuid>> {
    let page = backend
        .courier()
        .store()
        .list_messages(filter, None, 1000)
        .await?;
    Ok(page.items.iter().map(|m| m.id).collect())
}

async fn get_message_shows_each_subscription_s_state<B: Backend>(backend: B) -> anyhow::Result<()> {
    let ok = backend
        .courier()
        .worker("ok")
        .handle("topic", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let bad = backend
        .courier()
        .worker("bad")
        .handle("topic", 1, rejecting())
        .maintenance(None)
        .build()
        .await?;
    // Registered, then offline: its delivery waits.
    backend
        .courier()
        .worker("idle")
        .handle("topic", 1, counting(CallCounter::default()))
        .build()
        .await?;
    let message = NewMessage::new("acme", "topic", &Event { n: 7 })?
        .with_header("trace", "abc")
        .with_ordering_key("order-1")
        .with_idempotency_key("once");
    backend
        .enqueue_committed(std::slice::from_ref(&message))
        .await?;
    assert_eq!(ok.run_once().await?, 1);
    assert_eq!(bad.run_once().await?, 1);

    let (stored, deliveries) = backend
        .courier()
        .store()
        .get_message(message.id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("message not found"))?;
    assert_eq!(stored.id, message.id);
    assert_eq!(
        (stored.tenant.as_str(), stored.topic.as_str()),
        ("acme", "topic")
    );
    assert_eq!(stored.schema_version, 1);
    let payload: Event = serde_json::from_str(&stored.payload)?;
    assert_eq!(payload, Event { n: 7 });
    assert_eq!(stored.headers.get("trace").map(String::as_str), Some("abc"));
    assert_eq!(stored.ordering_key.as_deref(), Some("order-1"));
    assert_eq!(stored.idempotency_key.as_deref(), Some("once"));

    let states: Vec<(&str, &str, i32, usize)> = deliveries
        .iter()
        .map(|d| {
            (
                d.subscription.as_str(),
                d.state.as_str(),
                d.attempts,
                d.errors.len(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("bad", "dead", 1, 1),
            ("idle", "available", 0, 0),
            ("ok", "completed", 0, 0),
        ]
    );
    assert!(deliveries[0].errors[0].message.contains("rejected"));

    assert!(backend
        .courier()
        .store()
        .get_message(Uuid::now_v7())
        .await?
        .is_none());
    Ok(())
}

async fn list_messages_pages_walk_every_message_once_newest_first<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let mut expected: Vec<Uuid> = Vec::new();
    for tenant in ["acme", "globex"] {
        for outcome in backend
            .enqueue_committed(&events(tenant, "topic", 4)?)
            .await?
        {
            expected.push(outcome.id);
        }
    }
    expected.sort_unstable_by(|a, b| b.cmp(a));
    let store = backend.courier().store();

    let mut walked = Vec::new();
    let mut pages = 0;
    let mut before = None;
    loop {
        let page = store.list_messages(&filter(), before, 3).await?;
        pages += 1;
        assert!(page.items.len() <= 3);
        walked.extend(page.items.iter().map(|m| m.id));
        match page.next_cursor {
            Some(cursor) => {
                assert_eq!(Some(cursor), page.items.last().map(MessageKey::of));
                before = Some(cursor);
            }
            None => break,
        }
        anyhow::ensure!(pages < 10, "pagination does not end");
    }
    assert_eq!(walked, expected, "every message once, newest first");
    assert_eq!(pages, 3);

    // An exact fit ends without an empty extra page.
    let all = store.list_messages(&filter(), None, 8).await?;
    assert_eq!((all.items.len(), all.next_cursor), (8, None));
    // The limit is clamped to 1..=1000.
    let one = store.list_messages(&filter(), None, 0).await?;
    assert_eq!(one.items.len(), 1);
    assert_eq!(one.next_cursor.map(|key| key.id), Some(expected[0]));
    Ok(())
}

async fn list_messages_filters_by_tenant_topic_state_and_subscription<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    // `ok` applies topics a and b, `bad` rejects topic a, `late` is offline for a.
    let ok = backend
        .courier()
        .worker("ok")
        .handle("a", 1, counting(CallCounter::default()))
        .handle("b", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let bad = backend
        .courier()
        .worker("bad")
        .handle("a", 1, rejecting())
        .maintenance(None)
        .build()
        .await?;
    backend
        .courier()
        .worker("late")
        .handle("a", 1, counting(CallCounter::default()))
        .build()
        .await?;
    let acme_a = backend.enqueue_committed(&events("acme", "a", 2)?).await?;
    let globex_a = backend
        .enqueue_committed(&events("globex", "a", 1)?)
        .await?;
    let acme_b = backend.enqueue_committed(&events("acme", "b", 1)?).await?;
    assert_eq!(ok.run_once().await?, 4);
    assert_eq!(bad.run_once().await?, 3);
    // One of `late`'s deliveries (acme's first, by tenant turn and enqueue order) runs.
    claim_one(&backend, "late", "a").await?;

    let ids = |outcomes: &[&[courier::EnqueueOutcome]]| -> HashSet<Uuid> {
        outcomes
            .iter()
            .flat_map(|o| o.iter().map(|e| e.id))
            .collect()
    };
    let topic_a = ids(&[&acme_a, &globex_a]);
    let everything = ids(&[&acme_a, &globex_a, &acme_b]);
    let set = |v: Vec<Uuid>| v.into_iter().collect::<HashSet<_>>();
    let with = |state: Option<&str>, subscription: Option<&str>| MessageFilter {
        state: state.map(str::to_owned),
        subscription: subscription.map(str::to_owned),
        ..MessageFilter::default()
    };

    assert_eq!(set(listed(&backend, &filter()).await?), everything);

    // Tenants: a token's scope hides everyone else's messages.
    let acme_only = MessageFilter {
        tenants: Some(vec!["acme".into()]),
        ..filter()
    };
    let page = backend
        .courier()
        .store()
        .list_messages(&acme_only, None, 100)
        .await?;
    assert_eq!(page.items.len(), 3);
    assert!(page.items.iter().all(|m| m.tenant == "acme"));
    let nobody = MessageFilter {
        tenants: Some(Vec::new()),
        ..filter()
    };
    assert!(listed(&backend, &nobody).await?.is_empty());
    let both = MessageFilter {
        tenants: Some(vec!["acme".into(), "globex".into()]),
        ..filter()
    };
    assert_eq!(set(listed(&backend, &both).await?), everything);

    // Topic.
    let topic_b = MessageFilter {
        topic: Some("b".into()),
        ..filter()
    };
    assert_eq!(set(listed(&backend, &topic_b).await?), ids(&[&acme_b]));

    // State, with and without a subscription.
    assert_eq!(
        set(listed(&backend, &with(Some("dead"), None)).await?),
        topic_a
    );
    assert!(listed(&backend, &with(Some("dead"), Some("ok")))
        .await?
        .is_empty());
    assert_eq!(
        set(listed(&backend, &with(Some("completed"), None)).await?),
        everything
    );
    assert_eq!(
        set(listed(&backend, &with(Some("completed"), Some("ok"))).await?),
        everything
    );
    assert!(listed(&backend, &with(Some("completed"), Some("bad")))
        .await?
        .is_empty());
    assert_eq!(
        listed(&backend, &with(Some("running"), Some("late"))).await?,
        vec![acme_a[0].id]
    );
    assert_eq!(
        listed(&backend, &with(Some("running"), None)).await?,
        vec![acme_a[0].id]
    );
    assert_eq!(
        set(listed(&backend, &with(Some("available"), Some("late"))).await?),
        ids(&[&acme_a[1..], &globex_a])
    );
    assert!(listed(&backend, &with(Some("available"), Some("ok")))
        .await?
        .is_empty());

    // Subscription alone: owed to it or applied by it.
    assert_eq!(
        set(listed(&backend, &with(None, Some("bad"))).await?),
        topic_a
    );
    assert_eq!(
        set(listed(&backend, &with(None, Some("late"))).await?),
        topic_a
    );
    assert_eq!(
        set(listed(&backend, &with(None, Some("ok"))).await?),
        everything
    );
    assert!(listed(&backend, &with(None, Some("nobody")))
        .await?
        .is_empty());

    // Every filter at once.
    let narrow = MessageFilter {
        tenants: Some(vec!["globex".into()]),
        topic: Some("a".into()),
        state: Some("dead".into()),
        subscription: Some("bad".into()),
        ..filter()
    };
    assert_eq!(set(listed(&backend, &narrow).await?), ids(&[&globex_a]));
    Ok(())
}

async fn list_messages_filter_by_message_id_and_enqueue_range<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let early = backend.enqueue_committed(&events("acme", "t", 2)?).await?;
    // Enqueued an hour ago, by the database clock.
    execute_either(
        &backend,
        "UPDATE messages SET created_at = created_at - interval '1 hour'",
        "UPDATE messages SET created_at = created_at - 3600000",
    )
    .await?;
    let late = backend.enqueue_committed(&events("acme", "t", 2)?).await?;
    let other = backend
        .enqueue_committed(&events("globex", "t", 1)?)
        .await?;
    let store = backend.courier().store();
    let all = store.list_messages(&filter(), None, 100).await?.items;
    assert_eq!(all.len(), 5);
    let keys: Vec<MessageKey> = all.iter().map(MessageKey::of).collect();
    assert!(
        keys.windows(2)
            .all(|w| (w[0].enqueued_at, w[0].id) > (w[1].enqueued_at, w[1].id)),
        "newest first by (enqueued_at, id): {keys:?}"
    );
    let enqueued = |id: Uuid| all.iter().find(|m| m.id == id).map(|m| m.enqueued_at);
    let first_late = enqueued(late[0].id).ok_or_else(|| anyhow::anyhow!("missing"))?;
    let first_early = enqueued(early[0].id).ok_or_else(|| anyhow::anyhow!("missing"))?;
    let set = |v: Vec<Uuid>| v.into_iter().collect::<HashSet<_>>();
    let ids = |outcomes: &[&[courier::EnqueueOutcome]]| -> HashSet<Uuid> {
        outcomes
            .iter()
            .flat_map(|o| o.iter().map(|e| e.id))
            .collect()
    };

    let since = MessageFilter {
        enqueued_after: Some(first_late),
        ..filter()
    };
    let until = MessageFilter {
        enqueued_before: Some(first_late),
        ..filter()
    };
    let between = MessageFilter {
        enqueued_after: Some(first_early),
        enqueued_before: Some(first_late),
        ..filter()
    };
    // Half-open: the bound itself is in `since`, not in `until`.
    assert_eq!(set(listed(&backend, &since).await?), ids(&[&late, &other]));
    assert_eq!(set(listed(&backend, &until).await?), ids(&[&early]));
    assert_eq!(set(listed(&backend, &between).await?), ids(&[&early]));
    // A range pages like any listing.
    let first = store.list_messages(&since, None, 2).await?;
    let rest = store.list_messages(&since, first.next_cursor, 2).await?;
    assert_eq!((first.items.len(), rest.items.len()), (2, 1));
    assert_eq!(rest.next_cursor, None);

    let one = MessageFilter {
        message_id: Some(late[1].id),
        ..filter()
    };
    assert_eq!(listed(&backend, &one).await?, vec![late[1].id]);
    // Another tenant's id is not found through a scope.
    let scoped = MessageFilter {
        message_id: Some(other[0].id),
        tenants: Some(vec!["acme".into()]),
        ..filter()
    };
    assert!(listed(&backend, &scoped).await?.is_empty());
    let out_of_range = MessageFilter {
        message_id: Some(early[0].id),
        ..since.clone()
    };
    assert!(listed(&backend, &out_of_range).await?.is_empty());

    let empty = MessageFilter {
        enqueued_after: Some(first_late),
        enqueued_before: Some(first_late),
        ..filter()
    };
    match store.list_messages(&empty, None, 10).await {
        Err(StoreError::Invalid(error)) => assert_eq!(error.field, "enqueued_before"),
        other => anyhow::bail!("an empty range was not refused: {other:?}"),
    }
    Ok(())
}

async fn an_unknown_state_filter_is_refused_with_the_field<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    for state in ["done", "Dead", ""] {
        let bad = MessageFilter {
            state: Some(state.into()),
            ..filter()
        };
        match backend
            .courier()
            .store()
            .list_messages(&bad, None, 10)
            .await
        {
            Err(StoreError::Invalid(error)) => assert_eq!(error.field, "state", "{state:?}"),
            other => anyhow::bail!("{state:?} was not refused: {other:?}"),
        }
    }
    Ok(())
}

/// A delivery that failed and waits for its next attempt counts as retrying
/// (and as waiting); one that never ran and a dead letter do not.
async fn delivery_stats_count_deliveries_waiting_to_be_retried<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let flaky = backend
        .courier()
        .worker("flaky")
        .handle(
            "a",
            1,
            handler_fn(|message: Message<Event>| async move {
                if message.payload.n == 0 {
                    Err(HandlerError::permanent("poison"))
                } else {
                    Err(HandlerError::retry_after(
                        Duration::from_secs(3600),
                        "the endpoint answered 503",
                    ))
                }
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend.enqueue_committed(&events("acme", "a", 3)?).await?;
    assert_eq!(flaky.run_once().await?, 3);
    backend
        .enqueue_committed(&events("globex", "a", 2)?)
        .await?;

    let store = backend.courier().store();
    let stats = store.delivery_stats(None, None, 100).await?.items;
    let rows: Vec<(&str, i64, i64, i64, i64)> = stats
        .iter()
        .map(|s| (s.topic.as_str(), s.available, s.retrying, s.running, s.dead))
        .collect();
    // acme: n = 0 dead, n = 1 and 2 retrying in an hour; globex: two never tried.
    assert_eq!(rows, vec![("a", 4, 2, 0, 1)]);
    let totals = store.delivery_totals(None, None).await?;
    assert_eq!(
        (
            totals.available,
            totals.retrying,
            totals.running,
            totals.dead
        ),
        (4, 2, 0, 1)
    );
    let globex = vec!["globex".to_owned()];
    let scoped = store.delivery_totals(Some(&globex), None).await?;
    assert_eq!((scoped.available, scoped.retrying, scoped.dead), (2, 0, 0));
    let scoped = store.delivery_stats(Some(&globex), None, 100).await?.items;
    let retrying: Vec<i64> = scoped.iter().map(|s| s.retrying).collect();
    assert_eq!(retrying, vec![0]);
    Ok(())
}

async fn delivery_stats_count_open_deliveries_and_the_oldest_age<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let bad = backend
        .courier()
        .worker("bad")
        .handle("a", 1, rejecting())
        .maintenance(None)
        .build()
        .await?;
    let ok = backend
        .courier()
        .worker("ok")
        .handle("a", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    backend
        .courier()
        .worker("late")
        .handle("a", 1, counting(CallCounter::default()))
        .build()
        .await?;
    backend.enqueue_committed(&events("acme", "a", 3)?).await?;
    backend
        .enqueue_committed(&events("globex", "a", 1)?)
        .await?;
    assert_eq!(bad.run_once().await?, 4);
    assert_eq!(ok.run_once().await?, 4);
    claim_one(&backend, "late", "a").await?;
    // Enqueued a minute ago, by the database's clock.
    execute_either(
        &backend,
        "UPDATE deliveries SET created_at = created_at - interval '60 seconds'",
        "UPDATE deliveries SET created_at = created_at - 60000",
    )
    .await?;

    let store = backend.courier().store();
    let stats = store.delivery_stats(None, None, 100).await?.items;
    // `ok` has nothing open, so it has no row.
    let rows: Vec<(&str, &str, i64, i64, i64)> = stats
        .iter()
        .map(|s| {
            (
                s.subscription.as_str(),
                s.topic.as_str(),
                s.available,
                s.running,
                s.dead,
            )
        })
        .collect();
    assert_eq!(rows, vec![("bad", "a", 0, 0, 4), ("late", "a", 3, 1, 0)]);
    assert_eq!(
        stats[0].oldest_pending_age_seconds, None,
        "dead letters are not pending"
    );
    let age = stats[1]
        .oldest_pending_age_seconds
        .ok_or_else(|| anyhow::anyhow!("no oldest age"))?;
    assert!((60.0..3600.0).contains(&age), "oldest age {age}");

    let globex = vec!["globex".to_owned()];
    let scoped = store.delivery_stats(Some(&globex), None, 100).await?.items;
    let rows: Vec<(&str, i64, i64, i64)> = scoped
        .iter()
        .map(|s| (s.subscription.as_str(), s.available, s.running, s.dead))
        .collect();
    // The tenant turn starts with acme, so globex's delivery is still waiting.
    assert_eq!(rows, vec![("bad", 0, 0, 1), ("late", 1, 0, 0)]);
    assert!(store
        .delivery_stats(Some(&[]), None, 100)
        .await?
        .items
        .is_empty());

    // Totals: the sums of the rows, the oldest of their ages.
    let totals = store.delivery_totals(None, None).await?;
    assert_eq!((totals.available, totals.running, totals.dead), (3, 1, 4));
    assert_eq!(
        totals.oldest_pending_age_seconds.map(|age| age >= 60.0),
        Some(true)
    );
    let late = store.delivery_totals(Some(&globex), Some("late")).await?;
    assert_eq!((late.available, late.running, late.dead), (1, 0, 0));
    assert_eq!(
        store.delivery_totals(Some(&[]), None).await?,
        DeliveryTotals::default()
    );
    Ok(())
}

/// Every row of `delivery_stats`, walking pages of `limit`.
async fn walk_stats<S: AdminStore>(
    store: &S,
    tenants: Option<&[String]>,
    limit: usize,
) -> anyhow::Result<Vec<DeliveryStats>> {
    let mut walked = Vec::new();
    let mut after: Option<StatsKey> = None;
    for _ in 0..100 {
        let page = store.delivery_stats(tenants, after.as_ref(), limit).await?;
        assert!(page.items.len() <= limit);
        walked.extend(page.items);
        match page.next_cursor {
            Some(key) => after = Some(key),
            None => return Ok(walked),
        }
    }
    anyhow::bail!("pagination does not end")
}

async fn delivery_stats_page_by_subscription_then_topic_in_byte_order<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    // Upper case sorts before lower case in byte order, whatever the collation.
    for (name, topics) in [
        ("b", vec!["y", "X", "x"]),
        ("B", vec!["x"]),
        ("a", vec!["x", "y"]),
    ] {
        store
            .register_subscription(&SubscriptionSpec::new(name, topics))
            .await?;
    }
    for topic in ["x", "y", "X"] {
        backend
            .enqueue_committed(&events("acme", topic, 2)?)
            .await?;
        backend
            .enqueue_committed(&events("globex", topic, 1)?)
            .await?;
    }
    let pairs = |rows: &[DeliveryStats]| -> Vec<(String, String, i64)> {
        rows.iter()
            .map(|r| (r.subscription.clone(), r.topic.clone(), r.available))
            .collect()
    };
    let everything = walk_stats(store, None, 1000).await?;
    let expected = |n: i64| -> Vec<(String, String, i64)> {
        [
            ("B", "x"),
            ("a", "x"),
            ("a", "y"),
            ("b", "X"),
            ("b", "x"),
            ("b", "y"),
        ]
        .iter()
        .map(|(s, t)| ((*s).to_owned(), (*t).to_owned(), n))
        .collect()
    };
    assert_eq!(pairs(&everything), expected(3));
    for limit in [1, 2, 4] {
        assert_eq!(
            pairs(&walk_stats(store, None, limit).await?),
            expected(3),
            "{limit}"
        );
    }
    let globex = vec!["globex".to_owned()];
    assert_eq!(
        pairs(&walk_stats(store, Some(&globex), 2).await?),
        expected(1)
    );
    Ok(())
}

async fn list_subscriptions_shows_patterns_and_paused<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend
        .courier()
        .worker("billing")
        .handle("order.refunded", 1, counting(CallCounter::default()))
        .handle("order.placed", 1, counting(CallCounter::default()))
        .build()
        .await?;
    let store = backend.courier().store();
    store
        .register_subscription(&SubscriptionSpec {
            name: "audit".into(),
            topics: vec!["order.*".into(), "*".into()],
            replay: None,
        })
        .await?;
    assert!(store.set_subscription_paused("audit", true).await?);

    let subscriptions = store.list_subscriptions(None, 100).await?.items;
    let shown: Vec<(&str, Vec<&str>, bool)> = subscriptions
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.topics.iter().map(String::as_str).collect(),
                s.paused,
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("audit", vec!["*", "order.*"], true),
            ("billing", vec!["order.placed", "order.refunded"], false),
        ]
    );
    assert!(
        subscriptions[0].created_at >= subscriptions[1].created_at,
        "audit was created after billing"
    );
    assert_eq!(
        store.get_subscription("audit").await?.as_ref(),
        subscriptions.first()
    );
    assert_eq!(store.get_subscription("nobody").await?, None);
    Ok(())
}

async fn subscriptions_page_by_name_in_byte_order<B: Backend>(backend: B) -> anyhow::Result<()> {
    let store = backend.courier().store();
    let names = ["Zulu", "alpha", "alpha-2", "alpha.1", "beta", "x"];
    for name in names.iter().rev() {
        store
            .register_subscription(&SubscriptionSpec::new(*name, ["t"]))
            .await?;
    }
    for limit in [1, 2, 4, 6, 100] {
        let mut walked = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = store.list_subscriptions(after.as_deref(), limit).await?;
            pages += 1;
            assert!(page.items.len() <= limit);
            walked.extend(page.items.iter().map(|s| s.name.clone()));
            match page.next_cursor {
                Some(name) => {
                    assert_eq!(Some(&name), walked.last());
                    after = Some(name);
                }
                None => break,
            }
            anyhow::ensure!(pages < 20, "pagination does not end");
        }
        assert_eq!(walked, names, "limit {limit}");
        assert_eq!(pages, names.len().div_ceil(limit), "no empty last page");
    }
    Ok(())
}

async fn a_paused_subscription_claims_nothing_until_resumed<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    let other = backend
        .courier()
        .worker("other")
        .handle("topic", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let store = backend.courier().store();
    assert!(store.set_subscription_paused("sub", true).await?);
    backend
        .enqueue_committed(&events("acme", "topic", 3)?)
        .await?;

    assert_eq!(
        worker.run_once().await?,
        0,
        "a paused subscription claims nothing"
    );
    assert_eq!(counter.total(), 0);
    assert_eq!(
        backend
            .scalar(
                "SELECT count(*) FROM deliveries
                 WHERE subscription = 'sub' AND state = 'available' AND attempts = 0"
            )
            .await?,
        3,
        "its deliveries wait without spending attempts"
    );
    // Rebuilding the worker (a restart re-registers) keeps the pause.
    let restarted = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    assert_eq!(restarted.run_once().await?, 0);
    // Another subscription of the same messages is not held back.
    assert_eq!(other.run_once().await?, 3);

    assert!(store.set_subscription_paused("sub", false).await?);
    assert_eq!(worker.run_once().await?, 3);
    assert_eq!(counter.distinct(), 3);
    assert_eq!(completed_by(store, "sub").await?, 3);
    Ok(())
}

async fn pausing_an_unknown_subscription_reports_it_missing<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    assert!(!store.set_subscription_paused("nobody", true).await?);
    assert!(!store.set_subscription_paused("nobody", false).await?);
    assert!(store.list_subscriptions(None, 100).await?.items.is_empty());
    Ok(())
}

async fn ready_is_true_after_migrate_and_false_when_the_schema_is_behind<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    assert!(store.ready().await?);
    // As if the database had been restored from before the last migration.
    execute_either(
        &backend,
        "DELETE FROM schema_migrations",
        "DELETE FROM courier_schema_migrations",
    )
    .await?;
    assert!(!store.ready().await?);
    Ok(())
}

async fn cancel_removes_a_message_no_subscription_started_on<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let calls = CallCounter::default();
    let first = backend
        .courier()
        .worker("first")
        .handle("topic", 1, counting(calls.clone()))
        .maintenance(None)
        .build()
        .await?;
    let second = backend
        .courier()
        .worker("second")
        .handle("topic", 1, counting(calls.clone()))
        .maintenance(None)
        .build()
        .await?;
    let scheduled = NewMessage::new("acme", "topic", &Event { n: 1 })?
        .delay(Duration::from_secs(3600))
        .with_idempotency_key("nightly");
    let waiting = NewMessage::new("acme", "topic", &Event { n: 2 })?;
    let kept = NewMessage::new("acme", "topic", &Event { n: 3 })?;
    backend
        .enqueue_committed(&[scheduled.clone(), waiting.clone(), kept.clone()])
        .await?;
    let store = backend.courier().store();

    // Scheduled or due, a message nobody has tried is cancelled with its
    // delivery to each subscription.
    assert_eq!(
        store.cancel_message(scheduled.id).await?,
        CancelOutcome::Cancelled { deliveries: 2 }
    );
    assert_eq!(
        store.cancel_message(waiting.id).await?,
        CancelOutcome::Cancelled { deliveries: 2 }
    );
    assert!(store.get_message(scheduled.id).await?.is_none());
    assert!(store.get_message(waiting.id).await?.is_none());
    assert_eq!(
        store.cancel_message(waiting.id).await?,
        CancelOutcome::NotFound
    );
    assert_eq!(
        store.cancel_message(Uuid::now_v7()).await?,
        CancelOutcome::NotFound
    );

    // Only the kept message is delivered, once to each subscription.
    assert_eq!(first.run_once().await?, 1);
    assert_eq!(second.run_once().await?, 1);
    assert_eq!(first.run_once().await? + second.run_once().await?, 0);
    assert_eq!((calls.calls(kept.id), calls.total()), (2, 2));

    // The idempotency key is free again: the same key stores a new message.
    let again = NewMessage::new("acme", "topic", &Event { n: 4 })?.with_idempotency_key("nightly");
    let outcomes = backend
        .courier()
        .store()
        .publish_batch(std::slice::from_ref(&again))
        .await?;
    assert_eq!((outcomes[0].id, outcomes[0].duplicate), (again.id, false));
    Ok(())
}

async fn cancel_is_refused_once_a_subscription_started_and_changes_nothing<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let done = backend
        .courier()
        .worker("done")
        .handle("topic", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let bad = backend
        .courier()
        .worker("bad")
        .handle("topic", 1, rejecting())
        .maintenance(None)
        .build()
        .await?;
    let store = backend.courier().store();

    // Leased by its one subscription.
    let completed = NewMessage::new("acme", "completed", &Event { n: 1 })?;
    // Completed by one subscription, then dead-lettered by another and
    // leased by a third.
    let dead = NewMessage::new("acme", "topic", &Event { n: 2 })?;
    for spec in [
        SubscriptionSpec::new("late", ["completed"]),
        SubscriptionSpec::new("held", ["topic"]),
    ] {
        store.register_subscription(&spec).await?;
    }
    backend
        .enqueue_committed(&[completed.clone(), dead.clone()])
        .await?;

    assert_eq!(done.run_once().await?, 1);
    let refused = store.cancel_message(dead.id).await?;
    assert_eq!(
        refused,
        CancelOutcome::Started {
            subscription: "done".into(),
            state: "completed".into()
        }
    );
    assert_eq!(bad.run_once().await?, 1);
    claim_one(&backend, "held", "topic").await?;
    let (_, deliveries) = store
        .get_message(dead.id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a refused cancel removed the message"))?;
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    assert_eq!(
        store.cancel_message(dead.id).await?,
        CancelOutcome::Started {
            subscription: "bad".into(),
            state: "dead".into()
        }
    );

    claim_one(&backend, "late", "completed").await?;
    assert_eq!(
        store.cancel_message(completed.id).await?,
        CancelOutcome::Started {
            subscription: "late".into(),
            state: "running".into()
        }
    );
    let (_, deliveries) = store
        .get_message(completed.id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a refused cancel removed the message"))?;
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    Ok(())
}

async fn a_message_a_handler_snoozed_is_not_cancelled<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let deferring = backend
        .courier()
        .worker("deferring")
        .handle(
            "topic",
            1,
            handler_fn(|_message: Message<Event>| async {
                Err::<(), _>(HandlerError::snooze(
                    Duration::from_secs(3600),
                    "quota exhausted",
                ))
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    let message = NewMessage::new("acme", "topic", &Event { n: 1 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&message))
        .await?;
    assert_eq!(deferring.run_once().await?, 1);
    assert_eq!(
        backend.courier().store().cancel_message(message.id).await?,
        CancelOutcome::Started {
            subscription: "deferring".into(),
            state: "snoozed".into()
        }
    );
    assert!(backend
        .courier()
        .store()
        .get_message(message.id)
        .await?
        .is_some());
    Ok(())
}

async fn cancelling_an_ordering_key_s_scheduled_head_lets_the_next_run<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let calls = CallCounter::default();
    let worker = backend
        .courier()
        .worker("ordered")
        .handle("topic", 1, counting(calls.clone()))
        .maintenance(None)
        .build()
        .await?;
    let head = NewMessage::new("acme", "topic", &Event { n: 1 })?
        .with_ordering_key("k")
        .delay(Duration::from_secs(3600));
    let next = NewMessage::new("acme", "topic", &Event { n: 2 })?.with_ordering_key("k");
    backend
        .enqueue_committed(&[head.clone(), next.clone()])
        .await?;
    assert_eq!(
        worker.run_once().await?,
        0,
        "the scheduled head holds its key"
    );
    assert_eq!(
        backend.courier().store().cancel_message(head.id).await?,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(calls.calls(next.id), 1);
    Ok(())
}

async fn cancels_racing_claims_never_both_cancel_and_deliver<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let calls = CallCounter::default();
    // The first handlers wait until the first cancel has returned, so the
    // cancels always meet the drain (else a fast drain could finish all 300
    // between two looks at the counter).
    let (open, gate) = tokio::sync::watch::channel(false);
    let gated = {
        let calls = calls.clone();
        handler_fn(move |message: Message<Event>| {
            let calls = calls.clone();
            let mut gate = gate.clone();
            async move {
                calls.record(message.id, message.payload.n);
                gate.wait_for(|open| *open)
                    .await
                    .map_err(HandlerError::permanent)?;
                Ok::<(), HandlerError>(())
            }
        })
    };
    let worker = std::sync::Arc::new(
        backend
            .courier()
            .worker("raced")
            .handle("topic", 1, gated)
            // Small claims, so the drain takes many of them and the cancels
            // meet it however the machine is loaded (a claim of 256 took
            // everything a cancel had not reached yet).
            .batch_size(8)
            .concurrency(8)
            .maintenance(None)
            .build()
            .await?,
    );
    let messages = events("acme", "topic", 300)?;
    backend.enqueue_committed(&messages).await?;
    let drain = {
        let worker = std::sync::Arc::clone(&worker);
        tokio::spawn(async move {
            let mut idle = 0;
            while idle < 3 {
                if worker.run_once().await? == 0 {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    idle = 0;
                }
            }
            anyhow::Ok(())
        })
    };
    // Cancels walk from the newest while the worker drains from the oldest,
    // once it has started: they meet somewhere in the middle.
    let started = eventually(Duration::from_secs(10), || async { calls.total() > 0 }).await;
    anyhow::ensure!(started, "the worker delivered nothing");
    let mut cancelled = HashSet::new();
    for message in messages.iter().rev() {
        let outcome = backend.courier().store().cancel_message(message.id).await?;
        open.send_replace(true);
        match outcome {
            CancelOutcome::Cancelled { deliveries } => {
                assert_eq!(deliveries, 1);
                cancelled.insert(message.id);
            }
            CancelOutcome::Started { subscription, .. } => assert_eq!(subscription, "raced"),
            CancelOutcome::NotFound => anyhow::bail!("message {} vanished", message.id),
        }
    }
    drain.await??;
    while worker.run_once().await? > 0 {}
    for message in &messages {
        let handled = calls.calls(message.id);
        if cancelled.contains(&message.id) {
            assert_eq!(handled, 0, "cancelled message {} was delivered", message.id);
        } else {
            assert_eq!(
                handled, 1,
                "message {} delivered {handled} times",
                message.id
            );
        }
    }
    assert!(
        !cancelled.is_empty() && cancelled.len() < messages.len(),
        "the race was not run: {} of {} cancelled",
        cancelled.len(),
        messages.len()
    );
    Ok(())
}

fn owned((subscription, state): (&str, &str)) -> (String, String) {
    (subscription.to_owned(), state.to_owned())
}

/// A plain handler's completion leaves no record: a message reads
/// `completed` for each subscription that receives it (its topic matched a
/// pattern from before it was enqueued, or a replay reached it) once it has no
/// open delivery there, in the message view, the `completed` listing and
/// cancel alike. A subscription registered after it, or a pattern added
/// after it, was never owed it; a discarded dead letter reads `discarded`
/// and goes with its message.
async fn completed_is_read_from_the_subscriptions_a_message_is_owed_to<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    let counter = CallCounter::default();
    let early = backend
        .courier()
        .worker("early")
        .handle("t", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    let first = NewMessage::new("acme", "t", &Event { n: 1 })?;
    let other_topic = NewMessage::new("acme", "u", &Event { n: 2 })?;
    backend
        .enqueue_committed(&[first.clone(), other_topic.clone()])
        .await?;
    store
        .register_subscription(&SubscriptionSpec::new("late", ["t"]))
        .await?;
    store
        .register_subscription(
            &SubscriptionSpec::new("replayer", ["t"]).with_replay(courier::Replay::All),
        )
        .await?;
    // `u` joins early's patterns after other_topic was enqueued.
    store
        .register_subscription(&SubscriptionSpec::new("early", ["t", "u"]))
        .await?;
    let replayer = backend
        .courier()
        .worker("replayer")
        .handle("t", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    assert_eq!(early.run_once().await?, 1);
    assert_eq!(replayer.run_once().await?, 1);
    assert_eq!(counter.total(), 2);
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 0);

    assert_eq!(
        states_of(store, first.id).await?,
        [("early", "completed"), ("replayer", "completed")].map(owned)
    );
    let states = states_of(store, other_topic.id).await?;
    assert!(states.is_empty(), "{states:?}");
    assert_eq!(completed_by(store, "early").await?, 1);
    assert_eq!(completed_by(store, "replayer").await?, 1);
    assert_eq!(completed_by(store, "late").await?, 0);
    assert_eq!(
        store.cancel_message(first.id).await?,
        CancelOutcome::Started {
            subscription: "early".into(),
            state: "completed".into()
        }
    );
    // Nobody completed other_topic: it is cancelled.
    assert_eq!(
        store.cancel_message(other_topic.id).await?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );

    // A discarded dead letter is never taken for completed.
    let poison = NewMessage::new("acme", "t", &Event { n: 3 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&poison))
        .await?;
    let rejecting_worker = backend
        .courier()
        .worker("late")
        .handle("t", 1, rejecting())
        .maintenance(None)
        .build()
        .await?;
    assert_eq!(rejecting_worker.run_once().await?, 1);
    assert_eq!(early.run_once().await?, 1);
    assert_eq!(replayer.run_once().await?, 1);
    let discarded = backend
        .courier()
        .discard_dead_letters_matching(&courier::DeadLetterFilter::default())
        .await?;
    assert_eq!(discarded, 1);
    assert_eq!(
        states_of(store, poison.id).await?,
        [
            ("early", "completed"),
            ("late", "discarded"),
            ("replayer", "completed")
        ]
        .map(owned)
    );
    assert_eq!(completed_by(store, "late").await?, 0);
    // Retention removes the discard with its message.
    assert_eq!(backend.scalar("SELECT count(*) FROM discards").await?, 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(store.prune(Duration::ZERO, 100).await?.messages, 2);
    assert_eq!(backend.scalar("SELECT count(*) FROM discards").await?, 0);
    Ok(())
}

/// Removing a topic keeps what the subscription completed on it: it still
/// reads completed, and cancel is still refused.
async fn a_removed_topic_keeps_what_it_completed<B: Backend>(backend: B) -> anyhow::Result<()> {
    let store = backend.courier().store();
    let worker = backend
        .courier()
        .worker("s")
        .handle("t", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let done = NewMessage::new("acme", "t", &Event { n: 1 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&done))
        .await?;
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(
        store
            .remove_subscription_topics("s", &["t".to_owned()])
            .await?,
        1
    );
    assert_eq!(
        states_of(store, done.id).await?,
        [("s", "completed")].map(owned)
    );
    assert_eq!(
        store.cancel_message(done.id).await?,
        CancelOutcome::Started {
            subscription: "s".into(),
            state: "completed".into()
        }
    );
    Ok(())
}

/// A delivery still open when its pattern is removed stays owed: once its
/// plain handler completes it, the message reads completed and cannot be
/// cancelled.
async fn a_delivery_open_when_its_topic_is_removed_reads_completed_once_done<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store();
    let worker = backend
        .courier()
        .worker("s")
        .handle("t", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let open = NewMessage::new("acme", "t", &Event { n: 1 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&open))
        .await?;
    assert_eq!(
        store
            .remove_subscription_topics("s", &["t".to_owned()])
            .await?,
        1
    );
    assert_eq!(worker.run_once().await?, 1, "what was owed stays owed");
    assert_eq!(
        states_of(store, open.id).await?,
        [("s", "completed")].map(owned)
    );
    assert_eq!(
        store.cancel_message(open.id).await?,
        CancelOutcome::Started {
            subscription: "s".into(),
            state: "completed".into()
        }
    );
    // A message enqueued after the removal is owed nothing and reads so.
    let later = NewMessage::new("acme", "t", &Event { n: 2 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&later))
        .await?;
    assert!(states_of(store, later.id).await?.is_empty());
    // Adding the pattern back owes what comes after, not what came between.
    store
        .register_subscription(&SubscriptionSpec::new("s", ["t"]))
        .await?;
    let again = NewMessage::new("acme", "t", &Event { n: 3 })?;
    backend
        .enqueue_committed(std::slice::from_ref(&again))
        .await?;
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(
        states_of(store, again.id).await?,
        [("s", "completed")].map(owned)
    );
    assert!(states_of(store, later.id).await?.is_empty());
    assert_eq!(
        states_of(store, open.id).await?,
        [("s", "completed")].map(owned)
    );
    // Retention keeps the removed pattern while a message older than its
    // removal is retained, and forgets it with the last such message.
    assert_eq!(
        store.prune(Duration::from_secs(3600), 100).await?.messages,
        0
    );
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM removed_topics")
            .await?,
        1
    );
    assert_eq!(store.prune(Duration::ZERO, 100).await?.messages, 3);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM removed_topics")
            .await?,
        0
    );
    Ok(())
}

/// A PostgreSQL producer whose transaction began before a registration and
/// committed after it is owed to the new subscription (its `created_at`, the
/// transaction's start, is older than the registration): once a plain
/// handler completed it, it reads completed and cannot be cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_producer_older_than_a_registration_reads_completed_once_done(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let store = pg.courier().store();
    let mut producer = pg.pool.begin().await?;
    sqlx::query("SELECT 1").execute(&mut *producer).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let worker = pg
        .courier()
        .worker("late")
        .handle("t", 1, counting(CallCounter::default()))
        .maintenance(None)
        .build()
        .await?;
    let message = NewMessage::new("acme", "t", &Event { n: 1 })?;
    pg.courier().enqueue(&mut producer, &message).await?;
    producer.commit().await?;
    assert_eq!(worker.run_once().await?, 1, "the registration came first");
    assert_eq!(
        states_of(store, message.id).await?,
        [("late", "completed")].map(owned)
    );
    assert_eq!(
        store.cancel_message(message.id).await?,
        CancelOutcome::Started {
            subscription: "late".into(),
            state: "completed".into()
        }
    );
    Ok(())
}

backend_tests!(
    completed_is_read_from_the_subscriptions_a_message_is_owed_to,
    a_removed_topic_keeps_what_it_completed,
    a_delivery_open_when_its_topic_is_removed_reads_completed_once_done,
    get_message_shows_each_subscription_s_state,
    list_messages_pages_walk_every_message_once_newest_first,
    list_messages_filters_by_tenant_topic_state_and_subscription,
    list_messages_filter_by_message_id_and_enqueue_range,
    an_unknown_state_filter_is_refused_with_the_field,
    delivery_stats_count_open_deliveries_and_the_oldest_age,
    delivery_stats_count_deliveries_waiting_to_be_retried,
    delivery_stats_page_by_subscription_then_topic_in_byte_order,
    list_subscriptions_shows_patterns_and_paused,
    subscriptions_page_by_name_in_byte_order,
    a_paused_subscription_claims_nothing_until_resumed,
    pausing_an_unknown_subscription_reports_it_missing,
    ready_is_true_after_migrate_and_false_when_the_schema_is_behind,
    cancel_removes_a_message_no_subscription_started_on,
    cancel_is_refused_once_a_subscription_started_and_changes_nothing,
    cancelling_an_ordering_key_s_scheduled_head_lets_the_next_run,
    a_message_a_handler_snoozed_is_not_cancelled,
    cancels_racing_claims_never_both_cancel_and_deliver,
);
