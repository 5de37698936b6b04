//! The downstreams: connecting to them, and counting what each holds of a
//! run's events by message id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Context};
use async_nats::jetstream;
use courier::redis::RedisStreamStore;
use courier::{StreamEntryId, StreamKey, StreamStore};
use courier_server::relay::connect_nats;
use courier_server::relay::nats::MESSAGE_ID_HEADER;
use futures_util::StreamExt;
use uuid::Uuid;

use crate::{Cli, TENANT, TOPIC};

/// The duplicate window of a JetStream stream the example creates: longer
/// than the relay's redelivery horizon (380 s with the default retry
/// policy), which the NATS relay checks at start.
const JETSTREAM_DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

/// Where `relay-events` writes.
pub(crate) enum EventsStream {
    /// The native stream in the outbox database.
    Native,
    /// A Redis stream.
    Redis(RedisStreamStore),
}

/// The NATS downstream.
pub(crate) struct Nats {
    pub(crate) client: async_nats::Client,
    pub(crate) stream: String,
    pub(crate) subject: String,
}

/// What one downstream holds of this run's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Downstream {
    /// What it is (`native stream acme/events`, …).
    pub(crate) name: String,
    /// The subscription relaying to it.
    pub(crate) subscription: &'static str,
    /// Copies of each of this run's events it holds, by message id.
    pub(crate) copies: BTreeMap<Uuid, usize>,
    /// This run's events the subscription dead-lettered.
    pub(crate) dead: BTreeSet<Uuid>,
}

impl Downstream {
    /// Copies of this run's events it holds.
    pub(crate) fn entries(&self) -> usize {
        self.copies.values().sum()
    }
}

/// What one run placed and found downstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    /// Every event placed, by message id.
    pub(crate) events: BTreeSet<Uuid>,
    /// The poison ones among them.
    pub(crate) poison: BTreeSet<Uuid>,
    /// Each downstream.
    pub(crate) downstreams: Vec<Downstream>,
}

impl Report {
    /// Every way the run fell short of "each good event once downstream,
    /// each poison event a dead letter"; empty when it did not.
    pub(crate) fn problems(&self) -> Vec<String> {
        let good: BTreeSet<Uuid> = self.events.difference(&self.poison).copied().collect();
        let mut problems = Vec::new();
        for downstream in &self.downstreams {
            let held: BTreeSet<Uuid> = downstream.copies.keys().copied().collect();
            let missing = good.difference(&held).count();
            if missing > 0 {
                problems.push(format!("{}: {missing} events missing", downstream.name));
            }
            let doubled = downstream.copies.values().filter(|n| **n > 1).count();
            if doubled > 0 {
                problems.push(format!(
                    "{}: {doubled} events held twice or more",
                    downstream.name
                ));
            }
            let leaked = held.intersection(&self.poison).count();
            if leaked > 0 {
                problems.push(format!(
                    "{}: {leaked} poison events relayed",
                    downstream.name
                ));
            }
            if downstream.dead != self.poison {
                problems.push(format!(
                    "{}: {} dead letters, expected the {} poison events",
                    downstream.subscription,
                    downstream.dead.len(),
                    self.poison.len()
                ));
            }
        }
        problems
    }
}

/// Every entry of `key` relaying one of `events`, counted by message id.
pub(crate) async fn stream_copies<S: StreamStore>(
    store: &S,
    key: &StreamKey,
    events: &BTreeSet<Uuid>,
) -> anyhow::Result<BTreeMap<Uuid, usize>> {
    let mut copies = BTreeMap::new();
    let mut after = StreamEntryId::ZERO;
    loop {
        let page = store.range(key, after, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(copies);
        };
        after = last.id;
        for entry in &page {
            if let Some(origin) = &entry.origin {
                if events.contains(&origin.message_id) {
                    *copies.entry(origin.message_id).or_insert(0) += 1;
                }
            }
        }
    }
}

/// Every message of the JetStream stream on `subject` relaying one of
/// `events`, counted by message id, read by a consumer of this run's own.
pub(crate) async fn jetstream_copies(
    nats: &Nats,
    events: &BTreeSet<Uuid>,
) -> anyhow::Result<BTreeMap<Uuid, usize>> {
    let context = jetstream::new(nats.client.clone());
    let stream = context.get_stream(&nats.stream).await?;
    let mut consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: nats.subject.clone(),
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_policy: jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await?;
    let total = consumer.info().await?.num_pending;
    let mut copies = BTreeMap::new();
    let mut read = 0_u64;
    while read < total {
        let mut batch = consumer
            .fetch()
            .max_messages(500)
            .expires(Duration::from_secs(1))
            .messages()
            .await?;
        let before = read;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("reading JetStream: {e}"))?;
            read += 1;
            let id = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(MESSAGE_ID_HEADER))
                .and_then(|value| value.as_str().parse::<Uuid>().ok());
            if let Some(id) = id.filter(|id| events.contains(id)) {
                *copies.entry(id).or_insert(0) += 1;
            }
        }
        if read == before {
            bail!("JetStream stopped delivering at {read} of {total} messages");
        }
    }
    let name = consumer.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    Ok(copies)
}

/// Connects to the servers the options name: Redis (checked with a ping)
/// and NATS (the JetStream stream created if missing).
pub(crate) async fn downstreams(
    cli: &Cli,
    run_tag: &str,
) -> anyhow::Result<(EventsStream, Option<Nats>)> {
    let events_stream = match &cli.redis_url {
        Some(url) => {
            let prefix = cli
                .key_prefix
                .clone()
                .unwrap_or_else(|| format!("outbox-relay:{run_tag}:"));
            let store = RedisStreamStore::connect(url, &prefix)
                .await
                .context("connecting to Redis (--redis-url)")?;
            store
                .ping()
                .await
                .context("connecting to Redis (--redis-url)")?;
            EventsStream::Redis(store)
        }
        None => EventsStream::Native,
    };
    let nats = match &cli.nats_url {
        Some(url) => {
            let client = connect_nats(url)
                .await
                .context("connecting to NATS (--nats-url)")?;
            jetstream::new(client.clone())
                .get_or_create_stream(jetstream::stream::Config {
                    name: cli.nats_stream.clone(),
                    subjects: vec![format!("{}.>", cli.nats_subject_prefix)],
                    duplicate_window: JETSTREAM_DUPLICATE_WINDOW,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .with_context(|| format!("creating JetStream stream {}", cli.nats_stream))?;
            Some(Nats {
                client,
                stream: cli.nats_stream.clone(),
                subject: format!("{}.{TENANT}.{TOPIC}", cli.nats_subject_prefix),
            })
        }
        None => None,
    };
    Ok((events_stream, nats))
}
