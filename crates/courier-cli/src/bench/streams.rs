//! Streams: appends, group reads with acks, a stream subscription's drain
//! (receipt and ack per entry), append → handler latency, and claiming
//! 10,000 idle entries; on the bench database's native streams and, given a
//! Redis URL, on Redis, where each figure stands beside the same work done
//! with raw commands (pipelined `XADD`, an `XREADGROUP` + `XACK` loop).
//!
//! Ids are `streams.{backend}.{case}`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use courier::redis::{redis, RedisStreamStore};
use courier::{
    stream_handler_fn, ClaimIdle, GroupStart, HandlerError, NewStreamEntry, ReadNew, StreamEntryId,
    StreamKey, StreamMessage, StreamReceipts, StreamStore, StreamSubscription,
    StreamSubscriptionConfig,
};
use serde_json::json;

use super::fixture::Fixture;
use super::measure::{peak_rss_kib, percentiles, reset_peak_rss, Counter};
use super::{Measurement, Plan, Throughput};

const TENANT: &str = "bench";
/// Entries per append call and per read.
const BATCH: usize = 100;
/// Idle entries the claim case takes over.
const CLAIM_ENTRIES: usize = 10_000;

/// Runs the stream cases on the fixture's native streams and, with
/// `redis_url`, on Redis with raw baselines.
pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    redis_url: Option<&str>,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()>
where
    F::Store: StreamStore + StreamReceipts,
{
    let courier = fixture.fresh().await?;
    let native = courier.store().clone();
    let backend = native.backend();
    cases(&native, &native, backend, plan, None, out).await?;
    match redis_url {
        Some(url) => {
            let prefix = format!("courier-bench:{:08x}:", fastrand::u32(..));
            let redis = RedisStreamStore::connect(url, &prefix).await?;
            let raw = RawRedis::connect(url, &redis).await?;
            let result = cases(&redis, &native, "redis", plan, Some(&raw), out).await;
            raw.cleanup(&prefix).await?;
            result?;
        }
        None => out.push(Measurement::skipped(
            "streams.redis",
            "streams on Redis",
            "no --redis-url given",
        )),
    }
    Ok(())
}

fn entries(from: u64, n: usize) -> Vec<NewStreamEntry> {
    (from..from + n as u64)
        .map(|i| NewStreamEntry::new(json!({ "n": i, "body": "0123456789abcdef0123456789abcdef" })))
        .collect()
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn entries_to_preload(plan: &Plan) -> usize {
    usize::try_from(plan.messages.min(100_000)).unwrap_or(100_000)
}

async fn preload<S: StreamStore>(store: &S, key: &StreamKey, n: usize) -> anyhow::Result<()> {
    let mut done = 0;
    while done < n {
        let take = (n - done).min(1_000);
        store.append(key, &entries(done as u64, take)).await?;
        done += take;
    }
    Ok(())
}

async fn cases<S: StreamStore, R: StreamReceipts>(
    streams: &S,
    receipts: &R,
    backend: &str,
    plan: &Plan,
    raw: Option<&RawRedis>,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let id = |case: &str| format!("streams.{backend}.{case}");

    for producers in [1_usize, 16] {
        let key = StreamKey::new(TENANT, format!("append-{producers}"))?;
        let result = append_for(streams, &key, producers, plan.enqueue_for).await?;
        let baseline = match raw {
            Some(raw) => Some(
                raw.xadd_for(
                    &format!("raw-append-{producers}"),
                    producers,
                    plan.enqueue_for,
                )
                .await?,
            ),
            None => None,
        };
        out.push(Measurement::throughput(
            &id(&format!("append.{producers}")),
            &format!("{producers} producer(s) appending batches of {BATCH}"),
            result,
            baseline,
        ));
    }

    let n = entries_to_preload(plan);
    for consumers in [1_usize, 4] {
        let key = StreamKey::new(TENANT, format!("read-{consumers}"))?;
        preload(streams, &key, n).await?;
        streams
            .ensure_group(&key, "bench", GroupStart::Beginning)
            .await?;
        let result = read_ack(streams, &key, consumers, n).await?;
        let baseline = match raw {
            Some(raw) => {
                let raw_key = format!("raw-read-{consumers}");
                raw.preload(&raw_key, n).await?;
                Some(raw.read_ack(&raw_key, consumers, n).await?)
            }
            None => None,
        };
        out.push(Measurement::throughput(
            &id(&format!("read_ack.{consumers}")),
            &format!("{consumers} consumer(s) of one group reading {BATCH} at a time and acking"),
            result,
            baseline,
        ));
    }

    // A stream subscription: no-op handler, a receipt and an ack per entry.
    let key = StreamKey::new(TENANT, "subscription")?;
    preload(streams, &key, n).await?;
    let counter = Counter::new(n as u64);
    let handler = {
        let counter = Arc::clone(&counter);
        stream_handler_fn(move |_message: StreamMessage<serde_json::Value>| {
            let counter = Arc::clone(&counter);
            async move {
                counter.hit();
                Ok::<(), HandlerError>(())
            }
        })
    };
    let mut config = StreamSubscriptionConfig::new(format!("bench-{backend}"), key.clone())?;
    config.consumer = "bench".into();
    config.start = GroupStart::Beginning;
    config.batch = BATCH;
    config.block = Duration::from_millis(100);
    let subscription = StreamSubscription::new(streams.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    let rss_reset = reset_peak_rss();
    let started = Instant::now();
    let running = subscription.start();
    counter.reached().await;
    // Until the last receipts and acks are written, not just the last call.
    running.shutdown().await;
    let elapsed = started.elapsed();
    let baseline = match raw {
        Some(raw) => {
            raw.preload("raw-subscription", n).await?;
            Some(raw.read_ack("raw-subscription", 1, n).await?)
        }
        None => None,
    };
    let mut measurement = Measurement::throughput(
        &id("subscription"),
        "a stream subscription with a no-op handler: read, receipt, ack (batches of 100)",
        Throughput::new(n as u64, elapsed),
        baseline,
    );
    measurement.peak_rss_kib = if rss_reset { peak_rss_kib() } else { None };
    measurement.note = Some(format!(
        "receipts in the {} database; baseline: a raw XREADGROUP + XACK loop",
        receipts_backend(receipts)
    ));
    out.push(measurement);

    out.push(latency(streams, receipts, backend, plan).await?);
    out.push(claim(streams, backend).await?);
    Ok(())
}

fn receipts_backend<R: StreamReceipts>(_receipts: &R) -> &'static str {
    let name = std::any::type_name::<R>();
    if name.contains("Pg") {
        "PostgreSQL"
    } else {
        "SQLite"
    }
}

async fn append_for<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    producers: usize,
    duration: Duration,
) -> anyhow::Result<Throughput> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for p in 0..producers {
        let store = store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut appended = 0_u64;
            while Instant::now() < deadline {
                store
                    .append(&key, &entries((p as u64) << 40 | appended, BATCH))
                    .await?;
                appended += BATCH as u64;
            }
            anyhow::Ok(appended)
        }));
    }
    let mut count = 0;
    for task in tasks {
        count += task.await??;
    }
    Ok(Throughput::new(count, started.elapsed()))
}

async fn read_ack<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    consumers: usize,
    n: usize,
) -> anyhow::Result<Throughput> {
    let counter = Counter::new(n as u64);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..consumers {
        let store = store.clone();
        let key = key.clone();
        let counter = Arc::clone(&counter);
        tasks.push(tokio::spawn(async move {
            let read = ReadNew {
                group: "bench".into(),
                consumer: format!("c{c}"),
                count: BATCH,
                block: Some(Duration::from_millis(50)),
            };
            while counter.count() < n as u64 {
                let got = store.read_new(&key, &read).await?;
                if got.is_empty() {
                    continue;
                }
                let ids: Vec<StreamEntryId> = got.iter().map(|d| d.entry.id).collect();
                store.ack(&key, "bench", &ids).await?;
                counter.add(ids.len() as u64);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(Throughput::new(n as u64, started.elapsed()))
}

async fn latency<S: StreamStore, R: StreamReceipts>(
    streams: &S,
    receipts: &R,
    backend: &str,
    plan: &Plan,
) -> anyhow::Result<Measurement> {
    let key = StreamKey::new(TENANT, "latency")?;
    let count = usize::try_from(u64::from(plan.rate) * plan.latency_for.as_secs().max(1))?;
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let counter = Counter::new(count as u64);
    let handler = {
        let samples = Arc::clone(&samples);
        let counter = Arc::clone(&counter);
        stream_handler_fn(move |message: StreamMessage<serde_json::Value>| {
            let samples = Arc::clone(&samples);
            let counter = Arc::clone(&counter);
            async move {
                let sent = message.payload["sent_us"].as_u64().unwrap_or(0);
                let waited = now_micros().saturating_sub(sent);
                samples
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Duration::from_micros(waited));
                counter.hit();
                Ok::<(), HandlerError>(())
            }
        })
    };
    let mut config = StreamSubscriptionConfig::new(format!("latency-{backend}"), key.clone())?;
    config.consumer = "bench".into();
    config.block = Duration::from_secs(5);
    let subscription = StreamSubscription::new(streams.clone(), receipts.clone(), config, handler)?;
    subscription.ensure_group().await?;
    let running = subscription.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(plan.rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..count {
        ticker.tick().await;
        streams
            .append(
                &key,
                &[NewStreamEntry::new(
                    json!({ "n": i, "sent_us": now_micros() }),
                )],
            )
            .await?;
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), counter.reached()).await;
    let seconds = started.elapsed().as_secs_f64();
    running.shutdown().await;
    let mut samples = samples
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let handled = samples.len() as u64;
    let Some(latency) = percentiles(&mut samples) else {
        anyhow::bail!("streams latency: no entry reached the handler");
    };
    let mut measurement = Measurement::latency(
        &format!("streams.{backend}.latency"),
        &format!(
            "append → handler start at {}/s, subscription blocked on its read",
            plan.rate
        ),
        handled,
        seconds,
        latency,
    );
    if handled < count as u64 {
        measurement.note = Some(format!(
            "only {handled} of {count} entries arrived within 30 s"
        ));
    }
    Ok(measurement)
}

async fn claim<S: StreamStore>(streams: &S, backend: &str) -> anyhow::Result<Measurement> {
    let key = StreamKey::new(TENANT, "claim")?;
    preload(streams, &key, CLAIM_ENTRIES).await?;
    streams
        .ensure_group(&key, "bench", GroupStart::Beginning)
        .await?;
    // A consumer reads every entry and dies before acking any.
    let read = ReadNew {
        group: "bench".into(),
        consumer: "crashed".into(),
        count: 1_000,
        block: Some(Duration::from_millis(100)),
    };
    let mut taken = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while taken < CLAIM_ENTRIES && Instant::now() < deadline {
        taken += streams.read_new(&key, &read).await?.len();
    }
    let started = Instant::now();
    let mut claimed = 0_u64;
    let mut cursor = StreamEntryId::ZERO;
    loop {
        let claim = ClaimIdle {
            group: "bench".into(),
            consumer: "alive".into(),
            min_idle: Duration::ZERO,
            cursor,
            count: BATCH,
        };
        let answer = streams.claim_idle(&key, &claim).await?;
        claimed += answer.entries.len() as u64;
        if answer.next == StreamEntryId::ZERO {
            break;
        }
        cursor = answer.next;
    }
    Ok(Measurement::throughput(
        &format!("streams.{backend}.claim"),
        &format!("claiming {CLAIM_ENTRIES} idle entries, {BATCH} per call"),
        Throughput::new(claimed, started.elapsed()),
        None,
    ))
}

/// The same work as raw Redis commands, for the baselines.
struct RawRedis {
    conn: redis::aio::ConnectionManager,
    prefix: String,
}

impl RawRedis {
    async fn connect(_url: &str, store: &RedisStreamStore) -> anyhow::Result<Self> {
        Ok(Self {
            conn: store.connection(),
            prefix: format!("{}raw:", store.key_prefix()),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    async fn xadd_for(
        &self,
        name: &str,
        producers: usize,
        duration: Duration,
    ) -> anyhow::Result<Throughput> {
        let key = self.key(name);
        let started = Instant::now();
        let deadline = started + duration;
        let mut tasks = Vec::new();
        for _ in 0..producers {
            let mut conn = self.conn.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let mut appended = 0_u64;
                let payload =
                    json!({ "n": 0, "body": "0123456789abcdef0123456789abcdef" }).to_string();
                while Instant::now() < deadline {
                    let mut pipe = redis::pipe();
                    for _ in 0..BATCH {
                        pipe.cmd("XADD")
                            .arg(&key)
                            .arg("*")
                            .arg("payload")
                            .arg(&payload)
                            .ignore();
                    }
                    let () = pipe.query_async(&mut conn).await?;
                    appended += BATCH as u64;
                }
                anyhow::Ok(appended)
            }));
        }
        let mut count = 0;
        for task in tasks {
            count += task.await??;
        }
        Ok(Throughput::new(count, started.elapsed()))
    }

    async fn preload(&self, name: &str, n: usize) -> anyhow::Result<()> {
        let key = self.key(name);
        let mut conn = self.conn.clone();
        let payload = json!({ "n": 0, "body": "0123456789abcdef0123456789abcdef" }).to_string();
        let mut done = 0;
        while done < n {
            let take = (n - done).min(1_000);
            let mut pipe = redis::pipe();
            for _ in 0..take {
                pipe.cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("payload")
                    .arg(&payload)
                    .ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
            done += take;
        }
        let _: redis::Value = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("bench")
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn read_ack(&self, name: &str, consumers: usize, n: usize) -> anyhow::Result<Throughput> {
        let key = self.key(name);
        let counter = Counter::new(n as u64);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..consumers {
            let mut conn = self.conn.clone();
            let key = key.clone();
            let counter = Arc::clone(&counter);
            tasks.push(tokio::spawn(async move {
                while counter.count() < n as u64 {
                    let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg("bench")
                        .arg(format!("c{c}"))
                        .arg("COUNT")
                        .arg(BATCH)
                        .arg("STREAMS")
                        .arg(&key)
                        .arg(">")
                        .query_async(&mut conn)
                        .await?;
                    let ids: Vec<String> = reply
                        .keys
                        .into_iter()
                        .flat_map(|k| k.ids.into_iter().map(|e| e.id))
                        .collect();
                    if ids.is_empty() {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let _: u64 = redis::cmd("XACK")
                        .arg(&key)
                        .arg("bench")
                        .arg(&ids)
                        .query_async(&mut conn)
                        .await?;
                    counter.add(ids.len() as u64);
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        Ok(Throughput::new(n as u64, started.elapsed()))
    }

    /// Deletes every key of the bench run.
    async fn cleanup(&self, prefix: &str) -> anyhow::Result<()> {
        delete_keys(self.conn.clone(), prefix).await
    }
}

/// Deletes every Redis key under `prefix` (a bench run's own).
pub(crate) async fn delete_keys(
    mut conn: redis::aio::ConnectionManager,
    prefix: &str,
) -> anyhow::Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let _: u64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
