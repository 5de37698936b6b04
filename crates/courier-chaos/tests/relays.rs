//! Relays under downstream faults. The outbox is on the scenario's own
//! PostgreSQL cluster, and the daemon (`courier serve`, a process of its own)
//! relays to a Redis or NATS server of the scenario's own while messages
//! keep coming: its connections are cut, the server is paused, then killed
//! and started again. Afterwards the ledger reads what arrived downstream
//! (each entry's message id, and the tenant whose stream or subject held
//! it): every message is there exactly once, and none was dead-lettered.

mod common;

use std::time::{Duration, Instant};

use common::CourierDaemon;
use courier::redis::RedisStreamStore;
use courier::{StreamEntryId, StreamKey, StreamStore};
use courier_chaos::{
    ledgered_cluster, outbox_drained, produce, record_downstream, report, shape, verdict, TOPIC,
};
use courier_testkit::servers::{NatsServer, Proxy, RedisServer};

/// Messages per scenario, one every 5 ms or so.
const MESSAGES: u64 = 1_500;
/// Retries that outlast each fault (the longest is under 3 s): a relay that
/// cannot reach its target spends attempts, as a webhook does.
const RETRY: &str = "[subscriptions.retry]\nmax_attempts = 10\nbase_ms = 200\ncap_ms = 5000\n";

/// The daemon's configuration: the outbox on `cluster`, the downstream
/// server's `section`, and the ledger's subscription relaying to `target`.
fn relay_config(cluster: &courier_chaos::PgCluster, section: &str, target: &str) -> String {
    format!(
        "database_url = \"{url}\"\nshutdown_timeout_ms = 2000\n{section}\n\n\
         [[subscriptions]]\nname = \"ledger\"\ntopics = [\"{TOPIC}\"]\n{RETRY}\n\
         [subscriptions.target]\n{target}\n",
        url = cluster.url()
    )
}

/// Produces `MESSAGES` messages (each with its oracle row), reporting how
/// many are committed.
fn produce_steadily(
    pool: &sqlx::PgPool,
) -> (
    tokio::sync::watch::Receiver<u64>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let (progress, produced) = tokio::sync::watch::channel(0);
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        for n in 0..MESSAGES {
            let (tenant, key) = shape(n);
            produce(&pool, tenant, key.as_deref(), n).await?;
            progress.send_replace(n + 1);
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        anyhow::Ok(())
    });
    (produced, task)
}

/// Once the last fault is over (at `restarted`): waits for the producer and
/// for the outbox to drain, then stops the daemon. How long the drain took
/// from `restarted`, and how many publishes failed and were retried.
async fn drained_after(
    restarted: Instant,
    producer: tokio::task::JoinHandle<anyhow::Result<()>>,
    pool: &sqlx::PgPool,
    daemon: CourierDaemon,
) -> anyhow::Result<(Duration, f64)> {
    producer.await??;
    outbox_drained(pool, Duration::from_secs(120)).await?;
    let recovery = restarted.elapsed();
    let retried = daemon
        .counter("courier_relay_published_total", "outcome=\"retry\"")
        .await?;
    daemon.stop().await?;
    Ok((recovery, retried))
}

/// Waits until `n` messages are produced.
async fn produced(progress: &mut tokio::sync::watch::Receiver<u64>, n: u64) -> anyhow::Result<()> {
    progress.wait_for(|produced| *produced >= n).await?;
    Ok(())
}

/// Every entry of `key` on `store`, by origin: (tenant, message id).
async fn relayed_to_redis(
    store: &RedisStreamStore,
    tenant: &str,
) -> anyhow::Result<Vec<(String, uuid::Uuid)>> {
    let key = StreamKey::new(tenant, "relayed")?;
    let mut arrived = Vec::new();
    let mut after = StreamEntryId::ZERO;
    loop {
        let page = store.range(&key, after, 1_000).await?;
        let Some(last) = page.last() else {
            return Ok(arrived);
        };
        after = last.id;
        for entry in &page {
            let origin = entry
                .origin
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("entry {} has no origin", entry.id))?;
            arrived.push((tenant.to_owned(), origin.message_id));
        }
    }
}

/// The Redis relay through `CLIENT KILL TYPE normal`, `CLIENT PAUSE 2000`,
/// and a SIGKILL of the server (append-only file, fsync always) with a
/// second's outage: the relay's dedupe key and the message id keep a retry
/// after a lost reply from appending twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_relay_through_client_kill_pause_and_restart_loses_and_doubles_nothing(
) -> anyhow::Result<()> {
    let (cluster, pool) = ledgered_cluster().await?;
    let mut redis = RedisServer::start(true).await?;
    let daemon = CourierDaemon::start(&relay_config(
        &cluster,
        &format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"chaos:\"",
            redis.url()
        ),
        "type = \"redis_stream\"\nstream = \"relayed\"",
    ))
    .await?;
    let (mut progress, producer) = produce_steadily(&pool);
    produced(&mut progress, MESSAGES / 4).await?;
    let killed: u64 = redis
        .command(&["CLIENT", "KILL", "TYPE", "normal"])?
        .parse()?;
    produced(&mut progress, MESSAGES / 2).await?;
    anyhow::ensure!(redis.command(&["CLIENT", "PAUSE", "2000"])? == "OK");
    produced(&mut progress, 3 * MESSAGES / 4).await?;
    redis.kill()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.restart().await?;
    let (recovery, retried) = drained_after(Instant::now(), producer, &pool, daemon).await?;

    let store = RedisStreamStore::connect(&redis.url(), "chaos:").await?;
    let mut arrived = relayed_to_redis(&store, "acme").await?;
    arrived.extend(relayed_to_redis(&store, "globex").await?);
    record_downstream(&pool, &arrived).await?;
    let verdict = verdict(&pool).await?;
    println!(
        "CLIENT KILL closed {killed} connections; {retried} publishes failed and were retried; \
         {} entries downstream",
        arrived.len()
    );
    anyhow::ensure!(killed >= 1, "CLIENT KILL closed no connection");
    anyhow::ensure!(
        retried > 0.0,
        "no publish failed: the faults missed the relay"
    );
    report(
        "Redis relay: CLIENT KILL, PAUSE, kill -9",
        &verdict,
        recovery,
    )
}

/// The NATS JetStream relay through its connections cut (a TCP proxy in
/// front of the server closes them), the server frozen with SIGSTOP for
/// 2 s, and a SIGKILL of the server with a second's outage: `Nats-Msg-Id`
/// and the stream's duplicate window keep a republish from storing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_relay_through_cut_connections_pause_and_restart_loses_and_doubles_nothing(
) -> anyhow::Result<()> {
    let (cluster, pool) = ledgered_cluster().await?;
    let mut nats = NatsServer::start().await?;
    let proxy = Proxy::start(nats.port).await?;
    let client = async_nats::connect(nats.url()).await?;
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: "RELAYED".into(),
            subjects: vec!["relayed.>".into()],
            duplicate_window: Duration::from_secs(3600),
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let daemon = CourierDaemon::start(&relay_config(
        &cluster,
        &format!("[nats]\nurl = \"nats://127.0.0.1:{}\"", proxy.port),
        "type = \"nats\"\nsubject = \"relayed.{tenant}.{topic}\"\nstream = \"RELAYED\"\ntimeout_ms = 1000",
    ))
    .await?;
    let (mut progress, producer) = produce_steadily(&pool);
    produced(&mut progress, MESSAGES / 4).await?;
    proxy.cut();
    produced(&mut progress, MESSAGES / 2).await?;
    nats.signal("STOP")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.signal("CONT")?;
    produced(&mut progress, 3 * MESSAGES / 4).await?;
    nats.kill()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    nats.restart().await?;
    let (recovery, retried) = drained_after(Instant::now(), producer, &pool, daemon).await?;

    // Read back by sequence, on a connection of the test's own.
    let jetstream = async_nats::jetstream::new(async_nats::connect(nats.url()).await?);
    let stream = jetstream.get_stream("RELAYED").await?;
    let state = stream.cached_info().state.clone();
    let mut arrived = Vec::new();
    for sequence in state.first_sequence..=state.last_sequence {
        let message = stream.get_raw_message(sequence).await?;
        let tenant = message
            .subject
            .split('.')
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let header = |name: &str| {
            message
                .headers
                .get(name)
                .map(|value| value.as_str().to_owned())
                .ok_or_else(|| anyhow::anyhow!("message {sequence} has no {name}"))
        };
        let id: uuid::Uuid = header("Courier-Message-Id")?.parse()?;
        anyhow::ensure!(
            header("Nats-Msg-Id")? == format!("{}:{id}", message.subject),
            "message {sequence}'s Nats-Msg-Id is not its subject and message id"
        );
        arrived.push((tenant, id));
    }
    record_downstream(&pool, &arrived).await?;
    let verdict = verdict(&pool).await?;
    println!(
        "{retried} publishes failed and were retried; {} messages in JetStream (sequences {}..={})",
        arrived.len(),
        state.first_sequence,
        state.last_sequence
    );
    anyhow::ensure!(
        retried > 0.0,
        "no publish failed: the faults missed the relay"
    );
    report(
        "NATS relay: connections cut, SIGSTOP 2 s, kill -9",
        &verdict,
        recovery,
    )
}
