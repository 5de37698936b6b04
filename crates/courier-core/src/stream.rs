//! Streams and consumer groups: the storage seam every stream backend
//! (Redis Streams, PostgreSQL, SQLite) implements with the same behaviour.
//!
//! A stream is an append-only log of entries, named per tenant. Each entry
//! has a [`StreamEntryId`], strictly increasing in append order. A consumer
//! group reads the stream once between its consumers: every entry a group
//! reads is *pending* for the consumer that read it until it is acked, and
//! an entry idle long enough can be claimed by another consumer (the reader
//! crashed). Semantics follow Redis Streams (`XADD`, `XREADGROUP`,
//! `XAUTOCLAIM`, `XACK`, `XPENDING`, `XTRIM`) so that a program written
//! against this trait behaves the same on every backend.
//!
//! Idle times are measured by the backend's clock, never the caller's.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{validate_name, StoreError, ValidationError, MAX_HEADERS, MAX_PAYLOAD_BYTES};

/// The most entries one call appends, reads, claims or acks.
pub const MAX_STREAM_BATCH: usize = 10_000;

/// The longest a read may block waiting for new entries.
pub const MAX_STREAM_BLOCK: Duration = Duration::from_secs(30);

/// The suffix of the stream a subscription dead-letters to (`orders` →
/// `orders.dead`).
pub const DEAD_STREAM_SUFFIX: &str = ".dead";

/// The position of an entry in its stream: an ordered pair, written `a-b`.
///
/// On Redis the pair is Redis's own id (milliseconds, sequence); on
/// PostgreSQL it is (appending transaction, sequence); on SQLite (row, 0).
/// Only the order is meaningful across backends. `0-0` is below every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamEntryId {
    /// The major part (compared first).
    pub major: u64,
    /// The minor part.
    pub minor: u64,
}

impl StreamEntryId {
    /// `0-0`: below every entry; as a claim cursor, "start" and "done".
    pub const ZERO: StreamEntryId = StreamEntryId { major: 0, minor: 0 };

    /// The pair `major-minor`.
    pub const fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }

    /// The smallest id above this one (`u64::MAX-u64::MAX` stays itself).
    #[must_use]
    pub fn successor(self) -> Self {
        match self.minor.checked_add(1) {
            Some(minor) => Self::new(self.major, minor),
            None => match self.major.checked_add(1) {
                Some(major) => Self::new(major, 0),
                None => self,
            },
        }
    }

    /// Parses `text` as `a-b`; errors name `field` (`ids[3]`, `after`).
    pub fn parse(field: &'static str, text: &str) -> Result<Self, ValidationError> {
        let bad = || {
            ValidationError::new(
                field,
                format!("{text:?} is not a stream entry id of the form 1700000000000-0"),
            )
        };
        let (major, minor) = text.split_once('-').ok_or_else(bad)?;
        let digits = |part: &str| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse::<u64>().map_err(|_| bad())
        };
        Ok(Self::new(digits(major)?, digits(minor)?))
    }
}

impl fmt::Display for StreamEntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.major, self.minor)
    }
}

impl FromStr for StreamEntryId {
    type Err = ValidationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse("id", text)
    }
}

impl Serialize for StreamEntryId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StreamEntryId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse("id", &text).map_err(serde::de::Error::custom)
    }
}

/// A tenant's stream: the address every stream operation takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    tenant: String,
    stream: String,
}

impl StreamKey {
    /// `tenant`'s stream `stream`; both must follow the name grammar.
    pub fn new(
        tenant: impl Into<String>,
        stream: impl Into<String>,
    ) -> Result<Self, ValidationError> {
        let (tenant, stream) = (tenant.into(), stream.into());
        validate_name("tenant", &tenant)?;
        validate_name("stream", &stream)?;
        Ok(Self { tenant, stream })
    }

    /// The tenant that owns the stream.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The stream's name within its tenant.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The tenant's stream that entries dead-lettered from this one go to
    /// (`{stream}.dead`); refused when that name would be too long.
    pub fn dead_letters(&self) -> Result<StreamKey, ValidationError> {
        StreamKey::new(
            self.tenant.clone(),
            format!("{}{DEAD_STREAM_SUFFIX}", self.stream),
        )
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.stream)
    }
}

/// Where an entry relayed from the outbox came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryOrigin {
    /// The outbox message's id; relays dedupe on it.
    pub message_id: Uuid,
    /// The message's tenant.
    pub tenant: String,
    /// The message's topic.
    pub topic: String,
    /// The message's schema version.
    pub schema_version: i32,
}

/// An entry to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewStreamEntry {
    /// The entry's JSON payload.
    pub payload: serde_json::Value,
    /// Headers (at most [`MAX_HEADERS`]).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The outbox message it relays, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<EntryOrigin>,
}

impl NewStreamEntry {
    /// An entry with `payload`, no headers and no origin.
    pub fn new(payload: serde_json::Value) -> Self {
        Self {
            payload,
            headers: BTreeMap::new(),
            origin: None,
        }
    }

    /// The payload as stored (compact JSON), refused over `max_payload_bytes`
    /// or with too many headers. `index` names the entry in its batch.
    pub fn validate(
        &self,
        index: usize,
        max_payload_bytes: usize,
    ) -> Result<String, ValidationError> {
        self.validate_within(index, max_payload_bytes, MAX_HEADERS)
    }

    /// As [`validate`](Self::validate) for a dead letter
    /// ([`dead_letter_entry`]): the headers it adds to its stored
    /// original's ([`DEAD_LETTER_HEADERS`]) come on top of the limit, so an
    /// entry with the most headers an append takes can still be
    /// dead-lettered.
    pub fn validate_dead_letter(&self) -> Result<String, ValidationError> {
        self.validate_within(0, MAX_PAYLOAD_BYTES, MAX_HEADERS + DEAD_LETTER_HEADERS)
    }

    fn validate_within(
        &self,
        index: usize,
        max_payload_bytes: usize,
        max_headers: usize,
    ) -> Result<String, ValidationError> {
        let payload = serde_json::to_string(&self.payload)
            .map_err(|e| ValidationError::new("payload", format!("entries[{index}]: {e}")))?;
        let limit = max_payload_bytes.min(MAX_PAYLOAD_BYTES);
        if payload.len() > limit {
            return Err(ValidationError::new(
                "payload",
                format!(
                    "entries[{index}] is {} bytes; the limit is {limit}",
                    payload.len()
                ),
            ));
        }
        if crate::message::holds_nul(&self.payload) {
            return Err(ValidationError::new(
                "payload",
                format!(
                    "entries[{index}] contains U+0000 (\\u0000) in a string or key, \
                     which PostgreSQL cannot store"
                ),
            ));
        }
        if self.headers.len() > max_headers {
            return Err(ValidationError::new(
                "headers",
                format!(
                    "entries[{index}] has {} headers; the limit is {max_headers}",
                    self.headers.len()
                ),
            ));
        }
        if let Some(name) = self
            .headers
            .iter()
            .find_map(|(name, value)| (name.contains('\0') || value.contains('\0')).then_some(name))
        {
            return Err(ValidationError::new(
                "headers",
                format!("entries[{index}]: header {name:?} contains U+0000, which no backend stores alike"),
            ));
        }
        if let Some(origin) = &self.origin {
            validate_name("tenant", &origin.tenant)?;
            validate_name("topic", &origin.topic)?;
        }
        Ok(payload)
    }
}

/// An entry as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEntry {
    /// Its position in the stream.
    pub id: StreamEntryId,
    /// Its payload. A foreign Redis entry (not written by Courier) reads as
    /// an object of its fields.
    pub payload: serde_json::Value,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// The outbox message it relays, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<EntryOrigin>,
}

/// An entry handed to a consumer, with how often it has been delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveredEntry {
    /// The entry.
    #[serde(flatten)]
    pub entry: StreamEntry,
    /// Deliveries so far, this one included (1 on the first read).
    pub deliveries: u64,
}

/// An entry of a consumer's own pending list, as its re-read returns it.
#[derive(Debug, Clone, PartialEq)]
pub enum PendingEntry {
    /// The entry, delivered once more.
    Present(DeliveredEntry),
    /// The entry was trimmed or deleted; it stays pending until acked.
    Deleted(StreamEntryId),
}

impl PendingEntry {
    /// The entry's id.
    pub fn id(&self) -> StreamEntryId {
        match self {
            PendingEntry::Present(delivered) => delivered.entry.id,
            PendingEntry::Deleted(id) => *id,
        }
    }
}

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStart {
    /// Every entry the stream holds.
    Beginning,
    /// Only entries appended after the group was created (on PostgreSQL:
    /// entries whose transaction had not committed then count as later).
    End,
    /// The entries after this id.
    After(StreamEntryId),
}

impl FromStr for GroupStart {
    type Err = ValidationError;

    /// `beginning` (or `0`), `end` (or `$`), or an entry id.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "beginning" | "0" => Ok(GroupStart::Beginning),
            "end" | "$" => Ok(GroupStart::End),
            id => StreamEntryId::parse("start", id).map(GroupStart::After),
        }
    }
}

/// A consumer's read of entries its group has not handed out yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadNew {
    /// The group.
    pub group: String,
    /// The consumer reading (created on first use).
    pub consumer: String,
    /// At most this many entries (1 to [`MAX_STREAM_BATCH`]).
    pub count: usize,
    /// How long to wait for an entry when none is ready (at most
    /// [`MAX_STREAM_BLOCK`]); `None`: return at once.
    pub block: Option<Duration>,
}

/// A consumer's claim of entries idle in its group's pending lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdle {
    /// The group.
    pub group: String,
    /// The consumer taking the entries over (created on first use).
    pub consumer: String,
    /// Only entries not delivered for at least this long (backend clock).
    pub min_idle: Duration,
    /// Scan from this id (`0-0`: the start); the answer's `next` continues.
    pub cursor: StreamEntryId,
    /// At most this many entries (1 to [`MAX_STREAM_BATCH`]).
    pub count: usize,
}

/// What a claim took over.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimedEntries {
    /// Entries now pending for the claiming consumer, with their deliveries
    /// counted (the claim is one more).
    pub entries: Vec<DeliveredEntry>,
    /// Idle pending ids whose entries were trimmed: dropped from pending.
    pub deleted: Vec<StreamEntryId>,
    /// Where the next claim continues; `0-0` when the scan reached the end.
    pub next: StreamEntryId,
}

/// A group's pending entries, summed up.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PendingSummary {
    /// How many entries are pending.
    pub count: u64,
    /// The lowest pending id.
    pub lowest: Option<StreamEntryId>,
    /// The highest pending id.
    pub highest: Option<StreamEntryId>,
    /// Pending entries per consumer (consumers with none are left out),
    /// by consumer name.
    pub consumers: BTreeMap<String, u64>,
}

/// One pending entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDetail {
    /// The entry's id.
    pub id: StreamEntryId,
    /// The consumer it is pending for.
    pub consumer: String,
    /// How long since it was last delivered (backend clock).
    #[serde(with = "millis")]
    pub idle: Duration,
    /// How often it has been delivered, less the deliveries taken back
    /// ([`StreamStore::uncount_deliveries`]).
    pub deliveries: u64,
}

/// A page of a group's pending entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingQuery {
    /// Only entries above this id (`0-0`: from the start).
    pub after: StreamEntryId,
    /// At most this many (1 to [`MAX_STREAM_BATCH`]).
    pub count: usize,
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only entries idle at least this long.
    pub min_idle: Option<Duration>,
}

/// A consumer of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// Its name.
    pub name: String,
    /// Entries pending for it.
    pub pending: u64,
    /// How long since it last read or claimed (backend clock).
    #[serde(with = "millis")]
    pub idle: Duration,
}

/// How far a trim cuts a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimBound {
    /// Keep the newest this many entries.
    MaxLen(u64),
    /// Keep the entries at or above this id.
    MinId(StreamEntryId),
}

/// What a request to delete a consumer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerRemoval {
    /// The consumer is gone.
    Deleted,
    /// There was no such consumer (nothing changed).
    NotFound,
    /// Refused: the consumer still has this many pending entries.
    HasPending(u64),
}

/// The most streams one page of [`StreamStore::list_streams`] holds.
pub const MAX_STREAM_PAGE: usize = 500;

/// A consumer group of a listed stream, summed up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// The group's name.
    pub name: String,
    /// How many consumers it has (created by their first read or claim,
    /// gone when deleted), idle or not.
    pub consumers: u64,
    /// How many entries are pending in it (handed out, not acked; trimmed
    /// ones included until acked or claimed), as
    /// [`StreamStore::pending_summary`] counts them.
    pub pending: u64,
    /// Its cursor: the last id it handed out, or where it was told to start
    /// (on PostgreSQL a group created at the end starts below the
    /// transactions running then, so the id need not be an entry's).
    pub last_delivered: StreamEntryId,
    /// Entries it has not handed out yet, as [`StreamStore::lag`] counts
    /// them; `None` where the backend cannot tell (Redis, after entries were
    /// deleted or trimmed from the part not read yet).
    pub lag: Option<u64>,
}

/// A stream as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSummary {
    /// The tenant that owns it.
    pub tenant: String,
    /// Its name within the tenant (dead-letter streams, `{stream}.dead`,
    /// are streams like any other).
    pub stream: String,
    /// How many entries it holds now (trims and deletions lower it).
    pub length: u64,
    /// Its newest entry's id; `None` when it holds no entry.
    pub last_id: Option<StreamEntryId>,
    /// Its consumer groups, by name in byte order.
    pub groups: Vec<GroupSummary>,
}

/// One page of streams, by (tenant, stream) in byte order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamPage {
    /// The streams.
    pub items: Vec<StreamSummary>,
    /// Pass as `after` to get the next page (the last stream shown); `None`
    /// on the last page.
    pub next: Option<StreamKey>,
}

/// The error for an operation on `group`, which `key` does not have.
pub fn group_not_found(key: &StreamKey, group: &str) -> StoreError {
    StoreError::NotFound {
        what: format!("group {group} of stream {key}"),
    }
}

/// Validates the arguments of an operation on `consumer`'s own pending
/// entries ([`StreamStore::touch`], [`StreamStore::uncount_deliveries`]):
/// the group's and the consumer's names, and 1 to [`MAX_STREAM_BATCH`] ids.
pub fn validate_own_pending(
    group: &str,
    consumer: &str,
    ids: &[StreamEntryId],
) -> Result<(), ValidationError> {
    crate::validate_name("group", group)?;
    crate::validate_name("consumer", consumer)?;
    validate_count("ids", ids.len())
}

/// Validates a batch size `count` for `field`.
pub fn validate_count(field: &'static str, count: usize) -> Result<(), ValidationError> {
    if count == 0 || count > MAX_STREAM_BATCH {
        return Err(ValidationError::new(
            field,
            format!("is {count}; it must be between 1 and {MAX_STREAM_BATCH}"),
        ));
    }
    Ok(())
}

/// Validates a read's blocking time.
pub fn validate_block(block: Option<Duration>) -> Result<(), ValidationError> {
    match block {
        Some(block) if block > MAX_STREAM_BLOCK => Err(ValidationError::new(
            "block_ms",
            format!(
                "is {} ms; the limit is {} ms",
                block.as_millis(),
                MAX_STREAM_BLOCK.as_millis()
            ),
        )),
        _ => Ok(()),
    }
}

impl ReadNew {
    /// Checks the group and consumer names, the count and the block.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name("group", &self.group)?;
        validate_name("consumer", &self.consumer)?;
        validate_count("count", self.count)?;
        validate_block(self.block)
    }
}

impl ClaimIdle {
    /// Checks the group and consumer names and the count.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name("group", &self.group)?;
        validate_name("consumer", &self.consumer)?;
        validate_count("count", self.count)
    }
}

impl PendingQuery {
    /// Checks the consumer name and the count.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(consumer) = &self.consumer {
            validate_name("consumer", consumer)?;
        }
        validate_count("count", self.count)
    }
}

/// A stream backend: the same behaviour on Redis, PostgreSQL and SQLite.
///
/// Operations on a group that does not exist fail with
/// [`StoreError::NotFound`]; [`StreamStore::ensure_group`] creates it.
pub trait StreamStore: Clone + Send + Sync + 'static {
    /// The backend's name in logs and metrics (`redis`, `postgres`, `sqlite`).
    fn backend(&self) -> &'static str;

    /// How many batches a stream subscription reads ahead, while it handles
    /// one, when it works through a backlog. Where reads compete with the
    /// subscription's receipts for the same database (native streams) a
    /// deeper pipeline is slower; a stream server in front of the database
    /// gains from a deeper one (BENCHMARKS.md, session 25).
    fn reads_ahead(&self) -> usize {
        2
    }

    /// Appends `entries` in order, all or nothing; returns their ids, strictly
    /// increasing, and above the ids of every append that committed before
    /// this one began. (On PostgreSQL an append that began earlier can
    /// commit later with lower ids; groups still hand entries out in id order
    /// without skipping any, see the PostgreSQL store.)
    fn append<'c>(
        &'c self,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> impl Future<Output = Result<Vec<StreamEntryId>, StoreError>> + Send + 'c;

    /// Creates `group` on the stream (and the stream) starting at `start`;
    /// returns whether it was created. An existing group is left as it is.
    fn ensure_group<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        start: GroupStart,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c;

    /// Hands `read.consumer` up to `read.count` entries its group has not
    /// handed out, in id order, each now pending for it with 1 delivery.
    /// With `block`, waits up to that long for an entry when none is ready
    /// and returns as soon as one arrives.
    fn read_new<'c>(
        &'c self,
        key: &'c StreamKey,
        read: &'c ReadNew,
    ) -> impl Future<Output = Result<Vec<DeliveredEntry>, StoreError>> + Send + 'c;

    /// Re-reads up to `count` of `consumer`'s own pending entries above
    /// `after`, in id order, counting one more delivery each; trimmed ones
    /// come back as [`PendingEntry::Deleted`].
    fn read_pending<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        after: StreamEntryId,
        count: usize,
    ) -> impl Future<Output = Result<Vec<PendingEntry>, StoreError>> + Send + 'c;

    /// Takes over pending entries idle at least `claim.min_idle`, scanning
    /// from `claim.cursor` (see [`ClaimedEntries`]).
    fn claim_idle<'c>(
        &'c self,
        key: &'c StreamKey,
        claim: &'c ClaimIdle,
    ) -> impl Future<Output = Result<ClaimedEntries, StoreError>> + Send + 'c;

    /// Acknowledges `ids`: they leave the group's pending lists. Returns how
    /// many were pending (ids not pending, or unknown, count 0).
    fn ack<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Restarts the idle time of those of `ids` pending to `consumer` in
    /// `group` — as if delivered now, their delivery counts unchanged — so
    /// that entries a consumer is still working on are not claimed by
    /// another as idle. Entries pending to another consumer, acked or
    /// unknown are left alone; returns how many were touched.
    fn touch<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Takes back the latest delivery of those of `ids` pending to
    /// `consumer` in `group`: each one's delivery count drops by one (not
    /// below 0), its idle time and consumer unchanged. For entries delivered
    /// but never handled (deferred, read and not run), so that such a
    /// delivery counts against `max_deliveries` nowhere, whoever takes the
    /// entry next. Entries pending to another consumer, acked or unknown are
    /// left alone, and so may be one whose entry was trimmed (its next
    /// delivery reports it deleted); returns how many were taken back.
    fn uncount_deliveries<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
        ids: &'c [StreamEntryId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// How long the oldest entry of the stream that has committed but is not
    /// readable yet has waited, measured from its append. On PostgreSQL an
    /// entry is handed out only once every transaction that began before its
    /// own has ended, so an appending (or any writing) transaction held open
    /// elsewhere delays the entries committed after it. `Some(ZERO)` when no
    /// entry waits; `None` where a committed entry is readable at once
    /// (SQLite, Redis).
    fn visibility_wait<'c>(
        &'c self,
        key: &'c StreamKey,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send + 'c;

    /// Sums up the group's pending entries.
    fn pending_summary<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl Future<Output = Result<PendingSummary, StoreError>> + Send + 'c;

    /// The group's lag: entries of the stream it has not handed out yet
    /// (appended after its last read); `None` where the backend cannot tell
    /// (Redis, after entries were deleted or trimmed from the part not read
    /// yet). Fails with [`StoreError::NotFound`] for an unknown group.
    fn lag<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send + 'c;

    /// Lists the group's pending entries, in id order.
    fn pending_detail<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        query: &'c PendingQuery,
    ) -> impl Future<Output = Result<Vec<PendingDetail>, StoreError>> + Send + 'c;

    /// Lists the group's consumers by name.
    fn consumers<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
    ) -> impl Future<Output = Result<Vec<ConsumerInfo>, StoreError>> + Send + 'c;

    /// Deletes `consumer`, unless it has pending entries (checked and done
    /// atomically, so no entry is ever dropped from pending by it).
    fn delete_consumer<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        consumer: &'c str,
    ) -> impl Future<Output = Result<ConsumerRemoval, StoreError>> + Send + 'c;

    /// Reads up to `count` entries above `after`, in id order, outside any
    /// group (nothing becomes pending).
    fn range<'c>(
        &'c self,
        key: &'c StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send + 'c;

    /// Removes the oldest entries down to `bound`; returns how many. Entries
    /// still pending stay pending (their re-reads report them deleted).
    fn trim<'c>(
        &'c self,
        key: &'c StreamKey,
        bound: TrimBound,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Appends `entry` to the dead-letter stream (`{stream}.dead`) with its
    /// original id, payload, headers and `errors`, and acks it in `group`,
    /// atomically: either both happen or neither. Returns whether it was
    /// still pending (a `false` appended nothing: another consumer acked it).
    fn dead_letter<'c>(
        &'c self,
        key: &'c StreamKey,
        group: &'c str,
        entry: &'c DeliveredEntry,
        errors: &'c [String],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'c;

    /// Lists the streams of `tenants` (`None`: every tenant's) that come
    /// after `after` in (tenant, stream) byte order, at most `limit` (clamped
    /// to 1..=[`MAX_STREAM_PAGE`]), each with its length, newest id and
    /// groups (see [`StreamSummary`]). A stream exists while it has entries
    /// or groups (on Redis: while its key does, even emptied by a trim).
    /// Tenants that break the name grammar are refused
    /// ([`StoreError::Invalid`] naming `tenant`). Each page is summed up as
    /// of one moment; pages are not one snapshot, so a stream created or
    /// removed between them shows or not by where it falls. On Redis only
    /// the store's own keys (`{prefix}{tenant}:{stream}`) are listed, not
    /// raw keys mapped to a stream.
    fn list_streams<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StreamKey>,
        limit: usize,
    ) -> impl Future<Output = Result<StreamPage, StoreError>> + Send + 'c;
}

/// Checks the tenants a stream listing is filtered by.
pub fn validate_tenants(tenants: Option<&[String]>) -> Result<(), ValidationError> {
    for tenant in tenants.unwrap_or_default() {
        validate_name("tenant", tenant)?;
    }
    Ok(())
}

/// What a receipt-guarded run of a stream subscription's effect did.
#[derive(Debug)]
pub enum ReceiptOutcome {
    /// The work ran and committed with its receipt.
    Applied,
    /// A receipt already existed: the work was skipped.
    AlreadyApplied,
    /// The work failed: it and the receipt were rolled back.
    Failed(crate::HandlerError),
}

/// Receipts of stream subscriptions, kept in the outbox database: the record
/// that the effect of entry `correlation_id` (`{subscription}:{stream}:{entry
/// id}`) was made, so a crash between the effect and the ack never applies
/// it twice. Receipts are removed by the outbox's `prune` once older than its
/// retention.
pub trait StreamReceipts: Clone + Send + Sync + 'static {
    /// The connection transactional work writes through.
    type Connection: Send;

    /// Which of `correlation_ids` have a receipt of `subscription`.
    fn find_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send + 'c;

    /// Writes receipts of `subscription` for `correlation_ids` in one
    /// transaction; returns how many were new.
    fn record_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'c;

    /// Writes receipts of `subscription` for `correlation_ids`, which the
    /// caller looked up (with [`find_stream_receipts`](Self::find_stream_receipts))
    /// and found none of, in one transaction. Unlike
    /// [`record_stream_receipts`](Self::record_stream_receipts) it may skip
    /// looking for receipts already stored: an id recorded meanwhile (by
    /// another consumer that claimed its entry) may be stored twice, and
    /// every lookup still finds it exactly once.
    fn record_new_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'c {
        async move {
            self.record_stream_receipts(subscription, correlation_ids)
                .await
                .map(|_| ())
        }
    }

    /// Runs `work` in one transaction with the receipt: both commit or
    /// neither does; when the receipt already exists the work is skipped.
    fn run_with_stream_receipt<'c>(
        &'c self,
        subscription: &'c str,
        correlation_id: &'c str,
        work: crate::TxWork<Self::Connection>,
    ) -> impl Future<Output = Result<ReceiptOutcome, StoreError>> + Send + 'c;
}

/// How many headers [`dead_letter_entry`] adds to its original's.
pub const DEAD_LETTER_HEADERS: usize = 4;

/// The dead-letter entry for `entry` of `key` (what
/// [`StreamStore::dead_letter`] appends): the original payload, headers and
/// origin, with headers `courier-original-id`, `courier-original-stream`,
/// `courier-deliveries` and `courier-errors` (a JSON array).
pub fn dead_letter_entry(
    key: &StreamKey,
    entry: &DeliveredEntry,
    errors: &[String],
) -> NewStreamEntry {
    let mut headers = entry.entry.headers.clone();
    headers.insert("courier-original-id".into(), entry.entry.id.to_string());
    headers.insert("courier-original-stream".into(), key.stream().to_owned());
    headers.insert("courier-deliveries".into(), entry.deliveries.to_string());
    headers.insert(
        "courier-errors".into(),
        serde_json::Value::from(errors.to_vec()).to_string(),
    );
    NewStreamEntry {
        payload: entry.entry.payload.clone(),
        headers,
        origin: entry.entry.origin.clone(),
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_print_and_order() {
        let id = StreamEntryId::parse("id", "1700000000000-3").unwrap();
        assert_eq!(id, StreamEntryId::new(1_700_000_000_000, 3));
        assert_eq!(id.to_string(), "1700000000000-3");
        assert!(StreamEntryId::new(1, 9) < StreamEntryId::new(2, 0));
        assert_eq!(
            StreamEntryId::new(1, u64::MAX).successor(),
            StreamEntryId::new(2, 0)
        );
        for bad in [
            "",
            "1",
            "-1",
            "1-",
            "a-1",
            "1-2-3",
            "+1-2",
            "1 -2",
            "99999999999999999999-0",
        ] {
            let err = StreamEntryId::parse("ids[3]", bad).unwrap_err();
            assert_eq!(err.field, "ids[3]", "{bad}");
        }
    }

    #[test]
    fn group_starts_parse() {
        assert_eq!("$".parse::<GroupStart>().unwrap(), GroupStart::End);
        assert_eq!("0".parse::<GroupStart>().unwrap(), GroupStart::Beginning);
        assert_eq!(
            "5-1".parse::<GroupStart>().unwrap(),
            GroupStart::After(StreamEntryId::new(5, 1))
        );
        assert_eq!("x".parse::<GroupStart>().unwrap_err().field, "start");
    }

    #[test]
    fn keys_counts_and_blocks_are_checked() {
        assert_eq!(StreamKey::new("acme", "a:b").unwrap_err().field, "stream");
        assert_eq!(StreamKey::new("", "a").unwrap_err().field, "tenant");
        let long = StreamKey::new("acme", "a".repeat(125)).unwrap();
        assert_eq!(long.dead_letters().unwrap_err().field, "stream");
        assert!(validate_count("count", 0).is_err());
        assert!(validate_count("count", MAX_STREAM_BATCH + 1).is_err());
        assert!(validate_count("count", MAX_STREAM_BATCH).is_ok());
        assert_eq!(
            validate_block(Some(Duration::from_millis(30_001)))
                .unwrap_err()
                .field,
            "block_ms"
        );
    }

    #[test]
    fn entries_holding_u0000_are_refused_on_every_backend_alike() {
        let key = NewStreamEntry::new(serde_json::json!({"k\u{0}": 1}));
        assert_eq!(key.validate(0, 1_000).unwrap_err().field, "payload");
        let deep = NewStreamEntry::new(serde_json::json!([[{"s": "a\u{0}b"}]]));
        let err = deep.validate(2, 1_000).unwrap_err();
        assert_eq!(err.field, "payload");
        assert!(err.reason.contains("entries[2]"), "{}", err.reason);
        let mut header = NewStreamEntry::new(serde_json::json!({}));
        header.headers.insert("h".into(), "x\u{0}".into());
        assert_eq!(header.validate(0, 1_000).unwrap_err().field, "headers");
        let escaped = NewStreamEntry::new(serde_json::json!({"s": "\\u0000"}));
        assert!(
            escaped.validate(0, 1_000).is_ok(),
            "a backslash before u0000 is text"
        );
    }

    #[test]
    fn oversized_entries_are_refused() {
        let entry = NewStreamEntry::new(serde_json::json!({"a": "x".repeat(100)}));
        assert!(entry.validate(0, 1_000).is_ok());
        let err = entry.validate(4, 50).unwrap_err();
        assert_eq!(err.field, "payload");
        assert!(err.reason.contains("entries[4]"), "{}", err.reason);
    }
}
