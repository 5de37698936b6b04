//! The engine contract under faults, on every backend: handlers stop when
//! their lease can no longer be kept, hung handlers time out, snoozes spend
//! no attempts, and a tenant's rate limit holds across workers. The store's
//! own fences (lease token and clock, rescue backoff, the bounds on snoozes
//! and error history) are in the store conformance suite, `tests/store.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::{
    handler_fn, DeadLetterStore, HandlerError, MaintenanceConfig, Message, NewMessage, RetryPolicy,
    WorkerBuilder,
};
use courier_testkit::{backend_tests, completed_by, eventually, Backend, Event, StalledHeartbeat};

/// One run of a handler: the payload number, when it started, when it
/// ended (returned or was dropped).
type Run = (i64, Instant, Option<Instant>);

/// Every run of a handler.
#[derive(Clone, Default)]
struct Runs {
    runs: Arc<Mutex<Vec<Run>>>,
}

/// Records the end of a run when the handler returns or is dropped.
struct RunGuard {
    runs: Runs,
    index: usize,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Ok(mut runs) = self.runs.runs.lock() {
            if let Some(run) = runs.get_mut(self.index) {
                run.2 = Some(Instant::now());
            }
        }
    }
}

impl Runs {
    fn start(&self, n: i64) -> RunGuard {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.push((n, Instant::now(), None));
        RunGuard {
            runs: self.clone(),
            index: runs.len() - 1,
        }
    }

    fn all(&self) -> Vec<Run> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn count(&self) -> usize {
        self.runs.lock().map(|r| r.len()).unwrap_or(0)
    }
}

/// A plain handler that runs for `duration`, recording each run.
fn slow(runs: Runs, duration: Duration) -> impl courier::Handler<Payload = Event> {
    handler_fn(move |message: Message<Event>| {
        let runs = runs.clone();
        async move {
            let _run = runs.start(message.payload.n);
            tokio::time::sleep(duration).await;
            Ok::<(), HandlerError>(())
        }
    })
}

fn keyed(n: i64) -> anyhow::Result<NewMessage> {
    Ok(NewMessage::new("acme", "topic", &Event { n })?.with_ordering_key("k"))
}

async fn open_deliveries<B: Backend>(backend: &B) -> i64 {
    backend
        .scalar("SELECT count(*) FROM deliveries")
        .await
        .unwrap_or(-1)
}

/// A worker whose heartbeat is stuck keeps running a slow handler past its
/// lease; another worker rescues the delivery and runs it, then the next
/// message of the key. The stuck worker's handler must have stopped first.
async fn a_handler_whose_lease_cannot_be_extended_stops_before_the_key_moves_on<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let store = backend.courier().store().clone();
    let runs = Runs::default();
    let lease = Duration::from_millis(300);
    let stuck = WorkerBuilder::new(StalledHeartbeat::new(store.clone()), "sub")
        .handle("topic", 1, slow(runs.clone(), Duration::from_millis(1500)))
        .lease(lease)
        .heartbeat_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(20))
        .worker_id("stuck")
        .maintenance(None)
        .build()
        .await?
        .start();
    backend.enqueue_committed(&[keyed(0)?, keyed(1)?]).await?;
    anyhow::ensure!(
        eventually(Duration::from_secs(10), || async { runs.count() >= 1 }).await,
        "the stuck worker never started the first message"
    );
    // It claims nothing more; its running handler must stop on its own.
    let stopped = tokio::spawn(stuck.shutdown());
    // The healthy worker's own lease is long: only the stuck one's matters.
    let healthy = WorkerBuilder::new(store.clone(), "sub")
        .handle("topic", 1, slow(runs.clone(), Duration::from_millis(400)))
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(20))
        .worker_id("healthy")
        .maintenance(Some(MaintenanceConfig {
            rescue_interval: Duration::from_millis(50),
            rescue_backoff: RetryPolicy {
                base: Duration::from_millis(1),
                cap: Duration::from_millis(1),
                ..RetryPolicy::default()
            },
            ..MaintenanceConfig::default()
        }))
        .build()
        .await?
        .start();
    let drained = eventually(Duration::from_secs(20), || async {
        open_deliveries(&backend).await == 0
    })
    .await;
    healthy.shutdown().await;
    stopped.await?;
    assert!(drained, "both messages were delivered");
    let mut all = runs.all();
    all.sort_by_key(|run| run.1);
    assert!(
        all.len() >= 3,
        "the first message ran twice, the second once: {all:?}"
    );
    assert_eq!(all.last().map(|run| run.0), Some(1), "the key's order held");
    for pair in all.windows(2) {
        let ended = pair[0]
            .2
            .ok_or_else(|| anyhow::anyhow!("a run never ended"))?;
        assert!(
            pair[1].1 >= ended,
            "message {} started {:?} before the run of message {} ended",
            pair[1].0,
            ended - pair[1].1,
            pair[0].0
        );
    }
    let first = all[0];
    let first_ended = first.2.ok_or_else(|| anyhow::anyhow!("never ended"))?;
    assert!(
        first_ended - first.1 < lease,
        "the stuck handler was stopped within its lease, not after {:?}",
        first_ended - first.1
    );
    Ok(())
}

/// A handler that never returns is cancelled at its timeout; the attempt
/// fails with `timeout after …`, and with one attempt the message is dead.
async fn a_hung_handler_is_cancelled_at_its_timeout<B: Backend>(backend: B) -> anyhow::Result<()> {
    let runs = Runs::default();
    let hung = {
        let runs = runs.clone();
        handler_fn(move |message: Message<Event>| {
            let runs = runs.clone();
            async move {
                let _run = runs.start(message.payload.n);
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        })
    };
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, hung)
        .handler_timeout(Some(Duration::from_millis(200)))
        .retry_policy(RetryPolicy::with_max_attempts(1))
        .poll_interval(Duration::from_millis(20))
        .maintenance(None)
        .build()
        .await?
        .start();
    backend.enqueue_committed(&[keyed(0)?, keyed(1)?]).await?;
    let store = backend.courier().store();
    let dead = eventually(Duration::from_secs(10), || async {
        store
            .list_dead_letters(&Default::default(), None, 10)
            .await
            .is_ok_and(|page| page.items.len() == 2)
    })
    .await;
    worker.shutdown().await;
    assert!(
        dead,
        "both hung messages were dead-lettered, one after the other"
    );
    let page = store
        .list_dead_letters(&Default::default(), None, 10)
        .await?;
    for letter in &page.items {
        let last = letter.errors.last().map(|e| e.message.as_str());
        assert_eq!(last, Some("timeout after 200ms"));
    }
    for run in runs.all() {
        let ended = run
            .2
            .ok_or_else(|| anyhow::anyhow!("a hung run was never stopped"))?;
        assert!(ended - run.1 < Duration::from_secs(5));
    }
    Ok(())
}

/// A transactional handler that hangs inside its transaction times out too,
/// and its writes roll back.
async fn a_hung_transactional_handler_times_out_and_rolls_back<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    backend.create_effects_table().await?;
    let handler = courier_testkit::RecordEffect {
        delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let worker = backend
        .courier()
        .worker("sub")
        .handle_transactional("topic", 1, handler)
        .handler_timeout(Some(Duration::from_millis(200)))
        .retry_policy(RetryPolicy::with_max_attempts(1))
        .poll_interval(Duration::from_millis(20))
        .maintenance(None)
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&[NewMessage::new("acme", "topic", &Event { n: 1 })?])
        .await?;
    let store = backend.courier().store();
    let dead = eventually(Duration::from_secs(10), || async {
        store
            .list_dead_letters(&Default::default(), None, 10)
            .await
            .is_ok_and(|page| page.items.len() == 1)
    })
    .await;
    worker.shutdown().await;
    assert!(dead, "the hung transactional message was dead-lettered");
    let page = store
        .list_dead_letters(&Default::default(), None, 10)
        .await?;
    assert_eq!(
        page.items[0].errors.last().map(|e| e.message.as_str()),
        Some("timeout after 200ms")
    );
    assert_eq!(backend.scalar("SELECT count(*) FROM effects").await?, 0);
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 0);
    Ok(())
}

/// A tenant over its quota snoozes: eleven snoozes (more than the ten
/// attempts) and then success apply the message once, never dead.
async fn snoozes_spend_no_attempts<B: Backend>(backend: B) -> anyhow::Result<()> {
    let calls: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let applied: Arc<Mutex<Vec<i64>>> = Arc::default();
    let handler = {
        let calls = Arc::clone(&calls);
        let applied = Arc::clone(&applied);
        handler_fn(move |message: Message<Event>| {
            let calls = Arc::clone(&calls);
            let applied = Arc::clone(&applied);
            async move {
                let call = {
                    let mut calls = calls.lock().unwrap_or_else(|p| p.into_inner());
                    let call = calls.entry(message.payload.n).or_insert(0);
                    *call += 1;
                    *call
                };
                if call <= 11 {
                    return Err(HandlerError::snooze(
                        Duration::from_millis(5),
                        "tenant acme is over its quota",
                    ));
                }
                applied
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(message.payload.n);
                Ok(())
            }
        })
    };
    let worker = backend
        .courier()
        .worker("sub")
        .handle("topic", 1, handler)
        .poll_interval(Duration::from_millis(10))
        .maintenance(None)
        .build()
        .await?
        .start();
    backend
        .enqueue_committed(&[NewMessage::new("acme", "topic", &Event { n: 7 })?])
        .await?;
    let done = eventually(Duration::from_secs(20), || async {
        open_deliveries(&backend).await == 0
    })
    .await;
    worker.shutdown().await;
    assert!(done, "the snoozed message completed");
    assert_eq!(*applied.lock().unwrap_or_else(|p| p.into_inner()), vec![7]);
    assert_eq!(
        calls.lock().unwrap_or_else(|p| p.into_inner()).get(&7),
        Some(&12)
    );
    assert_eq!(completed_by(backend.courier().store(), "sub").await?, 1);
    Ok(())
}

/// A tenant limited to 50 deliveries a second starts them at 50/s (± 20 %),
/// across the whole subscription, while another tenant drains at full speed.
async fn a_rate_limited_tenant_drains_at_its_rate_beside_a_full_speed_one<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    use courier::AdminStore;
    let starts: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
    let recording = || {
        let starts = Arc::clone(&starts);
        handler_fn(move |message: Message<Event>| {
            let starts = Arc::clone(&starts);
            async move {
                starts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(message.tenant.clone())
                    .or_default()
                    .push(Instant::now());
                Ok::<(), HandlerError>(())
            }
        })
    };
    // Two workers: the bucket is in the database, shared by every claimer.
    let mut workers = Vec::new();
    for id in ["w1", "w2"] {
        workers.push(
            backend
                .courier()
                .worker("sub")
                .handle("topic", 1, recording())
                .concurrency(64)
                .batch_size(32)
                .poll_interval(Duration::from_millis(20))
                .worker_id(id)
                .maintenance(None)
                .build()
                .await?,
        );
    }
    let limit = courier::RateLimit {
        per_second: 50.0,
        burst: 5,
    };
    backend
        .courier()
        .store()
        .set_tenant_rate_limit("sub", "slow", Some(limit))
        .await?;
    let mut messages = courier_testkit::events("slow", "topic", 150)?;
    messages.extend(courier_testkit::events("fast", "topic", 1000)?);
    backend.enqueue_committed(&messages).await?;
    let running: Vec<_> = workers.into_iter().map(|w| w.start()).collect();
    let done = eventually(Duration::from_secs(30), || async {
        open_deliveries(&backend).await == 0
    })
    .await;
    for worker in running {
        worker.shutdown().await;
    }
    assert!(done, "both tenants drained");
    let starts = starts.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let span = |tenant: &str| -> anyhow::Result<(usize, Duration)> {
        let times = starts
            .get(tenant)
            .ok_or_else(|| anyhow::anyhow!("{tenant} never ran"))?;
        let first = times.iter().min().copied().unwrap_or_else(Instant::now);
        let last = times.iter().max().copied().unwrap_or(first);
        Ok((times.len(), last - first))
    };
    let (slow_count, slow_span) = span("slow")?;
    let (fast_count, fast_span) = span("fast")?;
    assert_eq!((slow_count, fast_count), (150, 1000));
    // After the burst, 145 tokens at 50/s: 2.9 s.
    let slow_rate = (slow_count - 5) as f64 / slow_span.as_secs_f64();
    assert!(
        (40.0..=60.0).contains(&slow_rate),
        "the limited tenant ran at {slow_rate:.1}/s over {slow_span:?}"
    );
    let fast_rate = fast_count as f64 / fast_span.as_secs_f64().max(0.001);
    assert!(
        fast_rate > 150.0 && fast_span < slow_span,
        "the unlimited tenant ran at {fast_rate:.1}/s over {fast_span:?}"
    );
    // Lifting the limit is refused for bad input and works for good.
    let refused = backend
        .courier()
        .store()
        .set_tenant_rate_limit(
            "sub",
            "slow",
            Some(courier::RateLimit {
                per_second: 0.0,
                burst: 1,
            }),
        )
        .await;
    assert!(
        matches!(refused, Err(courier::StoreError::Invalid(ref e)) if e.field == "rate_limit.per_second"),
        "{refused:?}"
    );
    backend
        .courier()
        .store()
        .set_tenant_rate_limit("sub", "slow", None)
        .await?;
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM tenant_rate_limits")
            .await?,
        0
    );
    Ok(())
}

backend_tests!(
    a_rate_limited_tenant_drains_at_its_rate_beside_a_full_speed_one,
    a_handler_whose_lease_cannot_be_extended_stops_before_the_key_moves_on,
    a_hung_handler_is_cancelled_at_its_timeout,
    a_hung_transactional_handler_times_out_and_rolls_back,
    snoozes_spend_no_attempts,
);
