//! Stream subscriptions across Redis restarts, on Redis servers these tests
//! start for themselves (a free port each; never the shared server): a
//! durable server killed mid-run, or its clients killed and the server
//! paused, loses and doubles nothing, and a server that comes back empty
//! gets its group recreated at its start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::redis::RedisStreamStore;
use courier::{
    stream_handler_fn, GroupStart, HandlerError, NewStreamEntry, StreamEntryId, StreamKey,
    StreamMessage, StreamStore, StreamSubscription, StreamSubscriptionConfig,
};
use courier_testkit::servers::RedisServer;
use courier_testkit::{Backend, SqliteFixture};
use serde_json::json;

/// Handler runs per entry id, and the payload number of each.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<StreamEntryId, (u64, u32)>>>);

impl Runs {
    fn handler(&self) -> impl courier::StreamHandler<Payload = serde_json::Value> {
        let runs = self.clone();
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let runs = runs.clone();
            async move {
                let n = message.payload["n"].as_u64().unwrap_or(u64::MAX);
                let mut runs = runs
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                runs.entry(message.id).or_insert((n, 0)).1 += 1;
                Ok::<(), HandlerError>(())
            }
        })
    }

    fn snapshot(&self) -> BTreeMap<StreamEntryId, (u64, u32)> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn config(key: &StreamKey) -> anyhow::Result<StreamSubscriptionConfig> {
    let mut config = StreamSubscriptionConfig::new("workflow", key.clone())?;
    config.consumer = "workflow-test".into();
    config.start = GroupStart::Beginning;
    config.block = Duration::from_millis(200);
    config.claim_interval = Duration::from_millis(200);
    config.min_idle = Duration::from_secs(1);
    config.batch = 50;
    Ok(config)
}

/// Appends entry `n`, retrying through an outage (a lost reply may append
/// it twice: those are two entries, each handled once).
async fn append_retrying(store: &RedisStreamStore, key: &StreamKey, n: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match store
            .append(key, &[NewStreamEntry::new(json!({ "n": n }))])
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Every entry of the stream, read in pages, retrying through an outage.
async fn all_entries(
    store: &RedisStreamStore,
    key: &StreamKey,
) -> anyhow::Result<Vec<(StreamEntryId, u64)>> {
    let mut entries = Vec::new();
    let mut after = StreamEntryId::ZERO;
    loop {
        let page = store.range(key, after, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(entries);
        };
        after = last.id;
        entries.extend(
            page.iter()
                .map(|e| (e.id, e.payload["n"].as_u64().unwrap_or(u64::MAX))),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_mid_run_loses_and_doubles_nothing() -> anyhow::Result<()> {
    const ENTRIES: u64 = 1_000;
    let mut server = RedisServer::start(true).await?;
    let Subscribed {
        streams,
        _receipts,
        key,
        runs,
        running,
    } = subscribed(&server).await?;

    for n in 0..ENTRIES {
        if n == ENTRIES / 3 {
            server.kill()?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.restart().await?;
        }
        append_retrying(&streams, &key, n).await?;
        if n % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    let stored = handled_and_acked(&streams, &key, &runs).await?;
    running.shutdown().await;
    every_entry_once(&stored, &runs, ENTRIES);
    Ok(())
}

/// A stream subscription started on `acme/events` of a test's own server
/// (prefix `fault:`), its receipts in SQLite.
struct Subscribed {
    streams: RedisStreamStore,
    _receipts: SqliteFixture,
    key: StreamKey,
    runs: Runs,
    running: courier::StreamSubscriptionHandle,
}

async fn subscribed(server: &RedisServer) -> anyhow::Result<Subscribed> {
    let streams = RedisStreamStore::connect(&server.url(), "fault:").await?;
    let receipts = SqliteFixture::new().await?;
    let key = StreamKey::new("acme", "events")?;
    let runs = Runs::default();
    let subscription = StreamSubscription::new(
        streams.clone(),
        receipts.courier().store().clone(),
        config(&key)?,
        runs.handler(),
    )?;
    subscription.ensure_group().await?;
    Ok(Subscribed {
        streams,
        _receipts: receipts,
        key,
        runs,
        running: subscription.start(),
    })
}

/// Waits (up to 60 s) until every stored entry was handled and none is
/// pending; the stored entries.
async fn handled_and_acked(
    streams: &RedisStreamStore,
    key: &StreamKey,
    runs: &Runs,
) -> anyhow::Result<Vec<(StreamEntryId, u64)>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stored = all_entries(streams, key).await?;
        let handled = runs.snapshot();
        let pending = streams.pending_summary(key, "workflow").await?.count;
        if stored.iter().all(|(id, _)| handled.contains_key(id)) && pending == 0 {
            return Ok(stored);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "after 60 s: {} of {} stored entries handled, {pending} pending",
            stored
                .iter()
                .filter(|(id, _)| handled.contains_key(id))
                .count(),
            stored.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every acknowledged append (`0..entries`) is stored, and every stored
/// entry was handled exactly once.
fn every_entry_once(stored: &[(StreamEntryId, u64)], runs: &Runs, entries: u64) {
    let numbers: BTreeSet<u64> = stored.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        numbers,
        (0..entries).collect(),
        "every acknowledged append survived the fault"
    );
    let handled = runs.snapshot();
    let twice: Vec<_> = handled.iter().filter(|(_, (_, runs))| *runs != 1).collect();
    assert!(
        twice.is_empty(),
        "entries handled more than once: {twice:?}"
    );
    assert_eq!(
        handled.len(),
        stored.len(),
        "only stored entries were handled"
    );
}

/// Every client connection killed (`CLIENT KILL TYPE normal`) and then the
/// server paused for 2 s (`CLIENT PAUSE 2000`) while entries are appended
/// and handled: the subscription reconnects and waits, nothing is lost or
/// handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_and_client_pause_mid_run_lose_and_double_nothing() -> anyhow::Result<()> {
    const ENTRIES: u64 = 1_000;
    let server = RedisServer::start(true).await?;
    let Subscribed {
        streams,
        _receipts,
        key,
        runs,
        running,
    } = subscribed(&server).await?;
    let mut killed = 0;
    for n in 0..ENTRIES {
        if n == ENTRIES / 3 {
            killed = server
                .command(&["CLIENT", "KILL", "TYPE", "normal"])?
                .parse()?;
        }
        if n == 2 * ENTRIES / 3 {
            anyhow::ensure!(server.command(&["CLIENT", "PAUSE", "2000"])? == "OK");
        }
        append_retrying(&streams, &key, n).await?;
        if n % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let stored = handled_and_acked(&streams, &key, &runs).await?;
    running.shutdown().await;
    assert!(killed >= 2, "CLIENT KILL reached {killed} connections");
    every_entry_once(&stored, &runs, ENTRIES);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_lost_with_an_empty_restart_is_recreated_at_its_start() -> anyhow::Result<()> {
    let mut server = RedisServer::start(false).await?;
    let Subscribed {
        streams,
        _receipts,
        key,
        runs,
        running,
    } = subscribed(&server).await?;
    for n in 0..10 {
        append_retrying(&streams, &key, n).await?;
    }
    let wait_for = |count: usize| {
        let runs = runs.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while runs.snapshot().len() < count {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{} of {count} handled after 30 s",
                    runs.snapshot().len()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        }
    };
    wait_for(10).await?;

    // The server comes back with nothing: no stream, no group.
    server.restart().await?;
    for n in 10..20 {
        append_retrying(&streams, &key, n).await?;
    }
    wait_for(20).await?;
    running.shutdown().await;
    let handled = runs.snapshot();
    let numbers: BTreeSet<u64> = handled.values().map(|(n, _)| *n).collect();
    assert_eq!(
        numbers,
        (0..20).collect(),
        "the entries after the restart were handled too"
    );
    assert!(handled.values().all(|(_, runs)| *runs == 1));
    Ok(())
}

/// A group that keeps vanishing (an operator's script, a failover loop) is
/// recreated after a short jittered pause each time, never in a tight loop
/// of recreating and failing reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_keeps_vanishing_is_recreated_after_a_pause_each_time() -> anyhow::Result<()> {
    use courier::redis::redis;
    let server = RedisServer::start(false).await?;
    let streams = RedisStreamStore::connect(&server.url(), "vanish:").await?;
    let receipts = SqliteFixture::new().await?;
    let key = StreamKey::new("acme", "events")?;
    let config = config(&key)?;
    let subscription = StreamSubscription::new(
        streams.clone(),
        receipts.courier().store().clone(),
        config.clone(),
        Runs::default().handler(),
    )?;
    subscription.ensure_group().await?;
    let running = subscription.start();
    let mut conn = streams.connection();
    let redis_key = streams.redis_key(&key);
    // Destroy the group whenever it exists, for one second.
    let mut destroyed = 0_u64;
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while tokio::time::Instant::now() < until {
        let gone: u64 = redis::cmd("XGROUP")
            .arg("DESTROY")
            .arg(&redis_key)
            .arg(&config.name)
            .query_async(&mut conn)
            .await?;
        destroyed += gone;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    running.shutdown().await;
    // Each recreation waits 50–100 ms: at most about 20 in the second.
    assert!(
        (2..=25).contains(&destroyed),
        "the group was recreated {destroyed} times in 1 s"
    );
    Ok(())
}
