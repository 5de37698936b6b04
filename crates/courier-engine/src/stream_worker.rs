//! Stream subscriptions: a handler over a stream, through a consumer group of
//! its own.
//!
//! A [`StreamSubscription`] reads its stream through the group named after
//! the subscription, so two subscriptions on one stream each get every entry
//! and the consumers of one subscription split them. Each entry is handled
//! under correlation id `{subscription}:{stream}:{entry id}`:
//!
//! - success: the receipt is written (with the effect's transaction for a
//!   [`TransactionalStreamHandler`]), then the entry is acked; an entry that
//!   already has a receipt is acked without running the handler again;
//! - failure, panic or timeout: the entry stays pending (its error is kept,
//!   bounded) and is claimed again once idle for `min_idle`;
//! - [`HandlerError::Permanent`], or a failure at the `max_deliveries`th
//!   delivery (deferrals excluded, crashes included): the entry is appended to
//!   `{stream}.dead` with its errors and acked, atomically. A deferred
//!   entry's delivery is taken back in the backend
//!   ([`StreamStore::uncount_deliveries`]), so it counts nowhere, after a
//!   restart or a claim by another consumer too (only where the backend
//!   could not be reached does this process discount it instead);
//! - [`HandlerError::Snooze`] (a deferral, e.g. a tenant over its quota): the
//!   entry stays pending, the entries of its batch not started yet stay
//!   pending unrun, and the subscription stops reading and claiming for a
//!   backoff that grows from `defer_min` to `defer_max` (with jitter), one
//!   step per batch that deferred; after the pause it takes up its own
//!   pending entries (the deferred ones) first.
//!
//! Shutdown: no further entry starts; the handlers in flight finish until
//! `shutdown_timeout` and their batch is settled; the rest stays pending.
//!
//! While a started subscription works on entries — running, waiting their
//! turn in a batch, read ahead, waiting for their ack — it touches them
//! ([`StreamStore::touch`]) every third of `min_idle`, so another consumer
//! of the subscription does not claim them as idle and run them beside it;
//! failed, deferred and unrun entries are left to go idle.
//!
//! On start and after every backend outage the subscription re-reads its own
//! pending entries first (a lost reply leaves entries there); it claims idle
//! entries every `claim_interval`, even while reads keep returning entries;
//! consumers of its group idle for `consumer_idle_limit` with nothing pending
//! are deleted.
//!
//! Through a backlog it works as a pipeline: while one batch's handlers run,
//! the next batches (two, four on Redis) are read and their receipts looked
//! up, and up to four earlier batches' receipts and acks are written, each
//! read and each write on a task of its own. A batch is settled before its
//! own-pending re-read or claim could see it again, and a batch read
//! ahead but never handled (a deferral, a stop) stays pending to this
//! consumer without its delivery counting.
//!
//! Metrics (labelled by subscription only, never tenant or stream):
//! `courier_stream_{read,claimed,acked,dead_lettered,deferred}_total`,
//! `courier_stream_pending` (the group's pending entries, every claim
//! interval), `courier_stream_lag` (the entries its group has not handed out
//! yet, every claim interval; not set where the backend cannot tell),
//! `courier_stream_visibility_wait_seconds` (PostgreSQL: how long the oldest
//! committed entry an open transaction elsewhere holds back has waited, every
//! claim interval), `courier_stream_handler_duration_seconds`,
//! `courier_stream_groups_recreated_total` and
//! `courier_backend_reconnects_total` (by backend).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    truncate_chars, validate_name, ClaimIdle, DeliveredEntry, EntryOrigin, GroupStart,
    HandlerError, PendingEntry, ReadNew, ReceiptOutcome, StoreError, StreamEntryId, StreamKey,
    StreamReceipts, StreamStore, TxWork, ValidationError, MAX_ERROR_CHARS, MAX_STREAM_BATCH,
    MAX_STREAM_BLOCK,
};
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{FuturesOrdered, FuturesUnordered};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::trace_context::stream_entry_span;
use crate::EngineError;

/// Entries read or claimed per call unless configured.
pub const DEFAULT_STREAM_BATCH: usize = 100;
/// How long a read waits for new entries unless configured.
pub const DEFAULT_STREAM_BLOCK: Duration = Duration::from_secs(5);
/// How long an entry must be idle before another consumer claims it.
pub const DEFAULT_MIN_IDLE: Duration = Duration::from_secs(30);
/// How often idle entries are claimed.
pub const DEFAULT_CLAIM_INTERVAL: Duration = Duration::from_secs(10);
/// Deliveries after which a failing entry is dead-lettered.
pub const DEFAULT_MAX_DELIVERIES: u64 = 10;
/// What this process discounts from an entry's delivery count because a
/// take-back failed, or seemed to: the backend may still have applied it.
#[derive(Debug, Clone, Copy, Default)]
struct Discount {
    /// Deliveries subtracted from the backend's count.
    by: u64,
    /// What the entry's latest delivery in this process counted. A delivery
    /// after a take-back counts at least as much (the one taken back does
    /// not count), and a take-back that went through although it seemed to
    /// fail shows as a backend count that did not grow: the discount shrinks
    /// to match, so it is never subtracted twice.
    counted: u64,
}

/// How long a subscription waits for the backend to take back the
/// deliveries of entries it did not handle before it discounts them in
/// memory instead (a failing backend would hold up the settle behind it).
const UNCOUNT_WITHIN: Duration = Duration::from_secs(1);

/// The first pause after a deferral.
pub const DEFAULT_DEFER_MIN: Duration = Duration::from_secs(1);
/// The longest pause after deferrals.
pub const DEFAULT_DEFER_MAX: Duration = Duration::from_secs(60);
/// How long a consumer of the group may be idle, with nothing pending,
/// before it is deleted.
pub const DEFAULT_CONSUMER_IDLE_LIMIT: Duration = Duration::from_secs(3600);
/// Errors kept per pending entry (the newest).
pub const MAX_KEPT_ERRORS: usize = 10;
/// Pending entries whose errors are kept at once; beyond, the oldest go.
const MAX_ENTRIES_WITH_ERRORS: usize = 10_000;
/// Reconnect backoff bounds after a backend outage.
const OUTAGE_MIN: Duration = Duration::from_millis(100);
const OUTAGE_MAX: Duration = Duration::from_secs(30);

/// A stream subscription's settings; [`StreamSubscriptionConfig::new`] gives
/// the defaults and [`StreamSubscriptionConfig::validate`] checks them.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSubscriptionConfig {
    /// The subscription's name: also its consumer group's.
    pub name: String,
    /// The tenant's stream it reads.
    pub key: StreamKey,
    /// This process's consumer in the group (default
    /// `{hostname}-{subscription}`, the same across restarts so that a
    /// restarted process finds its own pending entries).
    pub consumer: String,
    /// Where the group starts when this subscription creates it.
    pub start: GroupStart,
    /// Entries per read or claim (1 to 10,000).
    pub batch: usize,
    /// How long a read waits for new entries (at most 30 s).
    pub block: Duration,
    /// How long an entry must be idle before it is claimed.
    pub min_idle: Duration,
    /// How often idle entries are claimed.
    pub claim_interval: Duration,
    /// Deliveries after which a failing entry is dead-lettered (≥ 1).
    pub max_deliveries: u64,
    /// The first pause after a deferral.
    pub defer_min: Duration,
    /// The longest pause after deferrals.
    pub defer_max: Duration,
    /// Entries handled at once (≥ 1).
    pub concurrency: usize,
    /// How long a handler may run before it is stopped and its delivery
    /// counts as failed (`None`: no limit). The entries a running
    /// subscription holds are kept from other consumers' idle claims while
    /// it works on them, so with no limit a handler that hangs keeps its
    /// batch from everyone for as long as the process lives.
    pub handler_timeout: Option<Duration>,
    /// How long another consumer of the group may be idle, with nothing
    /// pending, before it is deleted.
    pub consumer_idle_limit: Duration,
    /// How long shutdown waits for handlers still running.
    pub shutdown_timeout: Duration,
}

impl StreamSubscriptionConfig {
    /// Subscription `name` on `key` with the default settings.
    pub fn new(name: impl Into<String>, key: StreamKey) -> Result<Self, ValidationError> {
        let name = name.into();
        validate_name("subscription", &name)?;
        let consumer = default_consumer(&name);
        Ok(Self {
            name,
            key,
            consumer,
            start: GroupStart::End,
            batch: DEFAULT_STREAM_BATCH,
            block: DEFAULT_STREAM_BLOCK,
            min_idle: DEFAULT_MIN_IDLE,
            claim_interval: DEFAULT_CLAIM_INTERVAL,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            defer_min: DEFAULT_DEFER_MIN,
            defer_max: DEFAULT_DEFER_MAX,
            concurrency: 1,
            handler_timeout: Some(crate::DEFAULT_HANDLER_TIMEOUT),
            consumer_idle_limit: DEFAULT_CONSUMER_IDLE_LIMIT,
            shutdown_timeout: crate::DEFAULT_SHUTDOWN_TIMEOUT,
        })
    }

    /// Checks every setting; the error names the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name("subscription", &self.name)?;
        validate_name("consumer", &self.consumer)?;
        self.key.dead_letters()?;
        if self.batch == 0 || self.batch > MAX_STREAM_BATCH {
            return Err(ValidationError::new(
                "batch",
                format!(
                    "is {}; it must be between 1 and {MAX_STREAM_BATCH}",
                    self.batch
                ),
            ));
        }
        if self.block > MAX_STREAM_BLOCK {
            return Err(ValidationError::new(
                "block",
                format!("is {:?}; the limit is {MAX_STREAM_BLOCK:?}", self.block),
            ));
        }
        if self.claim_interval.is_zero() {
            return Err(ValidationError::new("claim_interval", "must be above zero"));
        }
        if self.max_deliveries == 0 {
            return Err(ValidationError::new("max_deliveries", "must be at least 1"));
        }
        if self.defer_min.is_zero() || self.defer_min > self.defer_max {
            return Err(ValidationError::new(
                "defer_min",
                "must be above zero and at most defer_max",
            ));
        }
        if self.concurrency == 0 {
            return Err(ValidationError::new("concurrency", "must be at least 1"));
        }
        if self.handler_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ValidationError::new(
                "handler_timeout",
                "must be above zero (None for no limit)",
            ));
        }
        Ok(())
    }

    /// The correlation id of entry `id`: `{subscription}:{stream}:{id}`.
    pub fn correlation_id(&self, id: StreamEntryId) -> String {
        format!("{}:{}:{id}", self.name, self.key.stream())
    }
}

/// `{hostname}-{subscription}`, with characters outside the name grammar
/// replaced by `-` (`worker` when the host name is unknown).
pub fn default_consumer(subscription: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "worker".to_owned());
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let host = host.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let host = if host.is_empty() { "worker" } else { host };
    let mut consumer = format!("{host}-{subscription}");
    consumer.truncate(courier_core::NAME_MAX_LEN);
    consumer
}

/// An entry as a stream handler receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamMessage<T> {
    /// The subscription handling it.
    pub subscription: String,
    /// The stream it was read from.
    pub key: StreamKey,
    /// Its id in the stream.
    pub id: StreamEntryId,
    /// `{subscription}:{stream}:{id}`: the idempotency key of its effect.
    pub correlation_id: String,
    /// The payload, decoded.
    pub payload: T,
    /// The entry's headers.
    pub headers: std::collections::BTreeMap<String, String>,
    /// The outbox message it relays, if any.
    pub origin: Option<EntryOrigin>,
    /// Deliveries so far, this one included (deferrals excluded).
    pub deliveries: u64,
}

/// Handles a stream subscription's entries with effects outside the
/// database; it must be idempotent by [`StreamMessage::correlation_id`],
/// since a crash between the effect and its receipt redelivers.
pub trait StreamHandler: Send + Sync + 'static {
    /// The type payloads decode into (`serde_json::Value` for any).
    type Payload: DeserializeOwned + Send + 'static;

    /// Applies one entry; `Ok` writes its receipt and acks it.
    fn handle(
        &self,
        message: StreamMessage<Self::Payload>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Handles entries inside a transaction of the receipts' database: the
/// writes through `conn` commit with the receipt, or roll back with it, so
/// the effect happens exactly once.
pub trait TransactionalStreamHandler<C>: Send + Sync + 'static {
    /// The type payloads decode into.
    type Payload: DeserializeOwned + Send + Sync + 'static;

    /// Applies one entry through `conn`.
    fn handle(
        &self,
        message: &StreamMessage<Self::Payload>,
        conn: &mut C,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A [`StreamHandler`] made from an async closure.
pub struct FnStreamHandler<T, F> {
    function: F,
    payload: PhantomData<fn() -> T>,
}

/// Wraps `|message: StreamMessage<T>| async { ... }` as a [`StreamHandler`].
pub fn stream_handler_fn<T, F, Fut>(function: F) -> FnStreamHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(StreamMessage<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    FnStreamHandler {
        function,
        payload: PhantomData,
    }
}

impl<T, F, Fut> StreamHandler for FnStreamHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(StreamMessage<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Payload = T;

    fn handle(
        &self,
        message: StreamMessage<T>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (self.function)(message)
    }
}

enum Prepared<C> {
    Plain(BoxFuture<'static, Result<(), HandlerError>>),
    Transactional(TxWork<C>),
}

trait ErasedStreamHandler<C>: Send + Sync {
    fn prepare(
        &self,
        config: &StreamSubscriptionConfig,
        entry: &DeliveredEntry,
        correlation_id: &str,
        deliveries: u64,
    ) -> Result<Prepared<C>, HandlerError>;
}

fn decode<T: DeserializeOwned>(
    config: &StreamSubscriptionConfig,
    entry: &DeliveredEntry,
    correlation_id: &str,
    deliveries: u64,
) -> Result<StreamMessage<T>, HandlerError> {
    let payload = T::deserialize(&entry.entry.payload).map_err(|error| {
        HandlerError::permanent(format!(
            "payload of entry {} does not decode into {}: {error}",
            entry.entry.id,
            std::any::type_name::<T>()
        ))
    })?;
    Ok(StreamMessage {
        subscription: config.name.clone(),
        key: config.key.clone(),
        id: entry.entry.id,
        correlation_id: correlation_id.to_owned(),
        payload,
        headers: entry.entry.headers.clone(),
        origin: entry.entry.origin.clone(),
        deliveries,
    })
}

struct Plain<H>(Arc<H>);

impl<C, H: StreamHandler> ErasedStreamHandler<C> for Plain<H> {
    fn prepare(
        &self,
        config: &StreamSubscriptionConfig,
        entry: &DeliveredEntry,
        correlation_id: &str,
        deliveries: u64,
    ) -> Result<Prepared<C>, HandlerError> {
        let message = decode::<H::Payload>(config, entry, correlation_id, deliveries)?;
        let handler = Arc::clone(&self.0);
        Ok(Prepared::Plain(Box::pin(async move {
            handler.handle(message).await
        })))
    }
}

struct Transactional<H>(Arc<H>);

impl<C: Send + 'static, H: TransactionalStreamHandler<C>> ErasedStreamHandler<C>
    for Transactional<H>
{
    fn prepare(
        &self,
        config: &StreamSubscriptionConfig,
        entry: &DeliveredEntry,
        correlation_id: &str,
        deliveries: u64,
    ) -> Result<Prepared<C>, HandlerError> {
        let message = decode::<H::Payload>(config, entry, correlation_id, deliveries)?;
        let handler = Arc::clone(&self.0);
        Ok(Prepared::Transactional(Box::new(
            move |conn: &mut C| -> BoxFuture<'_, Result<(), HandlerError>> {
                Box::pin(async move { handler.handle(&message, conn).await })
            },
        )))
    }
}

/// What one step of a subscription did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStep {
    /// Entries read (new, own pending or claimed).
    pub read: usize,
    /// Entries acked after their effect (or a receipt found).
    pub acked: usize,
    /// Entries dead-lettered.
    pub dead_lettered: usize,
    /// Entries whose handler failed (left pending).
    pub failed: usize,
    /// Entries deferred (left pending; the subscription pauses).
    pub deferred: usize,
}

/// Batches whose receipts and acks are written at once while the next
/// batch is read and handled.
const SETTLES_IN_FLIGHT: usize = 4;

/// What a handled batch leaves to write.
#[derive(Default)]
struct Settle {
    /// Entries whose plain handler succeeded, with their correlation ids:
    /// receipt, then ack.
    plain_done: Vec<(StreamEntryId, String)>,
    /// Entries to ack (a receipt was found or committed with the effect).
    acks: Vec<StreamEntryId>,
    /// The store error a transactional run met, reported after the acks.
    error: Option<StoreError>,
}

/// A batch read, with the correlation ids that already have a receipt.
struct Looked {
    entries: Vec<DeliveredEntry>,
    correlation: Vec<String>,
    done: HashSet<String>,
}

/// The results of the settles of a pipelined read.
#[derive(Default)]
struct Settled {
    acked: usize,
    error: Option<StoreError>,
}

impl Settled {
    fn add(&mut self, done: Result<usize, StoreError>) {
        match done {
            Ok(n) => self.acked += n,
            Err(error) => {
                self.error.get_or_insert(error);
            }
        }
    }
}

/// What a pipelined read has in flight besides the batch being handled:
/// the next batches' reads, in order, and earlier batches' settles, each on
/// a task of its own so that it progresses while handlers run.
#[derive(Default)]
struct Pipeline {
    reading: FuturesOrdered<Spawned<Looked>>,
    ready: VecDeque<Result<Looked, StoreError>>,
    settling: FuturesUnordered<Spawned<usize>>,
    settled: Settled,
}

/// Work of a subscription on a task of its own: aborted when dropped, and a
/// panic in it resumes in whoever awaits it.
struct Spawned<T>(tokio::task::JoinHandle<Result<T, StoreError>>);

impl<T: Send + 'static> Spawned<T> {
    fn new(work: impl Future<Output = Result<T, StoreError>> + Send + 'static) -> Self {
        Self(tokio::spawn(work))
    }
}

impl<T> Future for Spawned<T> {
    type Output = Result<T, StoreError>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|joined| match joined {
            Ok(result) => result,
            Err(join) => match join.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only a runtime shutting down cancels it.
                Err(cancelled) => Err(StoreError::Database {
                    source: Box::new(cancelled),
                    transient: true,
                }),
            },
        })
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Pipeline {
    /// Whether no batch read ahead is waiting or under way.
    fn reads_done(&self) -> bool {
        self.reading.is_empty() && self.ready.is_empty()
    }

    /// Waits until fewer than `limit` settles are in flight, while the reads
    /// ahead make progress too (every future in flight is polled: one may
    /// hold what another waits for, such as SQLite's write turn).
    async fn settle_below(&mut self, limit: usize) {
        while self.settling.len() >= limit {
            tokio::select! {
                biased;
                Some(done) = self.settling.next() => self.settled.add(done),
                Some(looked) = self.reading.next(), if !self.reading.is_empty() => {
                    self.ready.push_back(looked);
                }
            }
        }
    }

    /// Waits for the oldest read ahead while the settles in flight make
    /// progress.
    async fn finish_one_read(&mut self) {
        let before = self.ready.len();
        while self.ready.len() == before && !self.reading.is_empty() {
            tokio::select! {
                biased;
                Some(looked) = self.reading.next() => self.ready.push_back(looked),
                Some(done) = self.settling.next(), if !self.settling.is_empty() => {
                    self.settled.add(done);
                }
            }
        }
    }

    /// Runs `work` while the reads ahead and the settles in flight make
    /// progress.
    async fn drive<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                Some(looked) = self.reading.next(), if !self.reading.is_empty() => {
                    self.ready.push_back(looked);
                }
                Some(done) = self.settling.next(), if !self.settling.is_empty() => {
                    self.settled.add(done);
                }
            }
        }
    }
}

enum Outcome {
    Done,
    Failed(String),
    Deferred(Duration),
    Dead(String),
    /// Not run: shutdown began, or an earlier entry of its batch deferred.
    NotRun,
}

/// A stream subscription: one handler over one tenant's stream, through the
/// consumer group named after it. Build it with [`StreamSubscription::new`]
/// or [`StreamSubscription::transactional`], then [`start`](Self::start) it
/// (or drive it with [`step`](Self::step) in tests).
pub struct StreamSubscription<S, R: StreamReceipts> {
    inner: Arc<Inner<S, R>>,
}

struct Inner<S, R: StreamReceipts> {
    streams: S,
    receipts: R,
    config: StreamSubscriptionConfig,
    handler: Arc<dyn ErasedStreamHandler<R::Connection>>,
    transactional: bool,
    /// Errors of entries still pending, newest last.
    errors: Mutex<HashMap<StreamEntryId, Vec<String>>>,
    /// Per entry still pending whose take-back failed
    /// ([`StreamStore::uncount_deliveries`]): what this process discounts.
    discounted: Mutex<HashMap<StreamEntryId, Discount>>,
    /// Consecutive batches with a deferral (the backoff grows with them)
    /// and the longest delay a handler asked for in them.
    defer_streak: Mutex<(u32, Duration)>,
    /// Cancelled when the started subscription is asked to stop: no
    /// further entry starts.
    stop: CancellationToken,
    /// Entries handed to this consumer whose outcome or ack is still to
    /// come: a started subscription touches them every third of `min_idle`
    /// so no other consumer claims them as idle meanwhile.
    held: Mutex<BTreeSet<StreamEntryId>>,
}

impl<S: StreamStore, R: StreamReceipts> StreamSubscription<S, R> {
    /// A subscription running `handler` (effects outside the database).
    pub fn new(
        streams: S,
        receipts: R,
        config: StreamSubscriptionConfig,
        handler: impl StreamHandler,
    ) -> Result<Self, EngineError> {
        Self::build(
            streams,
            receipts,
            config,
            Arc::new(Plain(Arc::new(handler))),
            false,
        )
    }

    /// A subscription running `handler` inside the receipt's transaction.
    pub fn transactional(
        streams: S,
        receipts: R,
        config: StreamSubscriptionConfig,
        handler: impl TransactionalStreamHandler<R::Connection>,
    ) -> Result<Self, EngineError>
    where
        R::Connection: 'static,
    {
        Self::build(
            streams,
            receipts,
            config,
            Arc::new(Transactional(Arc::new(handler))),
            true,
        )
    }

    fn build(
        streams: S,
        receipts: R,
        config: StreamSubscriptionConfig,
        handler: Arc<dyn ErasedStreamHandler<R::Connection>>,
        transactional: bool,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                streams,
                receipts,
                config,
                handler,
                transactional,
                errors: Mutex::new(HashMap::new()),
                discounted: Mutex::new(HashMap::new()),
                defer_streak: Mutex::new((0, Duration::ZERO)),
                stop: CancellationToken::new(),
                held: Mutex::new(BTreeSet::new()),
            }),
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &StreamSubscriptionConfig {
        &self.inner.config
    }

    /// Creates the subscription's group if it does not exist; returns
    /// whether it did.
    pub async fn ensure_group(&self) -> Result<bool, StoreError> {
        let c = &self.inner.config;
        self.inner
            .streams
            .ensure_group(&c.key, &c.name, c.start)
            .await
    }

    /// One pass without blocking, for tests and tools: the group is
    /// ensured, own pending entries are re-read, idle entries claimed (from
    /// the start), and one batch of new entries read; all are handled (but
    /// the entries of a batch after one deferred, which stay pending).
    pub async fn step(&self) -> Result<StreamStep, StoreError> {
        self.ensure_group().await?;
        let mut step = StreamStep::default();
        self.inner.drain_own_pending(&mut step).await?;
        let mut cursor = StreamEntryId::ZERO;
        loop {
            let (next, _) = self.inner.claim_once(cursor, &mut step).await?;
            if next == StreamEntryId::ZERO {
                break;
            }
            cursor = next;
        }
        let entries = self.inner.read_new(None).await?;
        self.inner.handle_batch(entries, &mut step).await?;
        Ok(step)
    }

    /// Starts the subscription on its own task.
    pub fn start(self) -> StreamSubscriptionHandle {
        let stop = self.inner.stop.clone();
        let task = tokio::spawn(Arc::clone(&self.inner).run(stop.clone()));
        StreamSubscriptionHandle {
            stop,
            task,
            shutdown_timeout: self.inner.config.shutdown_timeout,
        }
    }
}

/// A running stream subscription.
pub struct StreamSubscriptionHandle {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    shutdown_timeout: Duration,
}

impl StreamSubscriptionHandle {
    /// Stops reading; handlers in flight finish until the shutdown timeout
    /// (the rest stay pending, to be claimed later). Returns when stopped.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(self.shutdown_timeout, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!(
                "stream subscription shutdown deadline passed; unfinished entries stay pending"
            );
            self.task.abort();
            let _ = self.task.await;
        }
    }

    /// Whether the subscription's task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<S: StreamStore, R: StreamReceipts> Inner<S, R> {
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let c = &self.config;
        let subscription = c.name.as_str();
        // Stopped (aborted) when the subscription's task ends. Below
        // MIN_TOUCHED_IDLE touches would come too often to be worth it.
        let _touching = (c.min_idle >= MIN_TOUCHED_IDLE)
            .then(|| AbortTask(tokio::spawn(Arc::clone(&self).touch_held())));
        let mut own_pending = true;
        let mut next_claim = tokio::time::Instant::now();
        let mut claim_cursor = StreamEntryId::ZERO;
        let mut outage: Option<Duration> = None;
        let mut group_ready = false;
        let mut resume_at: Option<tokio::time::Instant> = None;
        tracing::info!(subscription, stream = %c.key, consumer = c.consumer, "stream subscription started");
        while !stop.is_cancelled() {
            let result: Result<(), StoreError> = async {
                if !group_ready {
                    if self.streams.ensure_group(&c.key, &c.name, c.start).await?
                        && outage.is_some()
                    {
                        metrics::counter!(GROUPS_RECREATED, "subscription" => c.name.clone())
                            .increment(1);
                    }
                    group_ready = true;
                }
                if let Some(until) = resume_at.take() {
                    // Deferred: no reads, no claims until the pause ends.
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep_until(until) => {}
                    }
                    // The deferred entries are this consumer's own pending
                    // ones: take them up again first, not after min_idle.
                    own_pending = true;
                }
                let mut step = StreamStep::default();
                let deferred = |step: &StreamStep| {
                    (step.deferred > 0).then(|| tokio::time::Instant::now() + self.deferred_pause())
                };
                if own_pending {
                    self.drain_own_pending(&mut step).await?;
                    own_pending = false;
                    resume_at = deferred(&step);
                    if resume_at.is_some() {
                        return Ok(());
                    }
                }
                if stop.is_cancelled() {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= next_claim {
                    let (next, _) = self.claim_once(claim_cursor, &mut step).await?;
                    claim_cursor = next;
                    if next == StreamEntryId::ZERO {
                        next_claim = tokio::time::Instant::now() + c.claim_interval;
                        self.delete_idle_consumers().await?;
                        let pending = self.streams.pending_summary(&c.key, &c.name).await?;
                        metrics::gauge!(PENDING, "subscription" => c.name.clone())
                            .set(pending.count as f64);
                        if let Some(lag) = self.streams.lag(&c.key, &c.name).await? {
                            metrics::gauge!(LAG, "subscription" => c.name.clone()).set(lag as f64);
                        }
                        if let Some(wait) = self.streams.visibility_wait(&c.key).await? {
                            metrics::gauge!(VISIBILITY_WAIT, "subscription" => c.name.clone())
                                .set(wait.as_secs_f64());
                        }
                    }
                    resume_at = deferred(&step);
                    if resume_at.is_some() {
                        return Ok(());
                    }
                }
                let read = self.read_new_pipelined(&stop, next_claim, &mut step).await;
                resume_at = deferred(&step);
                read
            }
            .await;
            match result {
                Ok(()) => {
                    if outage.take().is_some() {
                        tracing::info!(subscription, "stream backend reachable again");
                    }
                }
                Err(StoreError::NotFound { what }) => {
                    // The group vanished (a restarted server without
                    // persistence, an operator): recreate it at its start.
                    tracing::warn!(subscription, what, "consumer group lost; recreating it");
                    metrics::counter!(GROUPS_RECREATED, "subscription" => c.name.clone())
                        .increment(1);
                    group_ready = false;
                    own_pending = true;
                    // The recreated group holds none of them, and counts
                    // its deliveries afresh.
                    lock(&self.held).clear();
                    lock(&self.discounted).clear();
                    // Not at once: a group that keeps vanishing must not spin.
                    let pause = OUTAGE_MIN.mul_f64(0.5 + fastrand::f64() / 2.0);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                Err(error) => {
                    let backoff = match outage {
                        None => {
                            tracing::warn!(subscription, %error, "stream backend unavailable; retrying with backoff");
                            metrics::counter!(RECONNECTS, "backend" => self.streams.backend())
                                .increment(1);
                            OUTAGE_MIN
                        }
                        Some(previous) => (previous * 2).min(OUTAGE_MAX),
                    };
                    outage = Some(backoff);
                    // Whatever it held is re-read with its own pending
                    // entries after the outage (and held again then).
                    lock(&self.held).clear();
                    own_pending = true;
                    group_ready = false;
                    let jittered = backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(jittered) => {}
                    }
                }
            }
        }
        tracing::info!(subscription, "stream subscription stopped");
    }

    fn deferred_pause(&self) -> Duration {
        let (streak, asked) = *lock(&self.defer_streak);
        if streak == 0 {
            return Duration::ZERO;
        }
        let c = &self.config;
        let exponent = streak.saturating_sub(1).min(16);
        let base = c
            .defer_min
            .saturating_mul(1_u32 << exponent)
            .max(asked)
            .min(c.defer_max);
        // Full jitter over the upper half: consumers do not retry in step.
        base.mul_f64(0.5 + fastrand::f64() / 2.0)
    }

    async fn read_new(&self, block: Option<Duration>) -> Result<Vec<DeliveredEntry>, StoreError> {
        let c = &self.config;
        let read = ReadNew {
            group: c.name.clone(),
            consumer: c.consumer.clone(),
            count: c.batch,
            block: block.filter(|b| !b.is_zero()),
        };
        let entries = self.streams.read_new(&c.key, &read).await?;
        self.hold(&entries);
        Ok(entries)
    }

    /// Entries this consumer now works on: touched until released.
    fn hold(&self, entries: &[DeliveredEntry]) {
        lock(&self.held).extend(entries.iter().map(|e| e.entry.id));
    }

    /// Entries this consumer no longer works on (acked, dead-lettered, or
    /// left pending to go idle: failed, deferred, not run).
    fn release(&self, ids: impl IntoIterator<Item = StreamEntryId>) {
        let mut held = lock(&self.held);
        for id in ids {
            held.remove(&id);
        }
    }

    /// Entries delivered but not handled (deferred, not run, read ahead and
    /// dropped): their delivery is taken back in the backend
    /// ([`StreamStore::uncount_deliveries`]), so it counts against
    /// `max_deliveries` nowhere, whichever consumer takes the entry next;
    /// then they are left to go idle. Where the backend cannot be reached,
    /// this process remembers the deliveries instead (lost on a restart),
    /// and waits for it at most [`UNCOUNT_WITHIN`]. A take-back that failed
    /// but went through (its reply lost) is noticed, and discounted once,
    /// when the entry's next delivery is this consumer's (see [`Discount`]);
    /// if another consumer delivered it in between, the backend's count
    /// cannot tell the two apart and the entry may run once more than
    /// `max_deliveries` allows. `entries` are the ids with the delivery
    /// counts the backend gave them.
    async fn left_unhandled(&self, entries: Vec<(StreamEntryId, u64)>) {
        if entries.is_empty() {
            return;
        }
        let c = &self.config;
        for chunk in entries.chunks(courier_core::MAX_STREAM_BATCH) {
            let ids: Vec<StreamEntryId> = chunk.iter().map(|(id, _)| *id).collect();
            let taken_back = tokio::time::timeout(
                UNCOUNT_WITHIN,
                self.streams
                    .uncount_deliveries(&c.key, &c.name, &c.consumer, &ids),
            )
            .await;
            let error = match taken_back {
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {UNCOUNT_WITHIN:?}"),
            };
            tracing::debug!(subscription = c.name, %error, "taking back deliveries not handled failed; this process discounts them");
            self.discount(chunk);
        }
        self.release(entries.into_iter().map(|(id, _)| id));
    }

    /// Entries delivered but not handled whose delivery the backend did not
    /// take back: it does not count in this process (it does after a
    /// restart or a claim by another consumer); they are left to go idle.
    fn discount(&self, entries: &[(StreamEntryId, u64)]) {
        let mut discounted = lock(&self.discounted);
        for &(id, deliveries) in entries {
            discount_with(&mut discounted, id, deliveries);
        }
    }

    /// Every third of `min_idle`, restarts the idle time of the entries this
    /// consumer holds, so another consumer's claim passes them by while they
    /// run, wait their turn in a batch or wait for their ack. A failed touch
    /// is logged and tried again at the next tick.
    async fn touch_held(self: Arc<Self>) {
        let c = &self.config;
        let every = c.min_idle / 3;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let ids: Vec<StreamEntryId> = lock(&self.held).iter().copied().collect();
            for chunk in ids.chunks(courier_core::MAX_STREAM_BATCH) {
                match self
                    .streams
                    .touch(&c.key, &c.name, &c.consumer, chunk)
                    .await
                {
                    Ok(_) => failing = false,
                    // Once per run of failures: entries held meanwhile may
                    // be claimed by another consumer once idle.
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(subscription = c.name, %error, "touching held entries failed; other consumers may claim them once idle");
                    }
                    Err(error) => {
                        tracing::debug!(subscription = c.name, %error, "touching held entries failed");
                    }
                }
            }
        }
    }

    async fn drain_own_pending(&self, step: &mut StreamStep) -> Result<(), StoreError> {
        let c = &self.config;
        let mut after = StreamEntryId::ZERO;
        loop {
            let page = self
                .streams
                .read_pending(&c.key, &c.name, &c.consumer, after, c.batch)
                .await?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = last.id();
            let full = page.len() >= c.batch;
            let mut entries = Vec::with_capacity(page.len());
            let mut trimmed = Vec::new();
            for entry in page {
                match entry {
                    PendingEntry::Present(delivered) => entries.push(delivered),
                    PendingEntry::Deleted(id) => trimmed.push(id),
                }
            }
            self.hold(&entries);
            if !trimmed.is_empty() {
                // Nothing to handle any more: the entry is gone.
                self.streams.ack(&c.key, &c.name, &trimmed).await?;
                self.forget(&trimmed);
            }
            self.handle_batch(entries, step).await?;
            // A deferral pauses reads, these too; a short page was the last;
            // and once stopping, no more are read (each read counts).
            if !full || step.deferred > 0 || self.stop.is_cancelled() {
                return Ok(());
            }
        }
    }

    async fn claim_once(
        &self,
        cursor: StreamEntryId,
        step: &mut StreamStep,
    ) -> Result<(StreamEntryId, usize), StoreError> {
        let c = &self.config;
        let claim = ClaimIdle {
            group: c.name.clone(),
            consumer: c.consumer.clone(),
            min_idle: c.min_idle,
            cursor,
            count: c.batch,
        };
        let claimed = self.streams.claim_idle(&c.key, &claim).await?;
        self.forget(&claimed.deleted);
        self.hold(&claimed.entries);
        let n = claimed.entries.len();
        if n > 0 {
            metrics::counter!(CLAIMED, "subscription" => c.name.clone()).increment(n as u64);
        }
        self.handle_batch(claimed.entries, step).await?;
        Ok((claimed.next, n))
    }

    async fn delete_idle_consumers(&self) -> Result<(), StoreError> {
        let c = &self.config;
        for consumer in self.streams.consumers(&c.key, &c.name).await? {
            if consumer.name != c.consumer
                && consumer.pending == 0
                && consumer.idle >= c.consumer_idle_limit
            {
                self.streams
                    .delete_consumer(&c.key, &c.name, &consumer.name)
                    .await?;
                tracing::info!(
                    subscription = c.name,
                    consumer = consumer.name,
                    "deleted an idle consumer"
                );
            }
        }
        Ok(())
    }

    fn forget(&self, ids: &[StreamEntryId]) {
        self.release(ids.iter().copied());
        let mut errors = lock(&self.errors);
        let mut discounted = lock(&self.discounted);
        for id in ids {
            errors.remove(id);
            discounted.remove(id);
        }
    }

    /// Deliveries that count: the backend's (deliveries taken back left
    /// out), less those this process discounted when the take-back failed.
    fn counted_deliveries(&self, entry: &DeliveredEntry) -> u64 {
        counted_with(
            &mut lock(&self.discounted),
            entry.entry.id,
            entry.deliveries,
        )
    }

    async fn handle_batch(
        &self,
        entries: Vec<DeliveredEntry>,
        step: &mut StreamStep,
    ) -> Result<(), StoreError> {
        let settle = self.run_batch(entries, step).await?;
        step.acked += self.settle(settle).await?;
        Ok(())
    }

    /// Reads new entries until nothing new arrives within the block, a claim
    /// is due, a deferral pauses the subscription or it is stopped, as a
    /// pipeline: while one batch's handlers run, the next batches (as many
    /// as the store's [`StreamStore::reads_ahead`]) are read and their
    /// receipts looked up (when the batch was full: a backlog), and the
    /// receipts and acks of up to [`SETTLES_IN_FLIGHT`] earlier batches are
    /// written. Everything handled is settled before this returns, so
    /// own-pending reads and claims never see an entry still being settled;
    /// a batch read ahead but not handled (a deferral, a stop) stays pending
    /// to this consumer, and its delivery is not counted.
    async fn read_new_pipelined(
        self: &Arc<Self>,
        stop: &CancellationToken,
        next_claim: tokio::time::Instant,
        step: &mut StreamStep,
    ) -> Result<(), StoreError> {
        let c = &self.config;
        let reads_ahead = self.streams.reads_ahead().max(1);
        let mut pipe = Pipeline::default();
        let result: Result<(), StoreError> = async {
            loop {
                let looked = if let Some(looked) = pipe.ready.pop_front() {
                    looked?
                } else if !pipe.reading.is_empty() {
                    pipe.finish_one_read().await;
                    continue;
                } else {
                    let until_claim =
                        next_claim.saturating_duration_since(tokio::time::Instant::now());
                    let block = c.block.min(until_claim);
                    let read = async {
                        tokio::select! {
                            () = stop.cancelled() => Ok(None),
                            looked = self.read_and_look_up(Some(block)) => looked.map(Some),
                        }
                    };
                    match pipe.drive(read).await? {
                        Some(looked) => looked,
                        None => return Ok(()),
                    }
                };
                if looked.entries.is_empty() {
                    if pipe.reads_done() {
                        return Ok(());
                    }
                    continue;
                }
                // A full batch: more are likely waiting; read them (without
                // blocking) while this one is handled.
                if looked.entries.len() >= c.batch
                    && !stop.is_cancelled()
                    && tokio::time::Instant::now() < next_claim
                {
                    while pipe.reading.len() + pipe.ready.len() < reads_ahead {
                        let this = Arc::clone(self);
                        pipe.reading.push_back(Spawned::new(async move {
                            this.read_and_look_up(None).await
                        }));
                    }
                }
                let settle = pipe.drive(self.run_looked(looked, step)).await?;
                let this = Arc::clone(self);
                pipe.settling
                    .push(Spawned::new(async move { this.settle(settle).await }));
                pipe.settle_below(SETTLES_IN_FLIGHT).await;
                if let Some(error) = pipe.settled.error.take() {
                    return Err(error);
                }
                if step.deferred > 0 || stop.is_cancelled() {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= next_claim && pipe.reads_done() {
                    return Ok(());
                }
            }
        }
        .await;
        if result.is_ok() && !stop.is_cancelled() {
            // A deferral: the reads ahead (which do not block) are finished,
            // so that what they took is known.
            while !pipe.reading.is_empty() {
                pipe.finish_one_read().await;
            }
        }
        // Otherwise a read under way is dropped: whatever it took stays
        // pending to this consumer, re-read with its own pending entries on
        // the next start or after the outage.
        pipe.reading = FuturesOrdered::new();
        // Read, never handled: like a deferral, this delivery does not
        // count against max_deliveries.
        let unhandled: Vec<(StreamEntryId, u64)> = pipe
            .ready
            .drain(..)
            .flatten()
            .flat_map(|looked| {
                looked
                    .entries
                    .iter()
                    .map(|e| (e.entry.id, e.deliveries))
                    .collect::<Vec<_>>()
            })
            .collect();
        self.left_unhandled(unhandled).await;
        // Whatever happened, the batches already handled get their receipts
        // and acks (a batch left unsettled would be handled again).
        while let Some(done) = pipe.settling.next().await {
            pipe.settled.add(done);
        }
        step.acked += pipe.settled.acked;
        match (result, pipe.settled.error) {
            (Err(error), _) | (Ok(()), Some(error)) => Err(error),
            (Ok(()), None) => Ok(()),
        }
    }

    /// Reads new entries and looks up which of them have a receipt.
    async fn read_and_look_up(&self, block: Option<Duration>) -> Result<Looked, StoreError> {
        let entries = self.read_new(block).await?;
        self.look_up(entries).await
    }

    /// Which of `entries` already have a receipt.
    async fn look_up(&self, entries: Vec<DeliveredEntry>) -> Result<Looked, StoreError> {
        let c = &self.config;
        let correlation: Vec<String> = entries
            .iter()
            .map(|e| c.correlation_id(e.entry.id))
            .collect();
        let done: HashSet<String> = if entries.is_empty() {
            HashSet::new()
        } else {
            self.receipts
                .find_stream_receipts(&c.name, &correlation)
                .await?
                .into_iter()
                .collect()
        };
        Ok(Looked {
            entries,
            correlation,
            done,
        })
    }

    /// Looks up the batch's receipts and runs the handlers of the entries
    /// without one; returns what is left to write.
    async fn run_batch(
        &self,
        entries: Vec<DeliveredEntry>,
        step: &mut StreamStep,
    ) -> Result<Settle, StoreError> {
        let looked = self.look_up(entries).await?;
        self.run_looked(looked, step).await
    }

    /// Runs the handlers of the entries without a receipt; returns what is
    /// left to write.
    async fn run_looked(
        &self,
        looked: Looked,
        step: &mut StreamStep,
    ) -> Result<Settle, StoreError> {
        let mut settle = Settle::default();
        let Looked {
            entries,
            correlation,
            done,
        } = looked;
        if entries.is_empty() {
            return Ok(settle);
        }
        let c = &self.config;
        step.read += entries.len();
        metrics::counter!(READ, "subscription" => c.name.clone()).increment(entries.len() as u64);

        let mut to_run = Vec::new();
        for (entry, correlation_id) in entries.into_iter().zip(correlation) {
            if done.contains(&correlation_id) {
                settle.acks.push(entry.entry.id);
                continue;
            }
            let deliveries = self.counted_deliveries(&entry);
            if deliveries > c.max_deliveries {
                // Its handler crashed or timed out on the last allowed
                // delivery without reporting: do not run it again.
                let reason = format!(
                    "delivered {deliveries} times, more than max_deliveries {}",
                    c.max_deliveries
                );
                // Left pending if this fails; its batch-mates still settle.
                if let Err(error) = self.dead_letter(&entry, reason, step).await {
                    settle.error.get_or_insert(error);
                }
                continue;
            }
            to_run.push((entry, correlation_id, deliveries));
        }

        // After a deferral (the handler's quota is spent) the rest of the
        // batch would only defer too; after shutdown began nothing starts.
        // Either way what has not started stays pending.
        let halted = std::sync::atomic::AtomicBool::new(false);
        let outcomes: Vec<(DeliveredEntry, String, Result<Outcome, StoreError>)> =
            futures_util::stream::iter(to_run)
                .map(|(entry, correlation_id, deliveries)| {
                    let halted = &halted;
                    async move {
                        if halted.load(std::sync::atomic::Ordering::SeqCst)
                            || self.stop.is_cancelled()
                        {
                            return (entry, correlation_id, Ok(Outcome::NotRun));
                        }
                        let outcome = self.run_one(&entry, &correlation_id, deliveries).await;
                        if matches!(outcome, Ok(Outcome::Deferred(_))) {
                            halted.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        (entry, correlation_id, outcome)
                    }
                })
                .buffer_unordered(c.concurrency)
                .collect()
                .await;
        let mut batch_deferred: Option<Duration> = None;
        let mut unhandled = Vec::new();

        for (entry, correlation_id, outcome) in outcomes {
            match outcome {
                Ok(Outcome::Done) => {
                    if self.transactional {
                        settle.acks.push(entry.entry.id);
                    } else {
                        settle.plain_done.push((entry.entry.id, correlation_id));
                    }
                }
                Ok(Outcome::Failed(error)) => {
                    step.failed += 1;
                    self.keep_error(entry.entry.id, error);
                    // Left to go idle and be claimed again.
                    self.release([entry.entry.id]);
                }
                Ok(Outcome::Deferred(asked)) => {
                    step.deferred += 1;
                    unhandled.push((entry.entry.id, entry.deliveries));
                    batch_deferred = Some(batch_deferred.unwrap_or_default().max(asked));
                    metrics::counter!(DEFERRED, "subscription" => c.name.clone()).increment(1);
                }
                // Read but not run: like a deferral, this delivery does not
                // count against max_deliveries.
                Ok(Outcome::NotRun) => unhandled.push((entry.entry.id, entry.deliveries)),
                Ok(Outcome::Dead(reason)) => {
                    if let Err(error) = self.dead_letter(&entry, reason, step).await {
                        settle.error.get_or_insert(error);
                    }
                }
                Err(error) => {
                    settle.error.get_or_insert(error);
                }
            }
        }
        self.left_unhandled(unhandled).await;
        // One step of the backoff per batch, however many of it deferred.
        if let Some(asked) = batch_deferred {
            let mut streak = lock(&self.defer_streak);
            streak.0 = streak.0.saturating_add(1);
            streak.1 = streak.1.max(asked);
        } else if !settle.plain_done.is_empty() || !settle.acks.is_empty() {
            *lock(&self.defer_streak) = (0, Duration::ZERO);
        }
        Ok(settle)
    }

    /// Writes the receipts of plain handlers' successes, then acks them and
    /// the entries already settled; returns how many were acked, or the
    /// store error a transactional run met.
    async fn settle(&self, settle: Settle) -> Result<usize, StoreError> {
        let c = &self.config;
        let Settle {
            plain_done,
            mut acks,
            error,
        } = settle;
        if !plain_done.is_empty() {
            let (ids, correlation): (Vec<StreamEntryId>, Vec<String>) =
                plain_done.into_iter().unzip();
            // Looked up before their handlers ran and none found.
            self.receipts
                .record_new_stream_receipts(&c.name, &correlation)
                .await?;
            acks.extend(ids);
        }
        if !acks.is_empty() {
            let acked = self.streams.ack(&c.key, &c.name, &acks).await?;
            metrics::counter!(ACKED, "subscription" => c.name.clone()).increment(acked);
            self.forget(&acks);
        }
        match error {
            Some(error) => Err(error),
            None => Ok(acks.len()),
        }
    }

    fn keep_error(&self, id: StreamEntryId, error: String) {
        let mut errors = lock(&self.errors);
        if errors.len() >= MAX_ENTRIES_WITH_ERRORS && !errors.contains_key(&id) {
            if let Some(oldest) = errors.keys().min().copied() {
                errors.remove(&oldest);
            }
        }
        let kept = errors.entry(id).or_default();
        kept.push(truncate_chars(&error, MAX_ERROR_CHARS).to_owned());
        if kept.len() > MAX_KEPT_ERRORS {
            let excess = kept.len() - MAX_KEPT_ERRORS;
            kept.drain(..excess);
        }
    }

    async fn dead_letter(
        &self,
        entry: &DeliveredEntry,
        reason: String,
        step: &mut StreamStep,
    ) -> Result<(), StoreError> {
        let c = &self.config;
        self.keep_error(entry.entry.id, reason);
        let errors = lock(&self.errors)
            .get(&entry.entry.id)
            .cloned()
            .unwrap_or_default();
        if self
            .streams
            .dead_letter(&c.key, &c.name, entry, &errors)
            .await?
        {
            step.dead_lettered += 1;
            metrics::counter!(DEAD_LETTERED, "subscription" => c.name.clone()).increment(1);
            tracing::warn!(subscription = c.name, entry = %entry.entry.id, "entry dead-lettered");
        }
        self.forget(&[entry.entry.id]);
        Ok(())
    }

    /// Runs the handler for one entry: its outcome, or the store error that
    /// kept a transactional run from finishing.
    async fn run_one(
        &self,
        entry: &DeliveredEntry,
        correlation_id: &str,
        deliveries: u64,
    ) -> Result<Outcome, StoreError> {
        let c = &self.config;
        let started = std::time::Instant::now();
        // The handler runs in this span (continuing the appender's trace);
        // a spawned task does not inherit it, so it is handed over.
        let span = stream_entry_span(&c.name, &c.key, entry, deliveries);
        // A panic (a payload type's `Deserialize`, the handler's own code)
        // fails this delivery like an error; it never unwinds through the
        // subscription.
        let prepared = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            span.in_scope(|| self.handler.prepare(c, entry, correlation_id, deliveries))
        })) {
            Ok(Ok(prepared)) => prepared,
            Ok(Err(error)) => return Ok(self.classify(error, deliveries)),
            Err(panic) => {
                let error = HandlerError::retry(panic_text(panic.as_ref()));
                return Ok(self.classify(error, deliveries));
            }
        };
        let result = match prepared {
            Prepared::Plain(future) => {
                // Aborted if this run is dropped (shutdown past its deadline):
                // no effect may happen after its entry was left pending.
                let mut task = AbortOnDrop(tokio::spawn(
                    with_timeout(future, c.handler_timeout).instrument(span),
                ));
                match (&mut task.0).await {
                    Ok(result) => result,
                    Err(join) => Err(HandlerError::retry(panic_message(join))),
                }
            }
            Prepared::Transactional(work) => {
                let timeout = c.handler_timeout;
                let work: TxWork<R::Connection> =
                    Box::new(move |conn| Box::pin(with_timeout(work(conn), timeout)));
                // The transaction is dropped by the unwind, so rolled back.
                match AssertUnwindSafe(
                    self.receipts
                        .run_with_stream_receipt(&c.name, correlation_id, work)
                        .instrument(span),
                )
                .catch_unwind()
                .await
                {
                    Ok(outcome) => match outcome? {
                        ReceiptOutcome::Applied | ReceiptOutcome::AlreadyApplied => Ok(()),
                        ReceiptOutcome::Failed(error) => Err(error),
                    },
                    Err(panic) => Err(HandlerError::retry(panic_text(panic.as_ref()))),
                }
            }
        };
        metrics::histogram!(HANDLER_SECONDS, "subscription" => c.name.clone())
            .record(started.elapsed().as_secs_f64());
        Ok(match result {
            Ok(()) => Outcome::Done,
            Err(error) => self.classify(error, deliveries),
        })
    }

    fn classify(&self, error: HandlerError, deliveries: u64) -> Outcome {
        match error {
            HandlerError::Snooze { delay, .. } => Outcome::Deferred(delay),
            HandlerError::Permanent(_) => Outcome::Dead(error.to_string()),
            other if deliveries >= self.config.max_deliveries => Outcome::Dead(format!(
                "{other} (delivery {deliveries} of max_deliveries {})",
                self.config.max_deliveries
            )),
            other => Outcome::Failed(other.to_string()),
        }
    }
}

async fn with_timeout<F>(future: F, timeout: Option<Duration>) -> Result<(), HandlerError>
where
    F: Future<Output = Result<(), HandlerError>>,
{
    match timeout {
        None => future.await,
        Some(limit) => match tokio::time::timeout(limit, future).await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::retry(format!(
                "timeout after {} ms",
                limit.as_millis()
            ))),
        },
    }
}

fn panic_message(join: tokio::task::JoinError) -> String {
    match join.try_into_panic() {
        Ok(payload) => panic_text(payload.as_ref()),
        Err(_) => "handler task was cancelled".to_owned(),
    }
}

/// What a handler's panic is reported as.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_owned());
    format!("handler panicked: {text}")
}

/// A spawned task that is aborted when this is dropped.
struct AbortTask(tokio::task::JoinHandle<()>);

impl Drop for AbortTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A spawned handler that is aborted when its run is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), HandlerError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a delivery of entry `id` with the backend's count `deliveries`
/// counts here, after what `discounted` holds for it (at least 1); brings
/// that record up to this delivery. The same delivery asked again counts the
/// same.
fn counted_with(
    discounted: &mut HashMap<StreamEntryId, Discount>,
    id: StreamEntryId,
    deliveries: u64,
) -> u64 {
    let Some(discount) = discounted.get_mut(&id) else {
        return deliveries.max(1);
    };
    let counted = deliveries
        .saturating_sub(discount.by)
        .max(discount.counted)
        .max(1);
    discount.by = deliveries.saturating_sub(counted);
    discount.counted = counted;
    counted
}

/// Records in `discounted` that the delivery of entry `id` with the
/// backend's count `deliveries` was not handled and its take-back failed:
/// the entry's next delivery here counts what this one did.
fn discount_with(
    discounted: &mut HashMap<StreamEntryId, Discount>,
    id: StreamEntryId,
    deliveries: u64,
) {
    let counted = counted_with(discounted, id, deliveries);
    let discount = discounted.entry(id).or_default();
    discount.by = deliveries.saturating_sub(counted) + 1;
    discount.counted = counted;
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The shortest `min_idle` whose held entries are touched (every third of
/// it): below it, touches would come more than every 10 ms.
const MIN_TOUCHED_IDLE: Duration = Duration::from_millis(30);

const READ: &str = "courier_stream_read_total";
const CLAIMED: &str = "courier_stream_claimed_total";
const ACKED: &str = "courier_stream_acked_total";
const DEAD_LETTERED: &str = "courier_stream_dead_lettered_total";
const DEFERRED: &str = "courier_stream_deferred_total";
const HANDLER_SECONDS: &str = "courier_stream_handler_duration_seconds";
const RECONNECTS: &str = "courier_backend_reconnects_total";
const PENDING: &str = "courier_stream_pending";
const LAG: &str = "courier_stream_lag";
const VISIBILITY_WAIT: &str = "courier_stream_visibility_wait_seconds";
const GROUPS_RECREATED: &str = "courier_stream_groups_recreated_total";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_take_back_is_discounted_once_whether_or_not_it_went_through() {
        let id = StreamEntryId::new(5, 0);
        // Not applied: the backend's count goes on from 1.
        let mut lost = HashMap::new();
        assert_eq!(counted_with(&mut lost, id, 1), 1);
        discount_with(&mut lost, id, 1);
        assert_eq!(
            counted_with(&mut lost, id, 2),
            1,
            "the deferral not counted"
        );
        assert_eq!(counted_with(&mut lost, id, 2), 1, "asked again, the same");
        assert_eq!(counted_with(&mut lost, id, 3), 2);
        assert_eq!(counted_with(&mut lost, id, 4), 3);

        // Applied although it seemed to fail: the backend's count fell to 0.
        let mut applied = HashMap::new();
        discount_with(&mut applied, id, 1);
        assert_eq!(counted_with(&mut applied, id, 1), 1, "not discounted twice");
        assert_eq!(counted_with(&mut applied, id, 2), 2);
        assert_eq!(counted_with(&mut applied, id, 3), 3);

        // Two failed take-backs in a row, neither applied.
        let mut twice = HashMap::new();
        discount_with(&mut twice, id, 1);
        discount_with(&mut twice, id, 2);
        assert_eq!(counted_with(&mut twice, id, 3), 1);
        assert_eq!(counted_with(&mut twice, id, 4), 2);

        // No failed take-back: the backend's count, at least 1.
        let mut none = HashMap::new();
        assert_eq!(counted_with(&mut none, id, 0), 1);
        assert_eq!(counted_with(&mut none, id, 7), 7);
        assert!(none.is_empty());
    }
}
