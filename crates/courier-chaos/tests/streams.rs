//! Stream subscriptions under churn and quota: `chaos-stream` processes
//! (a Redis stream subscription whose transactional handler writes its
//! effect with the receipt in the scenario's own PostgreSQL cluster) on a
//! Redis server of the scenario's own. The ledger is the entries appended
//! and the effects written: every entry applied once, none dead-lettered.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use courier::redis::RedisStreamStore;
use courier::{NewStreamEntry, StreamEntryId, StreamKey, StreamStore};
use courier_chaos::{ledgered_cluster, report, Verdict, Worker};
use courier_testkit::servers::RedisServer;

/// The stream subscription process's binary.
const STREAM: &str = env!("CARGO_BIN_EXE_chaos-stream");

/// The subscription's stream.
fn key() -> anyhow::Result<StreamKey> {
    Ok(StreamKey::new("acme", "events")?)
}

/// Starts a `chaos-stream` process as consumer `consumer`.
async fn consumer(
    cluster: &courier_chaos::PgCluster,
    redis: &RedisServer,
    consumer: &str,
    env: &[(&str, String)],
) -> anyhow::Result<Worker> {
    let mut all = vec![
        ("CHAOS_DATABASE_URL", cluster.url()),
        ("CHAOS_REDIS_URL", redis.url()),
        ("CHAOS_CONSUMER", consumer.to_owned()),
    ];
    all.extend(env.iter().cloned());
    Worker::spawn(STREAM, &all).await
}

/// Appends entries `0..n`, one every `every`, from a task; the ids.
fn append_steadily(
    store: &RedisStreamStore,
    n: u64,
    every: Duration,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<StreamEntryId>>> {
    append_until(store, n, every, None)
}

/// Appends entries `0..n`, one every `every`, from a task, stopping early
/// once `stop`, if given, turns true (or its sender is dropped); the ids.
fn append_until(
    store: &RedisStreamStore,
    n: u64,
    every: Duration,
    mut stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<StreamEntryId>>> {
    let store = store.clone();
    tokio::spawn(async move {
        let key = key()?;
        let mut ids = Vec::new();
        let mut tick = tokio::time::interval(every);
        for i in 0..n {
            let stopped = async {
                match stop.as_mut() {
                    Some(stop) => drop(stop.wait_for(|stop| *stop).await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = stopped => break,
            }
            let entry = NewStreamEntry::new(serde_json::json!({ "n": i }));
            ids.extend(store.append(&key, &[entry]).await?);
        }
        Ok(ids)
    })
}

/// Effects per entry id.
async fn effects(pool: &sqlx::PgPool) -> anyhow::Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT entry_id, count(*) FROM ledger.stream_effects GROUP BY entry_id")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Waits until every appended entry has an effect and none is pending.
async fn applied(
    pool: &sqlx::PgPool,
    store: &RedisStreamStore,
    appended: &[StreamEntryId],
    limit: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let done = effects(pool).await?;
        let missing = appended
            .iter()
            .filter(|id| !done.contains_key(&id.to_string()))
            .count();
        let pending = store.pending_summary(&key()?, "ledger").await?.count;
        if missing == 0 && pending == 0 {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "after {limit:?}: {missing} of {} entries without an effect, {pending} pending",
            appended.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ledger's verdict over the appended entries: lost (no effect and not
/// dead-lettered), doubled (more than one effect), phantoms (an effect of
/// no appended entry), dead letters.
async fn stream_verdict(
    pool: &sqlx::PgPool,
    store: &RedisStreamStore,
    appended: &[StreamEntryId],
) -> anyhow::Result<Verdict> {
    let done = effects(pool).await?;
    let dead = store
        .range(&key()?.dead_letters()?, StreamEntryId::ZERO, 10_000)
        .await?;
    let appended: BTreeSet<String> = appended.iter().map(ToString::to_string).collect();
    Ok(Verdict {
        messages: appended.len() as i64,
        lost: appended.iter().filter(|id| !done.contains_key(*id)).count() as i64
            - dead.len() as i64,
        doubled: done.values().filter(|n| **n > 1).count() as i64,
        dead_lettered: dead.len() as i64,
        phantoms: done.keys().filter(|id| !appended.contains(*id)).count() as i64,
        ..Verdict::default()
    })
}

/// Consumer-name churn: 50 restarts of the subscription's processes (two
/// at a time; every 600 ms the older is killed with SIGKILL, its entries
/// still pending, and a process with a new consumer name starts), while
/// entries keep coming. The dead consumers' pending entries are claimed
/// once idle, each entry is applied once, and dead consumers are deleted
/// once idle with nothing pending: the group's consumer count stays
/// bounded, and ends at the two that run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_consumer_restarts_with_entries_pending_lose_nothing_and_keep_the_group_small(
) -> anyhow::Result<()> {
    const RESTARTS: usize = 50;
    let (cluster, pool) = ledgered_cluster().await?;
    let redis = RedisServer::start(true).await?;
    let store = RedisStreamStore::connect(&redis.url(), "chaos:").await?;
    let env = [
        ("CHAOS_HANDLER_MS", "100".to_owned()),
        ("CHAOS_MIN_IDLE_MS", "1000".to_owned()),
        ("CHAOS_CONSUMER_IDLE_MS", "2000".to_owned()),
    ];
    let mut running = [
        consumer(&cluster, &redis, "churn-00", &env).await?,
        consumer(&cluster, &redis, "churn-01", &env).await?,
    ];
    // Entries keep coming until the last restart, however long the restarts
    // take (a slow machine spawns processes slowly): each kill can find some
    // pending.
    let (stop_appending, appending) = tokio::sync::watch::channel(false);
    let appender = append_until(&store, 100_000, Duration::from_millis(20), Some(appending));
    let (most, sampled) = tokio::sync::watch::channel(0_usize);
    // Samples the group's size every 100 ms until aborted (or Redis fails).
    let sampler = {
        let store = store.clone();
        let key = key()?;
        tokio::spawn(async move {
            while let Ok(consumers) = store.consumers(&key, "ledger").await {
                most.send_modify(|most| *most = (*most).max(consumers.len()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut killed_with_pending = 0;
    for i in 2..2 + RESTARTS {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let slot = i % 2;
        let victim = format!("churn-{:02}", i - 2);
        let pending = store
            .consumers(&key()?, "ledger")
            .await?
            .into_iter()
            .find(|c| c.name == victim)
            .map_or(0, |c| c.pending);
        running[slot].signal("KILL")?;
        running[slot].wait().await?;
        if pending > 0 {
            killed_with_pending += 1;
        }
        running[slot] = consumer(&cluster, &redis, &format!("churn-{i:02}"), &env).await?;
    }
    let restarted = Instant::now();
    let _ = stop_appending.send(true);
    let appended = appender.await??;
    applied(&pool, &store, &appended, Duration::from_secs(60)).await?;
    let recovery = restarted.elapsed();
    // The dead consumers go once idle with nothing pending. A live one with
    // nothing to read may be swept too and comes back with its next read, so
    // the count can pass through 1 (a CI run read it there): wait for 2.
    let deadline = Instant::now() + Duration::from_secs(20);
    let left = loop {
        let left = store.consumers(&key()?, "ledger").await?;
        if left.len() == 2 || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sampler.abort();
    let most = *sampled.borrow();
    drop(running);
    let verdict = stream_verdict(&pool, &store, &appended).await?;
    println!(
        "{RESTARTS} restarts, {killed_with_pending} of them with entries pending; \
         at most {most} consumers in the group, {} at the end ({:?})",
        left.len(),
        left.iter().map(|c| c.name.as_str()).collect::<Vec<_>>()
    );
    anyhow::ensure!(
        killed_with_pending >= RESTARTS / 2,
        "only {killed_with_pending} of {RESTARTS} kills found entries pending"
    );
    anyhow::ensure!(left.len() == 2, "{} consumers left", left.len());
    anyhow::ensure!(most <= 12, "the group grew to {most} consumers");
    report(
        &format!("Redis subscription: 50 consumer restarts (at most {most} consumers)"),
        &verdict,
        recovery,
    )
}

/// `INFO commandstats` calls of the commands that read or claim entries.
/// `XCLAIM` is not among them: only the touch of held entries and the
/// take-back of a deferred entry's delivery run it, `JUSTID` (no entry is
/// read, no delivery counted).
fn reads(redis: &RedisServer) -> anyhow::Result<u64> {
    let stats = redis.command(&["INFO", "commandstats"])?;
    Ok(stats
        .lines()
        .filter(|line| {
            ["cmdstat_xreadgroup:", "cmdstat_xautoclaim:"]
                .iter()
                .any(|command| line.starts_with(command))
        })
        .filter_map(|line| {
            line.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// A tenant over its quota for 3 periods of 4 s (open for 2 s between):
/// the handler defers every entry, which stays pending (none applied); the subscription
/// pauses its reads and claims (1 s, growing to 2 s), so the reads per
/// second stay bounded; deferrals spend no delivery (with a limit of 3
/// deliveries, nothing is dead-lettered and every effect saw its first
/// delivery); once open, everything is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_for_three_periods_spends_no_delivery_and_reads_little(
) -> anyhow::Result<()> {
    const CLOSED: Duration = Duration::from_secs(4);
    let (cluster, pool) = ledgered_cluster().await?;
    let redis = RedisServer::start(true).await?;
    let store = RedisStreamStore::connect(&redis.url(), "chaos:").await?;
    let quota = |open: bool| {
        let pool = pool.clone();
        async move {
            sqlx::query("UPDATE ledger.quota SET open = $1")
                .bind(open)
                .execute(&pool)
                .await?;
            anyhow::Ok(())
        }
    };
    quota(false).await?;
    let worker = consumer(
        &cluster,
        &redis,
        "quota",
        &[
            ("CHAOS_QUOTA", "1".to_owned()),
            ("CHAOS_MAX_DELIVERIES", "3".to_owned()),
        ],
    )
    .await?;
    let appender = append_steadily(&store, 500, Duration::from_millis(40));
    let (mut rates, mut held_pending) = (Vec::new(), Vec::new());
    for period in 0..3 {
        if period > 0 {
            quota(false).await?;
        }
        // The first second is the tail of the open window (reads then
        // return entries and are not paused).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (before, from) = (reads(&redis)?, Instant::now());
        let effects_before = effects(&pool).await?.len();
        tokio::time::sleep(CLOSED - Duration::from_secs(1)).await;
        let calls = reads(&redis)? - before;
        rates.push(calls as f64 / from.elapsed().as_secs_f64());
        let applied_meanwhile = effects(&pool).await?.len() - effects_before;
        let pending = store.pending_summary(&key()?, "ledger").await?.count;
        anyhow::ensure!(
            applied_meanwhile == 0 && pending > 0,
            "over quota (period {period}): {applied_meanwhile} entries applied, {pending} pending"
        );
        held_pending.push(pending);
        quota(true).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let opened = Instant::now();
    let appended = appender.await??;
    let recovery = applied(&pool, &store, &appended, Duration::from_secs(60)).await?;
    drop(worker);
    let most_deliveries: i64 =
        sqlx::query_scalar("SELECT coalesce(max(deliveries), 0) FROM ledger.stream_effects")
            .fetch_one(&pool)
            .await?;
    let verdict = stream_verdict(&pool, &store, &appended).await?;
    println!(
        "reads and claims per second while over quota: {rates:.1?}, entries pending at each \
         period's end: {held_pending:?}; the most deliveries an \
         effect saw: {most_deliveries}; {} entries; {:.1} s to apply the rest",
        appended.len(),
        opened.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        rates.iter().all(|rate| *rate <= 4.0),
        "reads and claims per second while over quota: {rates:?}"
    );
    anyhow::ensure!(
        most_deliveries == 1,
        "an entry was applied at delivery {most_deliveries}: deferrals spent deliveries"
    );
    report(
        "Redis subscription: quota exhausted 3 times",
        &verdict,
        recovery,
    )
}
