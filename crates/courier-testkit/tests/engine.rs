//! The engine suite: every contract point, run against PostgreSQL and SQLite.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{
    handler_fn, AdminStore, DeadLetterFilter, HandlerError, MaintenanceConfig, Message, NewMessage,
    RetryPolicy,
};
use courier_testkit::{
    backend_tests, completed_by, events, eventually, Backend, CallCounter, EffectConnection, Event,
    RecordEffect,
};

const WAIT: Duration = Duration::from_secs(30);

fn fast_retry(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base: Duration::from_millis(1),
        cap: Duration::from_millis(5),
    }
}

fn counting(counter: CallCounter) -> impl courier::Handler<Payload = Event> {
    handler_fn(move |message: Message<Event>| {
        let counter = counter.clone();
        async move {
            counter.record(message.id, message.payload.n);
            Ok::<(), HandlerError>(())
        }
    })
}

async fn pending<B: Backend>(backend: &B) -> anyhow::Result<i64> {
    backend
        .scalar("SELECT count(*) FROM deliveries WHERE state <> 'dead'")
        .await
}

async fn drained<B: Backend>(backend: &B) -> bool {
    matches!(pending(backend).await, Ok(0))
}

async fn rolled_back_enqueue_leaves_no_message<B: Backend>(backend: B) -> anyhow::Result<()> {
    backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .build()
        .await?;
    backend
        .enqueue_rolled_back(&events("acme", "topic", 3)?)
        .await?;
    assert_eq!(backend.scalar("SELECT count(*) FROM messages").await?, 0);
    assert_eq!(backend.scalar("SELECT count(*) FROM deliveries").await?, 0);
    backend
        .enqueue_committed(&events("acme", "topic", 3)?)
        .await?;
    assert_eq!(backend.scalar("SELECT count(*) FROM messages").await?, 3);
    assert_eq!(backend.scalar("SELECT count(*) FROM deliveries").await?, 3);
    Ok(())
}

async fn idempotent_enqueue_returns_the_first_id<B: Backend>(backend: B) -> anyhow::Result<()> {
    let first = NewMessage::new("acme", "topic", &Event { n: 1 })?.with_idempotency_key("order-7");
    let again = NewMessage::new("acme", "topic", &Event { n: 2 })?.with_idempotency_key("order-7");
    let other_tenant =
        NewMessage::new("globex", "topic", &Event { n: 3 })?.with_idempotency_key("order-7");
    let outcomes = backend
        .enqueue_committed(std::slice::from_ref(&first))
        .await?;
    assert_eq!((outcomes[0].id, outcomes[0].duplicate), (first.id, false));
    let outcomes = backend
        .enqueue_committed(&[again.clone(), other_tenant.clone()])
        .await?;
    assert_eq!((outcomes[0].id, outcomes[0].duplicate), (first.id, true));
    assert_eq!(
        (outcomes[1].id, outcomes[1].duplicate),
        (other_tenant.id, false)
    );
    // Twice within one batch: the second points at the first.
    let a = NewMessage::new("acme", "topic", &Event { n: 4 })?.with_idempotency_key("k2");
    let b = NewMessage::new("acme", "topic", &Event { n: 5 })?.with_idempotency_key("k2");
    let outcomes = backend.enqueue_committed(&[a.clone(), b]).await?;
    assert_eq!((outcomes[1].id, outcomes[1].duplicate), (a.id, true));
    assert_eq!(backend.scalar("SELECT count(*) FROM messages").await?, 3);
    Ok(())
}

async fn every_subscription_applies_every_message_exactly_once<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let effect = RecordEffect::default();
    let plain = CallCounter::default();
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(
            backend
                .courier()
                .worker("ledger")
                .handle_transactional("order.placed", 1, effect.clone())
                .concurrency(16)
                .batch_size(50)
                .build()
                .await?
                .start(),
        );
        workers.push(
            backend
                .courier()
                .worker("mailer")
                .handle("order.placed", 1, counting(plain.clone()))
                .concurrency(16)
                .batch_size(50)
                .build()
                .await?
                .start(),
        );
    }
    let n = 2000;
    for chunk in events("acme", "order.placed", n)?.chunks(500) {
        backend.enqueue_committed(chunk).await?;
    }
    assert!(
        eventually(WAIT * 2, || drained(&backend)).await,
        "not drained"
    );
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM receipts WHERE subscription = 'ledger'")
            .await?,
        n
    );
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM receipts WHERE subscription = 'mailer'")
            .await?,
        0,
        "a plain handler's completion writes no receipt"
    );
    assert_eq!(completed_by(backend.courier().store(), "mailer").await?, n);
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, n);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM effects WHERE calls <> 1")
            .await?,
        0
    );
    assert_eq!(effect.counter.total(), u64::try_from(n)?);
    assert_eq!(plain.total(), u64::try_from(n)?);
    assert_eq!(plain.distinct(), usize::try_from(n)?);
    Ok(())
}

/// Records its effect like [`RecordEffect`], except that multiples of 5
/// fail permanently and 7 panics.
#[derive(Clone, Default)]
struct FailSome {
    effect: RecordEffect,
}

impl<C: EffectConnection> courier::TransactionalHandler<C> for FailSome {
    type Payload = Event;

    async fn handle(&self, message: &Message<Event>, conn: &mut C) -> Result<(), HandlerError> {
        if message.payload.n % 5 == 0 {
            return Err(HandlerError::permanent(format!(
                "refusing {}",
                message.payload.n
            )));
        }
        if message.payload.n == 7 {
            panic!("handler bug on 7");
        }
        courier::TransactionalHandler::<C>::handle(&self.effect, message, conn).await
    }
}

async fn a_failing_handler_in_a_transactional_batch_fails_alone<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let handler = FailSome::default();
    let worker = backend
        .courier()
        .worker("ledger")
        .handle_transactional("order.placed", 1, handler.clone())
        .concurrency(20)
        .batch_size(20)
        .transaction_batch_size(20)
        .retry_policy(fast_retry(1))
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "order.placed", 20)?)
        .await?;
    // One claim of all 20, run as one transactional batch that rolls back.
    assert_eq!(worker.run_once().await?, 20);
    assert_eq!(pending(&backend).await?, 0, "every delivery settled");
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, 15);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM effects WHERE calls <> 1")
            .await?,
        0,
        "no effect was applied twice"
    );
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 15);
    let dead = backend
        .courier()
        .dead_letters(&DeadLetterFilter::default(), None, 100)
        .await?;
    let mut reasons: Vec<String> = dead
        .items
        .iter()
        .map(|d| {
            d.errors
                .last()
                .map(|e| e.message.clone())
                .unwrap_or_default()
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "handler panicked: handler bug on 7",
            "permanent failure: refusing 0",
            "permanent failure: refusing 10",
            "permanent failure: refusing 15",
            "permanent failure: refusing 5"
        ]
    );
    Ok(())
}

/// Records its effect, except that payload numbers in `refuse` fail
/// permanently; counts every call.
#[derive(Clone, Default)]
struct Refuse {
    refuse: Vec<i64>,
    effect: RecordEffect,
}

impl<C: EffectConnection> courier::TransactionalHandler<C> for Refuse {
    type Payload = Event;

    async fn handle(&self, message: &Message<Event>, conn: &mut C) -> Result<(), HandlerError> {
        if self.refuse.contains(&message.payload.n) {
            self.effect.counter.record(message.id, message.payload.n);
            return Err(HandlerError::permanent("refused"));
        }
        courier::TransactionalHandler::<C>::handle(&self.effect, message, conn).await
    }
}

/// One failing handler in a group of 50 costs its batch-mates at most one
/// rerun (they run again together, each in a savepoint); for a while after,
/// groups isolate failures from the start, and a failure costs nothing else.
async fn one_failing_handler_costs_its_batch_mates_at_most_one_rerun<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    if B::KIND == "postgres" {
        // The top-level transaction each effect committed in (xmin would
        // name a savepoint's subtransaction).
        backend
            .execute("ALTER TABLE effects ADD COLUMN tx bigint DEFAULT txid_current()")
            .await?;
    }
    let handler = Refuse {
        refuse: vec![7, 57],
        ..Refuse::default()
    };
    let worker = backend
        .courier()
        .worker("ledger")
        .handle_transactional("order.placed", 1, handler.clone())
        .concurrency(50)
        .batch_size(50)
        .transaction_batch_size(50)
        .retry_policy(fast_retry(1))
        .build()
        .await?;
    let first = events("acme", "order.placed", 50)?;
    backend.enqueue_committed(&first).await?;
    assert_eq!(worker.run_once().await?, 50);
    let calls = |messages: &[NewMessage]| -> Vec<u32> {
        messages
            .iter()
            .map(|m| handler.effect.counter.calls(m.id))
            .collect()
    };
    let first_calls = calls(&first);
    assert!(
        first_calls.iter().all(|c| (1..=2).contains(c)),
        "a batch-mate ran more than twice: {first_calls:?}"
    );
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, 49);
    let second: Vec<NewMessage> = (50..100)
        .map(|n| Ok(NewMessage::new("acme", "order.placed", &Event { n })?))
        .collect::<anyhow::Result<_>>()?;
    backend.enqueue_committed(&second).await?;
    assert_eq!(worker.run_once().await?, 50);
    let second_calls = calls(&second);
    assert!(
        second_calls.iter().all(|c| *c == 1),
        "isolating groups reran a batch-mate: {second_calls:?}"
    );
    assert_eq!(pending(&backend).await?, 0, "every delivery settled");
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, 98);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM effects WHERE calls <> 1")
            .await?,
        0,
        "no effect was applied twice"
    );
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 98);
    if B::KIND == "postgres" {
        // Each round's 49 effects committed in one transaction, not one each.
        assert_eq!(
            backend
                .scalar("SELECT count(DISTINCT tx) FROM effects")
                .await?,
            2,
            "the batch-mates of a failure were not rerun together"
        );
    }
    let dead = backend
        .courier()
        .dead_letters(&DeadLetterFilter::default(), None, 100)
        .await?;
    assert_eq!(dead.items.len(), 2);
    Ok(())
}

async fn a_batch_of_transactional_deliveries_commits_once_each<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let effect = RecordEffect::default();
    let worker = backend
        .courier()
        .worker("ledger")
        .handle_transactional("order.placed", 1, effect.clone())
        .concurrency(50)
        .batch_size(50)
        .transaction_batch_size(25)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "order.placed", 50)?)
        .await?;
    assert_eq!(worker.run_once().await?, 50);
    assert_eq!(pending(&backend).await?, 0);
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, 50);
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 50);
    // Nothing failed, so no batch rolled back and no handler ran twice.
    assert_eq!(effect.counter.total(), 50);
    assert_eq!(effect.counter.distinct(), 50);
    Ok(())
}

async fn the_heartbeat_keeps_a_long_transactional_handler_s_lease<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    // PostgreSQL: the heartbeat writes beside the open transaction. SQLite: the
    // lease is checked when the transaction takes the single write lock, and
    // nobody can take the delivery over until it commits.
    backend.create_effects_table().await?;
    // The handler outlives two and a half leases. The lease is long enough
    // that a heartbeat slowed by a loaded machine still lands before the
    // worker would stop the handler (a tenth of the lease early).
    let effect = RecordEffect {
        delay: Duration::from_millis(7500),
        ..RecordEffect::default()
    };
    let worker = backend
        .courier()
        .worker("sub")
        .handle_transactional("topic", 1, effect.clone())
        .lease(Duration::from_secs(3))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    worker.shutdown().await;
    assert_eq!(effect.counter.total(), 1);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM effects WHERE calls = 1")
            .await?,
        1
    );
    Ok(())
}

async fn poison_payload_dead_letters_with_the_decode_error<B: Backend>(
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
    let poison = NewMessage::from_json_text("acme", "topic", r#"{"n": "not a number"}"#)?;
    backend
        .enqueue_committed(std::slice::from_ref(&poison))
        .await?;
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(counter.total(), 0);
    let page = backend
        .courier()
        .dead_letters(&DeadLetterFilter::default(), None, 10)
        .await?;
    assert_eq!(page.items.len(), 1);
    let dead = &page.items[0];
    assert_eq!(dead.message_id, poison.id);
    assert_eq!(dead.attempts, 1);
    assert_eq!(dead.errors.len(), 1);
    assert!(
        dead.errors[0].message.contains("does not decode"),
        "{}",
        dead.errors[0].message
    );
    Ok(())
}

async fn ten_failed_attempts_dead_letter_with_ten_errors<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let calls = Arc::new(AtomicU32::new(0));
    let handler_calls = Arc::clone(&calls);
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let calls = Arc::clone(&handler_calls);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(HandlerError::retry(format!(
                        "boom on attempt {}",
                        message.attempt
                    )))
                }
            }),
        )
        .retry_policy(fast_retry(10))
        .poll_interval(Duration::from_millis(10))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    let dead = eventually(WAIT, || async {
        matches!(
            backend
                .scalar("SELECT count(*) FROM deliveries WHERE state = 'dead'")
                .await,
            Ok(1)
        )
    })
    .await;
    worker.shutdown().await;
    assert!(dead, "never dead-lettered");
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    let page = backend
        .courier()
        .dead_letters(&DeadLetterFilter::default(), None, 10)
        .await?;
    let letter = &page.items[0];
    assert_eq!(letter.attempts, 10);
    assert_eq!(letter.errors.len(), 10);
    for (index, entry) in letter.errors.iter().enumerate() {
        let attempt = i32::try_from(index)? + 1;
        assert_eq!(entry.attempt, attempt);
        assert_eq!(entry.message, format!("boom on attempt {attempt}"));
    }
    Ok(())
}

async fn a_long_multibyte_error_is_cut_on_a_character_boundary<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let long = "é日".repeat(1500);
    let reason = long.clone();
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |_message: Message<Event>| {
                let reason = reason.clone();
                async move { Err::<(), _>(HandlerError::permanent(reason)) }
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    worker.run_once().await?;
    let page = backend
        .courier()
        .dead_letters(&DeadLetterFilter::default(), None, 10)
        .await?;
    let stored = &page.items[0].errors[0].message;
    assert_eq!(stored.chars().count(), courier::MAX_ERROR_CHARS);
    let full = format!("permanent failure: {long}");
    assert!(full.starts_with(stored.as_str()));
    Ok(())
}

async fn ordering_key_holds_later_messages_behind_a_failing_head<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let failures_left = Arc::new(AtomicU32::new(2));
    let (handler_counter, handler_failures) = (counter.clone(), Arc::clone(&failures_left));
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let counter = handler_counter.clone();
                let failures = Arc::clone(&handler_failures);
                async move {
                    counter.record(message.id, message.payload.n);
                    if message.payload.n == 0
                        && failures
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
                            .is_ok()
                    {
                        return Err(HandlerError::retry_after(
                            Duration::from_millis(100),
                            "head not ready",
                        ));
                    }
                    Ok(())
                }
            }),
        )
        .concurrency(8)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?
        .start();
    let keyed: Vec<NewMessage> = (0..5)
        .map(|n| Ok(NewMessage::new("acme", "topic", &Event { n })?.with_ordering_key("account-1")))
        .collect::<anyhow::Result<_>>()?;
    backend.enqueue_committed(&keyed).await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    worker.shutdown().await;
    assert_eq!(counter.order(), vec![0, 0, 0, 1, 2, 3, 4]);
    Ok(())
}

async fn unkeyed_messages_are_not_held_by_a_keyed_head<B: Backend>(
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
    let mut messages = Vec::new();
    for n in 0..3 {
        messages.push(NewMessage::new("acme", "topic", &Event { n })?.with_ordering_key("k"));
    }
    messages.push(NewMessage::new("acme", "topic", &Event { n: 10 })?);
    messages.push(NewMessage::new("acme", "topic", &Event { n: 11 })?.with_ordering_key("other"));
    backend.enqueue_committed(&messages).await?;
    // One claim takes the head of each key and every unkeyed message.
    assert_eq!(worker.run_once().await?, 3);
    let mut first = counter.order();
    first.sort_unstable();
    assert_eq!(first, vec![0, 10, 11]);
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(counter.order()[3..], [1, 2]);
    Ok(())
}

async fn a_small_tenant_is_served_within_the_first_batches<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .batch_size(100)
        .concurrency(100)
        .maintenance(None)
        .build()
        .await?;
    for chunk in events("big", "topic", 5000)?.chunks(1000) {
        backend.enqueue_committed(chunk).await?;
    }
    let small = events("small", "topic", 10)?;
    backend.enqueue_committed(&small).await?;
    assert!(worker.run_once().await? >= 60);
    let served: usize = small.iter().filter(|m| counter.calls(m.id) == 1).count();
    assert_eq!(
        served, 10,
        "the small tenant must be served in the first batch"
    );
    Ok(())
}

async fn tenant_in_flight_limit_defers_without_spending_attempts<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let counter = CallCounter::default();
    let mut workers = Vec::new();
    // Two workers claim concurrently: the limit holds across them.
    for _ in 0..2 {
        let (g, c) = (Arc::clone(&gate), counter.clone());
        workers.push(
            backend
                .courier()
                .worker("sub")
                .handle(
                    "topic",
                    1,
                    handler_fn(move |message: Message<Event>| {
                        let (gate, counter) = (Arc::clone(&g), c.clone());
                        async move {
                            counter.record(message.id, message.payload.n);
                            if let Ok(permit) = gate.acquire().await {
                                permit.forget();
                            }
                            Ok::<(), HandlerError>(())
                        }
                    }),
                )
                .concurrency(20)
                .tenant_in_flight_limit(2)
                .poll_interval(Duration::from_millis(20))
                .build()
                .await?
                .start(),
        );
    }
    backend
        .enqueue_committed(&events("acme", "topic", 12)?)
        .await?;
    backend
        .enqueue_committed(&events("other", "topic", 3)?)
        .await?;
    assert!(eventually(WAIT, || async { counter.total() == 4 }).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counter.total(), 4, "each tenant is held at its limit of 2");
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE tenant = 'acme' AND state = 'running'")
            .await?,
        2
    );
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE tenant = 'acme' AND state = 'available' AND attempts = 0")
            .await?,
        10,
        "deferred deliveries must not spend attempts"
    );
    gate.add_permits(1000);
    assert!(eventually(WAIT, || drained(&backend)).await);
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(counter.total(), 15);
    assert_eq!(counter.distinct(), 15);
    Ok(())
}

async fn a_delayed_message_waits_until_it_is_available<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .poll_interval(Duration::from_millis(50))
        .build()
        .await?
        .start();
    let delayed =
        NewMessage::new("acme", "topic", &Event { n: 1 })?.delay(Duration::from_millis(1500));
    let started = Instant::now();
    backend.enqueue_committed(&[delayed]).await?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(counter.total(), 0, "delivered before available_at");
    assert!(eventually(WAIT, || async { counter.total() == 1 }).await);
    assert!(started.elapsed() >= Duration::from_millis(1400));
    worker.shutdown().await;
    Ok(())
}

async fn a_panicking_handler_is_a_failed_attempt_not_a_dead_worker<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let c = counter.clone();
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let counter = c.clone();
                async move {
                    counter.record(message.id, message.payload.n);
                    if message.payload.n == 0 && message.attempt == 1 {
                        panic!("handler bug");
                    }
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .retry_policy(fast_retry(5))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 3)?)
        .await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    worker.shutdown().await;
    assert_eq!(counter.total(), 4);
    assert_eq!(
        completed_by(backend.courier().store(), "sub").await?,
        3,
        "all three completed, the panicking one on its second attempt"
    );
    Ok(())
}

async fn retry_after_waits_the_requested_delay<B: Backend>(backend: B) -> anyhow::Result<()> {
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = Arc::clone(&times);
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let times = Arc::clone(&t);
                async move {
                    if let Ok(mut times) = times.lock() {
                        times.push(Instant::now());
                    }
                    if message.attempt == 1 {
                        return Err(HandlerError::retry_after(
                            Duration::from_millis(800),
                            "busy",
                        ));
                    }
                    Ok(())
                }
            }),
        )
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    worker.shutdown().await;
    let times = times.lock().map(|t| t.clone()).unwrap_or_default();
    assert_eq!(times.len(), 2);
    assert!(
        times[1] - times[0] >= Duration::from_millis(750),
        "{:?}",
        times[1] - times[0]
    );
    Ok(())
}

async fn graceful_shutdown_lets_running_handlers_finish<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let started = Arc::new(AtomicU32::new(0));
    let (c, s) = (counter.clone(), Arc::clone(&started));
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let (counter, started) = (c.clone(), Arc::clone(&s));
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    counter.record(message.id, message.payload.n);
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .concurrency(10)
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 5)?)
        .await?;
    assert!(eventually(WAIT, || async { started.load(Ordering::SeqCst) == 5 }).await);
    worker.shutdown().await;
    assert_eq!(counter.total(), 5);
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 5);
    assert_eq!(backend.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

async fn shutdown_deadline_returns_unfinished_work_to_the_queue<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let started = Arc::new(AtomicU32::new(0));
    let s = Arc::clone(&started);
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |_message: Message<Event>| {
                let started = Arc::clone(&s);
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .shutdown_timeout(Duration::from_millis(200))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    assert!(eventually(WAIT, || async { started.load(Ordering::SeqCst) == 1 }).await);
    let stopping = Instant::now();
    worker.shutdown().await;
    assert!(stopping.elapsed() < Duration::from_secs(5));
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available' AND attempts = 1")
            .await?,
        1
    );
    Ok(())
}

async fn released_claims_give_their_attempt_back<B: Backend>(backend: B) -> anyhow::Result<()> {
    use courier::OutboxStore;
    backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 3)?)
        .await?;
    let params = courier_core_params("sub");
    let batch = backend.courier().store().claim(&params).await?;
    assert_eq!(batch.deliveries.len(), 3);
    let leases: Vec<_> = batch.deliveries.iter().map(|d| d.lease()).collect();
    let released = backend.courier().store().release_many(&leases).await?;
    assert_eq!(released.len(), 3);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available' AND attempts = 0")
            .await?,
        3
    );
    Ok(())
}

fn courier_core_params(subscription: &str) -> courier::ClaimParams {
    courier::ClaimParams {
        subscription: subscription.to_owned(),
        routes: vec![courier::Route {
            topic: "topic".into(),
            schema_version: 1,
            max_attempts: 3,
        }],
        limit: 100,
        lease: Duration::from_secs(30),
        worker_id: "test".into(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

async fn an_expired_lease_returns_the_delivery_to_the_queue<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    use courier::OutboxStore;
    let counter = CallCounter::default();
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 2)?)
        .await?;
    // A worker claims and "crashes": nothing ever settles these claims.
    let crashed = backend
        .courier()
        .store()
        .claim(&courier_core_params("sub"))
        .await?;
    assert_eq!(crashed.deliveries.len(), 2);
    assert_eq!(
        worker.run_once().await?,
        0,
        "leased deliveries are not claimable"
    );
    backend.expire_leases().await?;
    // A zombie cannot extend or complete an expired lease.
    let leases: Vec<_> = crashed.deliveries.iter().map(|d| d.lease()).collect();
    assert!(backend
        .courier()
        .store()
        .extend_many(&leases, Duration::from_secs(30))
        .await?
        .extended
        .is_empty());
    let maintenance = backend
        .courier()
        .maintenance(courier_testkit::rescue_at_once())?;
    assert_eq!(maintenance.rescue_once().await?, 2);
    assert!(backend
        .courier()
        .store()
        .complete_many(&leases)
        .await?
        .is_empty());
    assert_eq!(worker.run_once().await?, 2);
    assert_eq!(counter.total(), 2);
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 2);
    Ok(())
}

async fn the_heartbeat_keeps_a_long_handler_s_lease<B: Backend>(backend: B) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    let c = counter.clone();
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |message: Message<Event>| {
                let counter = c.clone();
                async move {
                    counter.record(message.id, message.payload.n);
                    // Two and a half leases (see the transactional twin).
                    tokio::time::sleep(Duration::from_millis(7500)).await;
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .lease(Duration::from_secs(3))
        .maintenance(Some(MaintenanceConfig {
            rescue_interval: Duration::from_millis(100),
            ..MaintenanceConfig::default()
        }))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    worker.shutdown().await;
    assert_eq!(counter.total(), 1, "the lease expired under a heartbeat");
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 1);
    Ok(())
}

async fn a_failing_subscription_never_delays_or_reruns_another<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let healthy = CallCounter::default();
    let failing_calls = Arc::new(AtomicU32::new(0));
    let f = Arc::clone(&failing_calls);
    let broken = backend
        .courier()
        .worker("broken")
        .handle(
            "topic",
            1,
            handler_fn(move |_message: Message<Event>| {
                let calls = Arc::clone(&f);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(HandlerError::retry("endpoint down"))
                }
            }),
        )
        .retry_policy(RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(20),
        })
        .poll_interval(Duration::from_millis(20))
        .build()
        .await?
        .start();
    let fine = backend
        .courier()
        .worker("fine")
        .handle("topic", 1, counting(healthy.clone()))
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&events("acme", "topic", 50)?)
        .await?;
    assert!(eventually(WAIT, || drained(&backend)).await);
    broken.shutdown().await;
    fine.shutdown().await;
    assert_eq!(
        healthy.total(),
        50,
        "each message once for the healthy subscription"
    );
    assert_eq!(failing_calls.load(Ordering::SeqCst), 150);
    assert_eq!(
        backend
            .scalar(
                "SELECT count(*) FROM deliveries WHERE state = 'dead' AND subscription = 'broken'"
            )
            .await?,
        50
    );
    Ok(())
}

async fn a_message_waits_for_a_subscription_whose_workers_are_offline<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    // Registered (as at a previous start), then offline.
    backend
        .courier()
        .worker("late")
        .handle("topic", 1, counting(counter.clone()))
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 5)?)
        .await?;
    let worker = backend
        .courier()
        .worker("late")
        .handle("topic", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    assert_eq!(worker.run_once().await?, 5);
    assert_eq!(counter.total(), 5);
    Ok(())
}

async fn a_new_subscription_starts_with_messages_enqueued_after_it<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let counter = CallCounter::default();
    backend
        .enqueue_committed(&events("acme", "topic", 5)?)
        .await?;
    let worker = backend
        .courier()
        .worker("new")
        .handle("topic", 1, counting(counter.clone()))
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 2)?)
        .await?;
    assert_eq!(worker.run_once().await?, 2);
    assert_eq!(worker.run_once().await?, 0);
    Ok(())
}

async fn a_worker_claims_only_the_versions_it_handles<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let v1 = CallCounter::default();
    let old = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(v1.clone()))
        .maintenance(None)
        .build()
        .await?;
    let newer = NewMessage::new("acme", "topic", &Event { n: 2 })?.with_schema_version(2);
    backend
        .enqueue_committed(std::slice::from_ref(&newer))
        .await?;
    assert_eq!(old.run_once().await?, 0, "an old worker must not claim v2");
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available' AND attempts = 0")
            .await?,
        1
    );
    let v2 = CallCounter::default();
    let upgraded = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(v1.clone()))
        .handle("topic", 2, counting(v2.clone()))
        .maintenance(None)
        .build()
        .await?;
    assert_eq!(upgraded.run_once().await?, 1);
    assert_eq!((v1.total(), v2.calls(newer.id)), (0, 1));
    Ok(())
}

async fn dead_letters_are_listed_retried_and_discarded<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = Arc::clone(&fail);
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(move |_message: Message<Event>| {
                let fail = Arc::clone(&f);
                async move {
                    if fail.load(Ordering::SeqCst) {
                        return Err(HandlerError::permanent("rejected"));
                    }
                    Ok(())
                }
            }),
        )
        .handle(
            "other",
            1,
            handler_fn(|_message: Message<Event>| async {
                Err::<(), _>(HandlerError::permanent("no"))
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 5)?)
        .await?;
    backend
        .enqueue_committed(&events("globex", "topic", 2)?)
        .await?;
    backend
        .enqueue_committed(&events("acme", "other", 3)?)
        .await?;
    worker.run_once().await?;
    let courier = backend.courier();
    let all = courier
        .dead_letters(&DeadLetterFilter::default(), None, 100)
        .await?;
    assert_eq!(all.items.len(), 10);
    // Pagination walks every dead letter once.
    let first = courier
        .dead_letters(&DeadLetterFilter::default(), None, 4)
        .await?;
    assert_eq!(first.items.len(), 4);
    let second = courier
        .dead_letters(&DeadLetterFilter::default(), first.next_cursor, 100)
        .await?;
    assert_eq!(second.items.len(), 6);
    assert_eq!(second.next_cursor, None);
    let acme_topic = DeadLetterFilter {
        tenant: Some("acme".into()),
        topic: Some("topic".into()),
        subscription: Some("sub".into()),
        ..DeadLetterFilter::default()
    };
    let page = courier.dead_letters(&acme_topic, None, 100).await?;
    assert_eq!(page.items.len(), 5);
    let shown = courier
        .dead_letter(page.items[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("dead letter not found"))?;
    assert_eq!(shown.errors.len(), 1);
    assert!(shown.errors[0].message.contains("rejected"));
    // Retry two by id, the rest of acme/topic by filter, after fixing the cause.
    fail.store(false, Ordering::SeqCst);
    let ids: Vec<i64> = page.items.iter().take(2).map(|d| d.delivery_id).collect();
    assert_eq!(courier.retry_dead_letters(&ids).await?, 2);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available' AND attempts = 0")
            .await?,
        2
    );
    assert_eq!(courier.retry_dead_letters_matching(&acme_topic).await?, 3);
    assert_eq!(worker.run_once().await?, 5);
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 5);
    // Discard one by id, then the rest by filter.
    let globex = DeadLetterFilter {
        tenant: Some("globex".into()),
        ..DeadLetterFilter::default()
    };
    let globex_page = courier.dead_letters(&globex, None, 100).await?;
    assert_eq!(
        courier
            .discard_dead_letters(&[globex_page.items[0].delivery_id])
            .await?,
        1
    );
    assert_eq!(
        courier
            .discard_dead_letters_matching(&DeadLetterFilter::default())
            .await?,
        4
    );
    assert!(courier
        .dead_letters(&DeadLetterFilter::default(), None, 100)
        .await?
        .items
        .is_empty());
    // A discarded dead letter was never applied: it does not read completed.
    assert_eq!(completed_by(courier.store(), "sub").await?, 5);
    let discarded = courier
        .store()
        .get_message(globex_page.items[0].message_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the discarded dead letter's message is gone"))?
        .1;
    assert_eq!(
        discarded
            .iter()
            .map(|d| d.state.as_str())
            .collect::<Vec<_>>(),
        ["discarded"]
    );
    Ok(())
}

async fn pruning_removes_finished_work_and_keeps_dead_letters<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .handle(
            "poison",
            1,
            handler_fn(|_message: Message<Event>| async {
                Err::<(), _>(HandlerError::permanent("bad"))
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 20)?)
        .await?;
    backend
        .enqueue_committed(&events("acme", "poison", 1)?)
        .await?;
    worker.run_once().await?;
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 20);
    // Nothing is old enough under the default retention.
    let keep = backend
        .courier()
        .maintenance(MaintenanceConfig::default())?;
    assert_eq!(keep.prune_once().await?.messages, 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let prune = backend.courier().maintenance(MaintenanceConfig {
        retention: Some(Duration::from_millis(1)),
        batch: 7,
        ..MaintenanceConfig::default()
    })?;
    let report = prune.prune_once().await?;
    assert_eq!((report.messages, report.receipts), (20, 0));
    assert_eq!(backend.scalar("SELECT count(*) FROM messages").await?, 1);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'dead'")
            .await?,
        1
    );
    Ok(())
}

async fn bad_worker_configuration_is_refused_with_the_field<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let courier = backend.courier();
    let refused = |result: Result<courier::Worker<B::Store>, courier::EngineError>| match result {
        Err(courier::EngineError::Invalid(error)) => error.field,
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => "accepted",
    };
    assert_eq!(
        refused(
            courier
                .worker("bad name")
                .handle("t", 1, counting(CallCounter::default()))
                .build()
                .await
        ),
        "subscription"
    );
    assert_eq!(refused(courier.worker("sub").build().await), "handlers");
    assert_eq!(
        refused(
            courier
                .worker("sub")
                .handle("t", 1, counting(CallCounter::default()))
                .concurrency(0)
                .build()
                .await
        ),
        "concurrency"
    );
    assert_eq!(
        refused(
            courier
                .worker("sub")
                .handle("t", 1, counting(CallCounter::default()))
                .handle("t", 1, counting(CallCounter::default()))
                .build()
                .await
        ),
        "handlers"
    );
    assert_eq!(
        refused(
            courier
                .worker("sub")
                .handle("t", 1, counting(CallCounter::default()))
                .retry_policy(RetryPolicy::with_max_attempts(0))
                .build()
                .await
        ),
        "retry.max_attempts"
    );
    Ok(())
}

async fn a_retried_dead_head_never_runs_beside_a_later_message_of_its_key<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    use courier::{DeadLetterStore, OutboxStore};
    backend
        .courier()
        .worker("sub")
        .handle("topic", 1, counting(CallCounter::default()))
        .build()
        .await?;
    let keyed: Vec<NewMessage> = (0..2)
        .map(|n| Ok(NewMessage::new("acme", "topic", &Event { n })?.with_ordering_key("k")))
        .collect::<anyhow::Result<_>>()?;
    backend.enqueue_committed(&keyed).await?;
    let store = backend.courier().store();
    let head = store.claim(&courier_core_params("sub")).await?.deliveries;
    assert_eq!(head.len(), 1, "only the head of the key is claimable");
    let dead = courier::Failure {
        lease: head[0].lease(),
        error: "rejected".into(),
        kind: courier::ErrorKind::Permanent,
        retry_in: None,
    };
    assert_eq!(store.fail_many(&[dead]).await?.len(), 1);
    // The dead head no longer blocks: the second message runs.
    let second = store.claim(&courier_core_params("sub")).await?.deliveries;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].message_id, keyed[1].id);
    // An operator retries the head while the second is running: it must wait.
    assert_eq!(store.retry_dead_letters(&[head[0].delivery_id]).await?, 1);
    assert!(store
        .claim(&courier_core_params("sub"))
        .await?
        .deliveries
        .is_empty());
    assert_eq!(store.complete_many(&[second[0].lease()]).await?.len(), 1);
    let retried = store.claim(&courier_core_params("sub")).await?.deliveries;
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].message_id, keyed[0].id);
    Ok(())
}

/// A payload type whose decoding panics.
#[derive(Debug)]
struct Explosive;

impl<'de> serde::Deserialize<'de> for Explosive {
    fn deserialize<D: serde::Deserializer<'de>>(_deserializer: D) -> Result<Self, D::Error> {
        panic!("decoder bug")
    }
}

async fn a_panic_while_decoding_is_a_failed_attempt<B: Backend>(backend: B) -> anyhow::Result<()> {
    let worker = backend
        .courier()
        .worker("sub")
        .handle(
            "topic",
            1,
            handler_fn(|_message: Message<Explosive>| async { Ok::<(), HandlerError>(()) }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&events("acme", "topic", 1)?)
        .await?;
    assert_eq!(worker.run_once().await?, 1);
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'available' AND attempts = 1")
            .await?,
        1,
        "the delivery must be back in the queue, not stuck running"
    );
    assert_eq!(worker.heartbeat_once().await, 0);
    Ok(())
}

async fn a_catch_all_handler_receives_every_topic_and_version_its_patterns_match<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let worker = backend
        .courier()
        .worker("relay")
        .handle_all(
            vec!["invoice.*".into()],
            handler_fn(move |message: Message<serde_json::Value>| {
                let seen = Arc::clone(&s);
                async move {
                    if let Ok(mut seen) = seen.lock() {
                        seen.push((message.topic.clone(), message.schema_version));
                    }
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&[
            NewMessage::new("acme", "invoice.paid", &Event { n: 1 })?,
            NewMessage::new("acme", "invoice.void", &Event { n: 2 })?.with_schema_version(3),
            NewMessage::new("acme", "order.placed", &Event { n: 3 })?,
        ])
        .await?;
    assert_eq!(worker.run_once().await?, 2);
    let mut seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("invoice.paid".to_owned(), 1),
            ("invoice.void".to_owned(), 3)
        ]
    );
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE subscription = 'relay'")
            .await?,
        0
    );
    // order.placed was never owed to the subscription: not counted completed.
    assert_eq!(completed_by(backend.courier().store(), "relay").await?, 2);
    Ok(())
}

backend_tests!(
    rolled_back_enqueue_leaves_no_message,
    idempotent_enqueue_returns_the_first_id,
    every_subscription_applies_every_message_exactly_once,
    a_failing_handler_in_a_transactional_batch_fails_alone,
    one_failing_handler_costs_its_batch_mates_at_most_one_rerun,
    a_batch_of_transactional_deliveries_commits_once_each,
    the_heartbeat_keeps_a_long_transactional_handler_s_lease,
    poison_payload_dead_letters_with_the_decode_error,
    ten_failed_attempts_dead_letter_with_ten_errors,
    a_long_multibyte_error_is_cut_on_a_character_boundary,
    ordering_key_holds_later_messages_behind_a_failing_head,
    unkeyed_messages_are_not_held_by_a_keyed_head,
    a_small_tenant_is_served_within_the_first_batches,
    tenant_in_flight_limit_defers_without_spending_attempts,
    a_delayed_message_waits_until_it_is_available,
    a_panicking_handler_is_a_failed_attempt_not_a_dead_worker,
    retry_after_waits_the_requested_delay,
    graceful_shutdown_lets_running_handlers_finish,
    shutdown_deadline_returns_unfinished_work_to_the_queue,
    released_claims_give_their_attempt_back,
    an_expired_lease_returns_the_delivery_to_the_queue,
    the_heartbeat_keeps_a_long_handler_s_lease,
    a_failing_subscription_never_delays_or_reruns_another,
    a_message_waits_for_a_subscription_whose_workers_are_offline,
    a_new_subscription_starts_with_messages_enqueued_after_it,
    a_worker_claims_only_the_versions_it_handles,
    dead_letters_are_listed_retried_and_discarded,
    pruning_removes_finished_work_and_keeps_dead_letters,
    bad_worker_configuration_is_refused_with_the_field,
    a_retried_dead_head_never_runs_beside_a_later_message_of_its_key,
    a_panic_while_decoding_is_a_failed_attempt,
    a_catch_all_handler_receives_every_topic_and_version_its_patterns_match,
);
