//! Downstream servers restarted mid-relay: a redis-server (AOF, fsync on
//! every write) and a nats-server (JetStream on disk) that the test starts
//! itself are killed with SIGKILL and started again on the same port and
//! directory while the daemon relays 1,000 messages. Afterwards every
//! message is downstream exactly once (counted by message id) and nothing
//! is dead-lettered. The shared servers are never touched.
// Test code: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod relay_support;

use std::time::Duration;

use relay_support::*;
use serde_json::Value;
use tokio::task::JoinHandle;
use uuid::Uuid;

const MESSAGES: usize = 1_000;
const BATCH: usize = 10;
const TENANTS: [&str; 2] = ["acme", "globex"];
/// When to kill the server (after this many messages reached it) and for
/// how long: once briefly, once for longer than a publish may wait for its
/// confirmation (2 s, 4 s in all for NATS), so that attempts in flight fail
/// and are retried while their first write may still land.
const OUTAGES: [(u32, u64, Duration); 2] = [
    (1, 200, Duration::from_millis(700)),
    (2, 600, Duration::from_secs(5)),
];

/// Publishes `MESSAGES` messages through the daemon's API in batches of
/// `BATCH`, one batch every 15 ms, so relaying goes on throughout.
fn publish_steadily(daemon_address: std::net::SocketAddr) -> JoinHandle<Vec<Uuid>> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut ids = Vec::with_capacity(MESSAGES);
        for batch in 0..MESSAGES / BATCH {
            let messages: Vec<Value> = (0..BATCH)
                .map(|i| {
                    let n = batch * BATCH + i;
                    message(TENANTS[n % 2], "order.placed", n)
                })
                .collect();
            let response = client
                .post(format!("http://{daemon_address}/v1/messages/batch"))
                .header("content-type", "application/json")
                .body(serde_json::json!({ "messages": messages }).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201);
            let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            for message in body["messages"].as_array().unwrap() {
                ids.push(message["id"].as_str().unwrap().parse().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        ids
    })
}

async fn a_redis_killed_and_restarted_mid_relay_loses_and_doubles_nothing(db: Db) {
    let mut redis = OwnRedis::start().await;
    let prefix = "relay:";
    let name = format!("restart-redis-{}", db.kind());
    let mut config = db.config(vec![subscription(
        &name,
        &["order.*"],
        redis_target("orders"),
    )]);
    config.redis = redis_section(&redis.url(), prefix);
    let daemon = Daemon::start(config).await.unwrap();
    let producer = publish_steadily(daemon.address);

    let acme = format!("{prefix}acme:orders");
    let globex = format!("{prefix}globex:orders");
    let url = redis.url();
    let relayed =
        || async { xlen(&url, &acme).await.unwrap_or(0) + xlen(&url, &globex).await.unwrap_or(0) };
    for (round, at, down) in OUTAGES {
        let reached = until(Duration::from_secs(60), || async { relayed().await >= at }).await;
        assert!(reached, "round {round}: only {} relayed", relayed().await);
        redis.kill().await;
        tokio::time::sleep(down).await;
        redis.restart().await;
    }
    let ids = producer.await.unwrap();
    db.wait_drained(&name, Duration::from_secs(120)).await;
    assert_eq!(
        db.open_and_dead(&name).await,
        (0, 0),
        "nothing is dead-lettered"
    );

    let store = redis_store(&redis.url(), prefix).await;
    let mut entries = read_all(&store, &key("acme", "orders")).await;
    entries.extend(read_all(&store, &key("globex", "orders")).await);
    let counts = by_message_id(&entries);
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "appended twice: {doubled:?}");
    let missing: Vec<_> = ids.iter().filter(|id| !counts.contains_key(id)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    assert_eq!(entries.len(), MESSAGES);
    report(&daemon, &name).await;
    daemon.shutdown().await;
    redis.kill().await;
}

async fn a_nats_killed_and_restarted_mid_relay_loses_and_doubles_nothing(db: Db) {
    let mut nats = OwnNats::start().await;
    let stream = "RELAYED";
    let client = nats_client(&nats.url()).await;
    create_jetstream(&client, stream, "relayed.>", Duration::from_secs(3600)).await;
    let name = format!("restart-nats-{}", db.kind());
    let mut config = db.config(vec![subscription(
        &name,
        &["order.*"],
        nats_target("relayed.{tenant}.{topic}", stream),
    )]);
    config.nats = nats_section(&nats.url());
    let daemon = Daemon::start(config).await.unwrap();
    let producer = publish_steadily(daemon.address);

    let stored = |client: async_nats::Client| async move {
        let context = async_nats::jetstream::new(client);
        let info = tokio::time::timeout(Duration::from_millis(500), async {
            context
                .get_stream(stream)
                .await
                .ok()?
                .info()
                .await
                .ok()
                .map(|i| i.state.messages)
        })
        .await;
        info.ok().flatten().unwrap_or(0)
    };
    for (round, at, down) in OUTAGES {
        let reached = until(Duration::from_secs(60), || async {
            stored(client.clone()).await >= at
        })
        .await;
        assert!(
            reached,
            "round {round}: only {} stored",
            stored(client.clone()).await
        );
        nats.kill().await;
        tokio::time::sleep(down).await;
        nats.restart().await;
    }
    let ids = producer.await.unwrap();
    db.wait_drained(&name, Duration::from_secs(120)).await;
    assert_eq!(
        db.open_and_dead(&name).await,
        (0, 0),
        "nothing is dead-lettered"
    );

    let reader = nats_client(&nats.url()).await;
    let messages = jetstream_messages(&reader, stream).await;
    let counts = count_by_message_id(&messages);
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "stored twice: {doubled:?}");
    let missing: Vec<_> = ids
        .iter()
        .filter(|id| !counts.contains_key(&id.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "lost: {} of {MESSAGES}: {missing:?}",
        missing.len()
    );
    assert_eq!(messages.len(), MESSAGES);
    report(&daemon, &name).await;
    daemon.shutdown().await;
    nats.kill().await;
}

/// Checks that the outages hit relays in flight (some attempts failed and
/// were retried) and prints what the relay counted.
async fn report(daemon: &Daemon, name: &str) {
    courier_server::metrics::prometheus().run_upkeep();
    let metrics = daemon.metrics().await;
    let count = |outcome: &str| {
        counter(
            &metrics,
            "courier_relay_published_total",
            &[("subscription", name), ("outcome", outcome)],
        )
    };
    let (stored, duplicate, retry) = (count("stored"), count("duplicate"), count("retry"));
    eprintln!("{name}: stored {stored}, duplicate {duplicate}, retried attempts {retry}");
    assert!(retry > 0, "no relay attempt met an outage: {metrics}");
    assert_eq!(stored + duplicate, MESSAGES as u64, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_redis_killed_and_restarted_mid_relay_loses_and_doubles_nothing() {
    a_redis_killed_and_restarted_mid_relay_loses_and_doubles_nothing(Db::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_nats_killed_and_restarted_mid_relay_loses_and_doubles_nothing() {
    a_nats_killed_and_restarted_mid_relay_loses_and_doubles_nothing(Db::sqlite().await).await;
}
