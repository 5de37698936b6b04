//! Relays: N messages loaded while no worker runs, then one relay
//! subscription forwards them all downstream, as `courier serve` does — to a
//! native stream in the bench database and, given their URLs, to a Redis
//! stream and a NATS JetStream subject. The time runs from the worker's start
//! until every delivery is completed (the worker has shut down); afterwards
//! the target must hold exactly N entries. Each Redis and NATS figure stands
//! beside the same N payloads written with raw commands from this process:
//! pipelined `XADD` (100 per pipeline) and asynchronous JetStream publishes
//! (100 in flight, then their acks). Beside them, `relays.{target}.writes`
//! times the relay's own downstream writes with no outbox at all (its
//! `publish` for N messages made here, 100 in flight): the most any relay
//! that writes each message this way could reach, against the same raw
//! figure.
//!
//! Ids are `relays.{target}` and `relays.{target}.writes`.

use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream;
use courier::redis::{redis, RedisStreamStore};
use courier::{Courier, DeadLetterStore, NewMessage, OutboxStore, StreamKey, StreamStore};
use courier_server::config::{
    NativeStreamTargetConfig, NatsTargetConfig, RedisStreamTargetConfig, RetryConfig,
    SubscriptionConfig, TargetConfig,
};
use courier_server::relay::{
    connect_nats, NativeRelay, NativeStreamStore, NatsRelay, RedisRelay, Relayed,
};

use super::drain::{publish_all, time_limit};
use super::fixture::{BenchPayload, Fixture};
use super::measure::{peak_rss_kib, reset_peak_rss};
use super::{Measurement, Plan, Throughput};

const TENANT: &str = "bench";
const TOPIC: &str = "bench.relay";
const SUBSCRIPTION: &str = "relay";
/// Payloads per raw pipeline, and raw JetStream publishes in flight.
const RAW_BATCH: usize = 100;
/// The bench's JetStream stream keeps duplicates out for this long: longer
/// than any relay subscription's redelivery horizon.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(3600);

/// The downstream servers the relay cases also measure.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Downstreams<'a> {
    /// `redis://…`, for the Redis relay.
    pub(crate) redis_url: Option<&'a str>,
    /// `nats://…`, for the NATS relay.
    pub(crate) nats_url: Option<&'a str>,
}

/// Runs the relay cases: native always, Redis and NATS where a URL is given.
pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    downstreams: Downstreams<'_>,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()>
where
    F::Store: NativeStreamStore + StreamStore,
{
    let n = plan.messages;
    out.push(native(fixture, plan).await.context("relays.native")?);
    match downstreams.redis_url {
        Some(url) => {
            let prefix = format!("courier-bench:{:08x}:", fastrand::u32(..));
            let store = RedisStreamStore::connect(url, &prefix).await?;
            let measured = redis_case(fixture, plan, &store).await;
            let cleaned = super::streams::delete_keys(store.connection(), &prefix).await;
            out.extend(measured.context("relays.redis")?);
            cleaned?;
        }
        None => out.push(Measurement::skipped(
            "relays.redis",
            "relay to a Redis stream",
            "no --redis-url given",
        )),
    }
    match downstreams.nats_url {
        Some(url) => {
            let client = connect_nats(url).await?;
            let context = jetstream::new(client.clone());
            let name = format!("COURIER_BENCH_{:08X}", fastrand::u32(..));
            let subjects = format!("courier-bench.{}", name.to_ascii_lowercase());
            context
                .create_stream(jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{subjects}.>")],
                    duplicate_window: DUPLICATE_WINDOW,
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow::anyhow!("creating JetStream stream {name}: {e}"))?;
            let measured = nats_case(fixture, plan, client, &context, &name, &subjects).await;
            let deleted = context.delete_stream(&name).await;
            out.extend(measured.context("relays.nats")?);
            deleted.map_err(|e| anyhow::anyhow!("deleting JetStream stream {name}: {e}"))?;
        }
        None => out.push(Measurement::skipped(
            "relays.nats",
            "relay to a NATS JetStream subject",
            "no --nats-url given",
        )),
    }
    tracing::debug!(messages = n, "relay cases done");
    Ok(())
}

fn subscription(target: TargetConfig) -> SubscriptionConfig {
    SubscriptionConfig {
        name: SUBSCRIPTION.to_owned(),
        topics: vec![TOPIC.to_owned()],
        tenants: None,
        versions: None,
        topic_retry: Default::default(),
        retry: RetryConfig::default(),
        concurrency: 16,
        replay: None,
        target,
    }
}

fn message(seq: u64) -> anyhow::Result<NewMessage> {
    Ok(NewMessage::new(TENANT, TOPIC, &BenchPayload { seq })?)
}

async fn native<F: Fixture>(fixture: &mut F, plan: &Plan) -> anyhow::Result<Measurement>
where
    F::Store: NativeStreamStore + StreamStore,
{
    let courier = fixture.fresh().await?;
    let config = subscription(TargetConfig::Stream(NativeStreamTargetConfig {
        stream: "relayed".into(),
    }));
    let relay = NativeRelay::new(&config, courier.store().clone())?;
    let builder = plan
        .configure(courier.worker(SUBSCRIPTION))
        .handle_all_transactional(config.topics.clone(), relay);
    let (result, peak_rss) = drain(fixture, &courier, plan, builder).await?;
    let key = StreamKey::new(TENANT, "relayed")?;
    let stored = count_native(courier.store(), &key).await?;
    check_count("the native stream", stored, plan.messages)?;
    let mut measurement = Measurement::throughput(
        "relays.native",
        "relay to a native stream (the append commits with the completion)",
        result,
        None,
    );
    measurement.peak_rss_kib = peak_rss;
    Ok(measurement)
}

async fn redis_case<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    store: &RedisStreamStore,
) -> anyhow::Result<Vec<Measurement>> {
    let courier = fixture.fresh().await?;
    let config = subscription(TargetConfig::RedisStream(RedisStreamTargetConfig {
        stream: "relayed".into(),
        maxlen: None,
        dedupe_ttl_ms: None,
    }));
    let relay = RedisRelay::new(&config, store.clone())?;
    let builder = plan
        .configure(courier.worker(SUBSCRIPTION))
        .handle_all(config.topics.clone(), relay);
    let (result, peak_rss) = drain(fixture, &courier, plan, builder).await?;
    let mut conn = store.connection();
    let key = format!("{}{TENANT}:relayed", store.key_prefix());
    let stored: u64 = redis::cmd("XLEN").arg(&key).query_async(&mut conn).await?;
    check_count("the Redis stream", stored, plan.messages)?;

    // The relay's writes alone: the dedupe script per message, no outbox.
    let writes_config = subscription(TargetConfig::RedisStream(RedisStreamTargetConfig {
        stream: "writes".into(),
        maxlen: None,
        dedupe_ttl_ms: None,
    }));
    let writes_relay = RedisRelay::new(&writes_config, store.clone())?;
    let writes = writes_only(plan.messages, move |message| {
        let relay = writes_relay.clone();
        async move { relay.publish(&message).await }
    })
    .await?;
    let writes_key = format!("{}{TENANT}:writes", store.key_prefix());
    let stored: u64 = redis::cmd("XLEN")
        .arg(&writes_key)
        .query_async(&mut conn)
        .await?;
    check_count(
        "the Redis stream of the writes alone",
        stored,
        plan.messages,
    )?;

    // The same payloads, raw: pipelined XADD on one connection.
    let raw_key = format!("{}raw", store.key_prefix());
    let payloads = payloads(plan.messages)?;
    let started = Instant::now();
    for chunk in payloads.chunks(RAW_BATCH) {
        let mut pipe = redis::pipe();
        for payload in chunk {
            pipe.cmd("XADD")
                .arg(&raw_key)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await?;
    }
    let raw = Throughput::new(plan.messages, started.elapsed());
    let mut measurement = Measurement::throughput(
        "relays.redis",
        "relay to a Redis stream (dedupe script per message)",
        result,
        Some(raw),
    );
    measurement.peak_rss_kib = peak_rss;
    measurement.note = Some(format!(
        "baseline: pipelined XADD, {RAW_BATCH} per pipeline"
    ));
    let writes = writes_measurement(
        "relays.redis.writes",
        "the Redis relay's writes alone, no outbox (dedupe script per message)",
        writes,
        raw,
    );
    Ok(vec![measurement, writes])
}

async fn nats_case<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    client: async_nats::Client,
    context: &jetstream::Context,
    stream: &str,
    subjects: &str,
) -> anyhow::Result<Vec<Measurement>> {
    let courier = fixture.fresh().await?;
    let config = subscription(TargetConfig::Nats(NatsTargetConfig {
        subject: format!("{subjects}.relayed.{{tenant}}"),
        stream: stream.to_owned(),
        timeout_ms: courier_server::config::DEFAULT_RELAY_TIMEOUT_MS,
    }));
    let relay = NatsRelay::start(&config, client.clone()).await?;
    let builder = plan
        .configure(courier.worker(SUBSCRIPTION))
        .handle_all(config.topics.clone(), relay);
    let (result, peak_rss) = drain(fixture, &courier, plan, builder).await?;
    let stored = stream_messages(context, stream).await?;
    check_count("the JetStream stream", stored, plan.messages)?;

    // The relay's writes alone: a publish with Nats-Msg-Id per message and
    // its PubAck, no outbox.
    let writes_config = subscription(TargetConfig::Nats(NatsTargetConfig {
        subject: format!("{subjects}.writes.{{tenant}}"),
        stream: stream.to_owned(),
        timeout_ms: courier_server::config::DEFAULT_RELAY_TIMEOUT_MS,
    }));
    let writes_relay = NatsRelay::start(&writes_config, client).await?;
    let writes = writes_only(plan.messages, move |message| {
        let relay = writes_relay.clone();
        async move { relay.publish(&message).await }
    })
    .await?;
    let stored = stream_messages(context, stream).await?;
    check_count(
        "the JetStream stream after the writes alone",
        stored,
        2 * plan.messages,
    )?;

    // The same payloads, raw: asynchronous publishes, RAW_BATCH in flight.
    let payloads = payloads(plan.messages)?;
    let subject = format!("{subjects}.raw");
    let started = Instant::now();
    for chunk in payloads.chunks(RAW_BATCH) {
        let mut acks = Vec::with_capacity(chunk.len());
        for payload in chunk {
            let ack = context
                .publish(subject.clone(), payload.clone().into_bytes().into())
                .await
                .map_err(|e| anyhow::anyhow!("raw JetStream publish: {e}"))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await
                .map_err(|e| anyhow::anyhow!("raw JetStream ack: {e}"))?;
        }
    }
    let raw = Throughput::new(plan.messages, started.elapsed());
    let mut measurement = Measurement::throughput(
        "relays.nats",
        "relay to a NATS JetStream subject (Nats-Msg-Id, PubAck per message)",
        result,
        Some(raw),
    );
    measurement.peak_rss_kib = peak_rss;
    measurement.note = Some(format!(
        "baseline: asynchronous JetStream publishes, {RAW_BATCH} in flight"
    ));
    let writes = writes_measurement(
        "relays.nats.writes",
        "the NATS relay's writes alone, no outbox (Nats-Msg-Id, PubAck per message)",
        writes,
        raw,
    );
    Ok(vec![measurement, writes])
}

/// Loads the messages, runs the worker until every delivery is completed,
/// and returns the throughput and the peak RSS.
async fn drain<F: Fixture>(
    fixture: &mut F,
    courier: &Courier<F::Store>,
    plan: &Plan,
    builder: courier::WorkerBuilder<F::Store>,
) -> anyhow::Result<(Throughput, Option<u64>)>
where
    F::Store: OutboxStore + DeadLetterStore,
{
    // The worker registers its subscription, which must exist before the
    // messages are enqueued for them to fan out to it.
    let worker = builder.build().await?;
    publish_all(courier, plan, "relays: loading", plan.messages, message).await?;
    fixture.analyze().await?;
    let rss_reset = reset_peak_rss();
    let started = Instant::now();
    let handle = worker.start();
    let limit = time_limit(plan.messages);
    let finished = tokio::time::timeout(limit, async {
        loop {
            if fixture.deliveries_left().await? == 0 {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    handle.shutdown().await;
    let elapsed = started.elapsed();
    match finished {
        Ok(waited) => waited?,
        Err(_) => {
            let left = fixture.deliveries_left().await?;
            anyhow::bail!("{left} deliveries were left after {limit:?}");
        }
    }
    let peak_rss = if rss_reset { peak_rss_kib() } else { None };
    Ok((Throughput::new(plan.messages, elapsed), peak_rss))
}

/// Times `publish` over `n` messages made here (the bench's payloads, tenant
/// and topic, fresh ids), `RAW_BATCH` at a time in flight; every publish must
/// store its message.
async fn writes_only<P, Fut>(n: u64, publish: P) -> anyhow::Result<Throughput>
where
    P: Fn(courier::Message<courier_server::RawPayload>) -> Fut,
    Fut: std::future::Future<Output = Result<Relayed, courier::HandlerError>> + Send + 'static,
{
    let messages = payloads(n)?
        .into_iter()
        .map(|payload| {
            let now = chrono::Utc::now();
            Ok(courier::Message {
                id: uuid::Uuid::now_v7(),
                tenant: TENANT.to_owned(),
                topic: TOPIC.to_owned(),
                schema_version: 1,
                payload: serde_json::value::RawValue::from_string(payload)?,
                headers: Default::default(),
                ordering_key: None,
                priority: 0,
                subscription: SUBSCRIPTION.to_owned(),
                attempt: 1,
                occurred_at: now,
                enqueued_at: now,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let mut messages = messages.into_iter().peekable();
    while messages.peek().is_some() {
        let mut in_flight = tokio::task::JoinSet::new();
        for message in messages.by_ref().take(RAW_BATCH) {
            in_flight.spawn(publish(message));
        }
        while let Some(joined) = in_flight.join_next().await {
            match joined? {
                Ok(Relayed::Stored(_)) => {}
                Ok(other) => anyhow::bail!("a fresh message was not stored: {other:?}"),
                Err(error) => anyhow::bail!("the relay's write failed: {error}"),
            }
        }
    }
    Ok(Throughput::new(n, started.elapsed()))
}

/// The writes-alone row of a target, beside the same raw figure as its relay.
fn writes_measurement(id: &str, case: &str, writes: Throughput, raw: Throughput) -> Measurement {
    let mut measurement = Measurement::throughput(id, case, writes, Some(raw));
    measurement.note = Some(format!(
        "{RAW_BATCH} in flight: the most a relay writing each message this way could reach"
    ));
    measurement
}

async fn stream_messages(context: &jetstream::Context, stream: &str) -> anyhow::Result<u64> {
    let mut info = context
        .get_stream(stream)
        .await
        .map_err(|e| anyhow::anyhow!("reading JetStream stream {stream}: {e}"))?;
    Ok(info
        .info()
        .await
        .map_err(|e| anyhow::anyhow!("reading JetStream stream {stream}: {e}"))?
        .state
        .messages)
}

fn payloads(n: u64) -> anyhow::Result<Vec<String>> {
    (0..n)
        .map(|seq| Ok(serde_json::to_string(&BenchPayload { seq })?))
        .collect()
}

fn check_count(target: &str, stored: u64, expected: u64) -> anyhow::Result<()> {
    if stored != expected {
        anyhow::bail!("{target} holds {stored} entries after relaying {expected} messages");
    }
    Ok(())
}

async fn count_native<S: StreamStore>(store: &S, key: &StreamKey) -> anyhow::Result<u64> {
    let mut count = 0_u64;
    let mut after = courier::StreamEntryId::ZERO;
    loop {
        let page = store.range(key, after, courier::MAX_STREAM_BATCH).await?;
        let Some(last) = page.last() else {
            return Ok(count);
        };
        after = last.id;
        count += page.len() as u64;
    }
}
