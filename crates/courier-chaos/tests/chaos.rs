//! The chaos scenarios: each starts its own PostgreSQL cluster, runs
//! `chaos-worker` processes against it, injects one fault, and checks the
//! ledger's invariants (no loss, exactly-once effect, no overlap per
//! ordering key, nothing stuck, tenants apart), writing one row of the
//! suite's table (`scripts/chaos` prints it).

use std::time::{Duration, Instant};

use courier_chaos::{
    connect, drained, effects_by_process, prepare, produce, report, shape, verdict, PgCluster,
    Worker, RECOVERY,
};

/// The worker process's binary.
const WORKER: &str = env!("CARGO_BIN_EXE_chaos-worker");

/// Loads `n` messages in producer transactions of their own.
async fn load(pool: &sqlx::PgPool, n: u64) -> anyhow::Result<()> {
    for i in 0..n {
        let (tenant, key) = shape(i);
        produce(pool, tenant, key.as_deref(), i).await?;
    }
    Ok(())
}

/// Waits until at least `n` effects are in the ledger.
async fn effects_reach(pool: &sqlx::PgPool, n: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger.effects")
            .fetch_one(pool)
            .await?;
        if effects >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{effects} effects after 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker killed with SIGKILL mid-batch, with ordering keys in the load:
/// another worker finishes its claims once their leases expire, within R of
/// the kill; nothing is lost or applied twice and no two runs of one key
/// overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    load(&pool, 1_200).await?;
    let victim = Worker::start(WORKER, &cluster.url(), Duration::from_millis(20)).await?;
    let survivor = Worker::start(WORKER, &cluster.url(), Duration::from_millis(20)).await?;
    effects_reach(&pool, 200).await?;
    // What the victim holds when it dies: leased, maybe half applied.
    let held: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT message_id FROM courier.deliveries WHERE state = 'running' AND claimed_by = $1",
    )
    .bind(format!("chaos-{}", victim.pid))
    .fetch_all(&pool)
    .await?;
    victim.signal("KILL")?;
    let killed = Instant::now();
    // Recovery: until another worker finished every delivery it held.
    let deadline = killed + RECOVERY + Duration::from_secs(30);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::uuid[]) AS h (id)
             WHERE NOT EXISTS (SELECT 1 FROM courier.receipts r WHERE r.message_id = h.id)",
        )
        .bind(&held)
        .fetch_one(&pool)
        .await?;
        if open == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{open} of the killed worker's deliveries still open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovery = killed.elapsed();
    drained(&pool, Duration::from_secs(60)).await?;
    let by_process = effects_by_process(&pool).await?;
    let verdict = verdict(&pool).await?;
    drop(survivor);
    println!(
        "the killed worker held {} deliveries; effects by process: {by_process:?}",
        held.len()
    );
    anyhow::ensure!(
        !held.is_empty(),
        "nothing was in flight when the worker was killed"
    );
    anyhow::ensure!(
        recovery <= RECOVERY,
        "the killed worker's deliveries took {recovery:?} to finish elsewhere (R = {RECOVERY:?})"
    );
    report("kill -9 mid-batch (ordering keys)", &verdict, recovery)
}

/// SIGTERM mid-batch: the worker finishes or releases what it holds and
/// exits 0; the other worker takes the rest at once (no lease to wait out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_mid_batch_exits_cleanly_and_hands_over() -> anyhow::Result<()>
{
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    load(&pool, 1_200).await?;
    let mut stopped = Worker::start(WORKER, &cluster.url(), Duration::from_millis(20)).await?;
    let survivor = Worker::start(WORKER, &cluster.url(), Duration::from_millis(20)).await?;
    effects_reach(&pool, 200).await?;
    stopped.signal("TERM")?;
    let signalled = Instant::now();
    let code = tokio::time::timeout(Duration::from_secs(30), stopped.wait()).await??;
    let exited = signalled.elapsed();
    anyhow::ensure!(
        code == Some(0),
        "the worker exited with {code:?} after SIGTERM"
    );
    // Nothing it claimed is left leased, and no attempt was spent on what
    // it gave back unstarted (no handler fails in this scenario).
    let leased: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM courier.deliveries WHERE lease_token IS NOT NULL AND claimed_by = $1",
    )
    .bind(format!("chaos-{}", stopped.pid))
    .fetch_one(&pool)
    .await?;
    let spent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM courier.deliveries WHERE state = 'available' AND attempts > 0",
    )
    .fetch_one(&pool)
    .await?;
    anyhow::ensure!(
        leased == 0,
        "{leased} deliveries still leased to the stopped worker"
    );
    anyhow::ensure!(
        spent == 0,
        "{spent} deliveries given back with an attempt spent"
    );
    drained(&pool, Duration::from_secs(60)).await?;
    let verdict = verdict(&pool).await?;
    drop(survivor);
    report("SIGTERM mid-batch", &verdict, exited)
}

/// PostgreSQL restarted (immediate: crash recovery) under ~200 messages/s:
/// producers see errors during the outage, never a false success; the
/// workers reconnect and deliver everything committed, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_immediately_under_load_loses_and_doubles_nothing() -> anyhow::Result<()>
{
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    let workers = [
        Worker::start(WORKER, &cluster.url(), Duration::from_millis(2)).await?,
        Worker::start(WORKER, &cluster.url(), Duration::from_millis(2)).await?,
    ];
    // Two producers of 100 messages/s each, for 8 s.
    let producers: Vec<_> = (0..2_u64)
        .map(|lane| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let (mut committed, mut failed) = (0_u64, 0_u64);
                let until = Instant::now() + Duration::from_secs(8);
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = lane;
                while Instant::now() < until {
                    tick.tick().await;
                    let (tenant, key) = shape(n);
                    match produce(&pool, tenant, key.as_deref(), n).await {
                        Ok(()) => committed += 1,
                        // The outage: an error, and the oracle row went with
                        // the message if the commit did not happen.
                        Err(_) => failed += 1,
                    }
                    n += 2;
                }
                (committed, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restarted = Instant::now();
    cluster.restart("immediate").await?;
    let (mut committed, mut failed) = (0, 0);
    for producer in producers {
        let (c, f) = producer.await?;
        committed += c;
        failed += f;
    }
    drained(&pool, Duration::from_secs(90)).await?;
    let recovery = restarted.elapsed();
    let verdict = verdict(&pool).await?;
    drop(workers);
    println!("producer: {committed} committed, {failed} failed during the outage");
    anyhow::ensure!(failed > 0, "the restart did not interrupt the producer");
    anyhow::ensure!(
        verdict.messages >= i64::try_from(committed)?,
        "every commit that succeeded has its oracle row"
    );
    report(
        "PostgreSQL immediate restart under load",
        &verdict,
        recovery,
    )
}

/// A handler that panics after its writes, on the first attempt of every
/// tenth message: the worker stays up, the panicking attempt's writes roll
/// back, and the retry applies each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_panics_after_their_writes_leave_the_worker_up_and_apply_once() -> anyhow::Result<()>
{
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    load(&pool, 600).await?;
    let mut worker = Worker::start_with(
        WORKER,
        &cluster.url(),
        Duration::from_millis(2),
        &[("CHAOS_PANIC_EVERY", "10".to_owned())],
    )
    .await?;
    let started = Instant::now();
    drained(&pool, Duration::from_secs(60)).await?;
    let recovery = started.elapsed();
    let retried: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT DISTINCT message_id FROM ledger.runs) r
         JOIN ledger.oracle o USING (message_id)",
    )
    .fetch_one(&pool)
    .await?;
    let alive = tokio::time::timeout(Duration::from_millis(100), worker.wait())
        .await
        .is_err();
    let verdict = verdict(&pool).await?;
    anyhow::ensure!(alive, "the worker exited after its handlers panicked");
    anyhow::ensure!(
        retried == 600,
        "{retried} of 600 messages have a committed run"
    );
    report("handler panics after writes", &verdict, recovery)
}

/// Every engine connection terminated (`pg_terminate_backend`) three times
/// while the workers drain: they reconnect and deliver everything once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_connections_terminated_mid_drain_lose_and_double_nothing() -> anyhow::Result<()> {
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    load(&pool, 1_200).await?;
    let workers = [
        Worker::start(WORKER, &cluster.url(), Duration::from_millis(10)).await?,
        Worker::start(WORKER, &cluster.url(), Duration::from_millis(10)).await?,
    ];
    let started = Instant::now();
    let mut terminated = 0_i64;
    for round in 1..=3 {
        effects_reach(&pool, 250 * round).await?;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(courier_chaos::WORKER_APPLICATION)
        .fetch_all(&pool)
        .await?;
        terminated += i64::try_from(killed.iter().filter(|k| **k).count())?;
    }
    drained(&pool, RECOVERY + Duration::from_secs(60)).await?;
    let recovery = started.elapsed();
    let verdict = verdict(&pool).await?;
    drop(workers);
    println!("{terminated} engine connections terminated");
    anyhow::ensure!(
        terminated >= 6,
        "only {terminated} connections were terminated"
    );
    report(
        "pg_terminate_backend on every engine connection",
        &verdict,
        recovery,
    )
}
