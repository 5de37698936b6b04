//! Courier's Redis Streams store: [`StreamStore`] on a Redis stream per
//! tenant's stream, with Redis's own consumer groups.
//!
//! Requires Redis 7.0 or newer (`XAUTOCLAIM`'s report of trimmed entries,
//! `XPENDING ... IDLE`) on a single server or a primary; Redis Cluster is not
//! supported (a dead letter's script touches two keys).
//!
//! # Key layout
//!
//! The stream `stream` of tenant `tenant` is the Redis stream at
//! `{prefix}{tenant}:{stream}` ([`RedisStreamStore::redis_key`]); its
//! dead-letter stream is `{prefix}{tenant}:{stream}.dead`. The prefix (see
//! [`validate_key_prefix`]) keeps stores, or tests, sharing one server apart;
//! tenant and stream names cannot hold `:`, so no two keys collide. Groups
//! and consumers are Redis's own, named as given.
//!
//! A stream another program writes, at a key of its own choosing, is read
//! through a store that maps a [`StreamKey`] to that key
//! ([`RedisStreamStore::with_raw_key`]); its dead letters go to
//! `{raw key}.dead`.
//!
//! # Entry encoding
//!
//! An entry is stored as the fields `payload` (compact JSON text), `headers`
//! (a JSON object of strings, left out when there are none) and, when it
//! relays an outbox message, `message_id`, `tenant`, `topic` and
//! `schema_version`. An entry written by another program reads back as a
//! *foreign* entry: its payload is a JSON object of its fields (string
//! values), with no headers and no origin. An entry counts as Courier's only
//! when its `payload` parses as JSON and its other fields are all among the
//! known ones (and parse); decoding never fails.
//!
//! # Connections
//!
//! Every command that returns at once goes through one multiplexed
//! connection ([`redis::aio::ConnectionManager`]) that reconnects by itself:
//! a command that finds it broken fails with a transient error and the next
//! one gets a new connection. A blocking read (`read_new` with a `block`,
//! when nothing is ready at once) never waits there — Redis answers one connection's commands in order, so
//! it would stall every other caller — but takes a dedicated connection from
//! a small pool kept by the store (see [`RedisConfig::idle_blocking_connections`]),
//! opened on demand, one per read in flight. Every command has a response
//! timeout ([`RedisConfig::response_timeout`]; a blocking read's is its block
//! plus that), and every connection attempt a connection timeout, so a server
//! that is down or silent gives a transient [`StoreError`], never a hang.
//! The store speaks RESP2 whatever the URL asks for.
//!
//! # What is atomic, and how
//!
//! Redis runs each command and each Lua script alone. What the trait wants
//! done in one step is one script (run with `EVALSHA`, loaded on first use
//! and again after a server restart):
//! - `append`: all XADDs of a batch; one that fails mid-batch has the ones
//!   before it deleted in the same script, so a batch is all or nothing
//!   (only the stream's id counter stays advanced: ids are never reused).
//! - `read_pending` and `claim_idle`: the read or claim and the XPENDING that
//!   reads the delivery counts it left, so the counts are the ones it made
//!   (and, for a claim, XGROUP CREATECONSUMER as for reads).
//! - `delete_consumer`: the check for pending entries and the DELCONSUMER
//!   (which alone would drop them).
//! - `touch`: per id, the XPENDING that says whose it is and, if it is the
//!   consumer's, `XCLAIM … JUSTID` to it (idle time restarts, no delivery
//!   counted), so an entry another consumer claimed meanwhile stays its.
//! - `uncount_deliveries`: the same check, then `XCLAIM … IDLE (its idle
//!   time) RETRYCOUNT (its count less one) JUSTID` to it.
//! - `dead_letter`: the pending check, the XADD to the dead-letter stream and
//!   the XACK; an error leaves both streams unchanged.
//! - `list_streams`: the summaries of a page's streams (length, newest id,
//!   groups), so they are of one moment and no entry's payload is sent.
//!   The page's keys come from a `SCAN` of the prefix (`TYPE stream`),
//!   sorted in memory: a listing walks every key of the prefix.
//!
//! The hot path has no script, because a script's reply costs Redis more
//! than the commands, and needs none: `read_new` without waiting is
//! XREADGROUP then XGROUP CREATECONSUMER, pipelined in one round trip but
//! not atomic (Redis 7.0 creates a consumer only when a read hands it
//! something; a blocking read runs this first and waits only when nothing
//! was ready; a stream deleted between the two is `NotFound`, as a missing
//! one is); `ack` is XACK, followed by an XPENDING only when it acked
//! nothing, to tell a missing stream or group from nothing pending.
//!
//! Each script opens with what it touches and why it is shaped so
//! (`scripts/*.lua`).
//!
//! # Errors
//!
//! A missing stream or group (`NOGROUP`) is [`StoreError::NotFound`]; bad
//! input is [`StoreError::Invalid`] before anything is sent; everything else
//! is [`StoreError::Database`], transient for I/O errors (refused, reset or
//! dropped connections), timeouts, `LOADING`, `BUSY`, `TRYAGAIN`,
//! `CLUSTERDOWN` and `MASTERDOWN`.

mod blocking;
mod encoding;
mod error;
mod reply;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{StoreError, StreamKey, ValidationError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, ProtocolVersion, Script};

/// The `redis` crate this store is built on, for work on
/// [`RedisStreamStore::connection`].
pub use redis;

#[cfg(doc)]
use courier_core::StreamStore;

use blocking::BlockingConnections;
use error::map;

/// The XADD field/value arguments of `entry`, exactly as
/// [`StreamStore::append`] writes it (see the module's entry encoding), for
/// programs that append Courier entries with scripts of their own (the
/// daemon's Redis relay). Refused like an append would refuse it: a payload
/// over [`courier_core::MAX_PAYLOAD_BYTES`], too many headers, or an origin
/// whose names break the grammar.
pub fn entry_fields(entry: &courier_core::NewStreamEntry) -> Result<Vec<String>, ValidationError> {
    let payload = entry.validate(0, courier_core::MAX_PAYLOAD_BYTES)?;
    Ok(encoding::encode(entry, payload))
}

/// Translates a Redis driver error into a [`StoreError`] the way this store
/// does: [`StoreError::Database`], transient for I/O errors (refused, reset
/// or dropped connections), timeouts, `LOADING`, `BUSY`, `TRYAGAIN`,
/// `CLUSTERDOWN` and `MASTERDOWN`.
pub fn map_error(error: redis::RedisError) -> StoreError {
    map(error)
}

/// How long a connection attempt may take unless configured otherwise.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a command may wait for its reply unless configured otherwise
/// (a blocking read: its block plus this).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connection attempts after the first failed one, when connecting or
/// reconnecting, unless configured otherwise.
pub const DEFAULT_RECONNECT_RETRIES: usize = 2;

/// Idle dedicated connections for blocking reads kept unless configured
/// otherwise.
pub const DEFAULT_IDLE_BLOCKING_CONNECTIONS: usize = 4;

/// The longest key prefix, in bytes.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;

/// Checks a key prefix: at most [`MAX_KEY_PREFIX_BYTES`] printable ASCII
/// characters, no spaces; empty is allowed.
pub fn validate_key_prefix(prefix: &str) -> Result<(), ValidationError> {
    if prefix.len() > MAX_KEY_PREFIX_BYTES {
        return Err(ValidationError::new(
            "key_prefix",
            format!(
                "is {} bytes long; the limit is {MAX_KEY_PREFIX_BYTES}",
                prefix.len()
            ),
        ));
    }
    if let Some(bad) = prefix.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(ValidationError::new(
            "key_prefix",
            format!("may contain only printable ASCII characters other than space, found {bad:?}"),
        ));
    }
    Ok(())
}

/// How a [`RedisStreamStore`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Put before every key the store touches (see [`validate_key_prefix`]).
    pub key_prefix: String,
    /// How long one connection attempt may take (TCP connect and handshake).
    pub connection_timeout: Duration,
    /// How long a command may wait for its reply; a blocking read waits its
    /// block plus this.
    pub response_timeout: Duration,
    /// Connection attempts after the first failed one, with a backoff from
    /// 100 ms doubling (jittered), when connecting or reconnecting.
    pub reconnect_retries: usize,
    /// How many idle dedicated connections for blocking reads the store
    /// keeps for the next reads (more are opened while more reads block).
    pub idle_blocking_connections: usize,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            key_prefix: String::new(),
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            reconnect_retries: DEFAULT_RECONNECT_RETRIES,
            idle_blocking_connections: DEFAULT_IDLE_BLOCKING_CONNECTIONS,
        }
    }
}

impl RedisConfig {
    /// The defaults with keys under `key_prefix`.
    pub fn new(key_prefix: impl Into<String>) -> Self {
        Self {
            key_prefix: key_prefix.into(),
            ..Self::default()
        }
    }

    /// Checks the prefix and that both timeouts are above zero.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_key_prefix(&self.key_prefix)?;
        for (field, timeout) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ValidationError::new(field, "must be above zero"));
            }
        }
        Ok(())
    }
}

/// Courier's streams on Redis. Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct RedisStreamStore {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    blocking: Arc<BlockingConnections>,
    /// Streams at keys of their own (see [`RedisStreamStore::with_raw_key`]).
    raw_keys: Arc<BTreeMap<StreamKey, String>>,
}

/// The longest raw key [`RedisStreamStore::with_raw_key`] takes, in bytes.
pub const MAX_RAW_KEY_BYTES: usize = 512;

/// Checks a raw Redis key: 1 to [`MAX_RAW_KEY_BYTES`] bytes of printable
/// ASCII (no spaces or control characters), and not ending in `.dead`, the
/// suffix of its dead-letter stream.
pub fn validate_raw_key(raw: &str) -> Result<(), ValidationError> {
    let field = "redis_key";
    if raw.is_empty() || raw.len() > MAX_RAW_KEY_BYTES {
        return Err(ValidationError::new(
            field,
            format!("must be 1 to {MAX_RAW_KEY_BYTES} bytes, not {}", raw.len()),
        ));
    }
    if let Some(bad) = raw.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(ValidationError::new(
            field,
            format!("may hold printable ASCII only, not {bad:?}"),
        ));
    }
    if raw.ends_with(".dead") {
        return Err(ValidationError::new(
            field,
            "must not end in \".dead\" (the suffix of a stream's dead letters)",
        ));
    }
    Ok(())
}

/// What every store over the same connections shares.
struct Shared {
    client: Client,
    manager: ConnectionManager,
    config: RedisConfig,
    scripts: Scripts,
}

/// The Lua scripts, hashed once.
struct Scripts {
    append: Script,
    read_pending: Script,
    claim_idle: Script,
    delete_consumer: Script,
    dead_letter: Script,
    stream_summaries: Script,
    touch: Script,
    uncount: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            append: Script::new(include_str!("../scripts/append.lua")),
            read_pending: Script::new(include_str!("../scripts/read_pending.lua")),
            claim_idle: Script::new(include_str!("../scripts/claim_idle.lua")),
            delete_consumer: Script::new(include_str!("../scripts/delete_consumer.lua")),
            dead_letter: Script::new(include_str!("../scripts/dead_letter.lua")),
            stream_summaries: Script::new(include_str!("../scripts/stream_summaries.lua")),
            touch: Script::new(include_str!("../scripts/touch.lua")),
            uncount: Script::new(include_str!("../scripts/uncount.lua")),
        }
    }
}

impl fmt::Debug for RedisStreamStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamStore")
            .field("key_prefix", &&*self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStreamStore {
    /// Connects to the Redis at `url` (`redis://[user:password@]host[:port][/db]`)
    /// with the default timeouts, keys under `key_prefix`.
    pub async fn connect(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, RedisConfig::new(key_prefix)).await
    }

    /// Connects to the Redis at `url` as `config` says. Fails with a
    /// transient error when the server cannot be reached within the
    /// connection timeout and retries.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let info = url.into_connection_info().map_err(|e| {
            ValidationError::new("url", format!("is not a Redis URL ({})", e.category()))
        })?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP2);
        let client = Client::open(info.set_redis_settings(settings)).map_err(map)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connection_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(config.reconnect_retries);
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config)
            .await
            .map_err(map)?;
        let blocking = BlockingConnections::new(
            client.clone(),
            config.connection_timeout,
            &config.key_prefix,
            config.idle_blocking_connections,
        );
        Ok(Self {
            prefix: Arc::from(config.key_prefix.as_str()),
            raw_keys: Arc::default(),
            blocking: Arc::new(blocking),
            shared: Arc::new(Shared {
                client,
                manager,
                config,
                scripts: Scripts::new(),
            }),
        })
    }

    /// The same server and shared connection with keys under `key_prefix`
    /// (its blocking reads get their own pool).
    pub fn with_prefix(&self, key_prefix: &str) -> Result<Self, ValidationError> {
        validate_key_prefix(key_prefix)?;
        let config = &self.shared.config;
        Ok(Self {
            shared: Arc::clone(&self.shared),
            prefix: Arc::from(key_prefix),
            raw_keys: Arc::clone(&self.raw_keys),
            blocking: Arc::new(BlockingConnections::new(
                self.shared.client.clone(),
                config.connection_timeout,
                key_prefix,
                config.idle_blocking_connections,
            )),
        })
    }

    /// The prefix before every key this store touches.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configuration the store connected with (its `key_prefix` is the
    /// one it was connected with, not a later [`RedisStreamStore::with_prefix`]).
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// The same server and connections, reading and writing `key` (and its
    /// dead letters, [`StreamKey::dead_letters`]) at the Redis key `raw`
    /// (and `{raw}.dead`) instead of under the prefix: a stream another
    /// program writes. Entries there that Courier did not write read as
    /// foreign entries (see the crate's notes). Every other key keeps its
    /// place; `raw` is checked by [`validate_raw_key`].
    pub fn with_raw_key(&self, key: &StreamKey, raw: &str) -> Result<Self, ValidationError> {
        validate_raw_key(raw)?;
        let dead = key.dead_letters()?;
        let mut raw_keys = BTreeMap::clone(&self.raw_keys);
        raw_keys.insert(key.clone(), raw.to_owned());
        raw_keys.insert(dead, format!("{raw}.dead"));
        Ok(Self {
            shared: Arc::clone(&self.shared),
            prefix: Arc::clone(&self.prefix),
            blocking: Arc::clone(&self.blocking),
            raw_keys: Arc::new(raw_keys),
        })
    }

    /// The Redis key of `key`'s stream: `{prefix}{tenant}:{stream}`, or the
    /// raw key [`with_raw_key`](Self::with_raw_key) gave it.
    pub fn redis_key(&self, key: &StreamKey) -> String {
        match self.raw_keys.get(key) {
            Some(raw) => raw.clone(),
            None => format!("{}{}:{}", self.prefix, key.tenant(), key.stream()),
        }
    }

    /// The shared multiplexed connection, for backend-specific work. Never
    /// send it a blocking command: every other caller would wait behind it.
    pub fn connection(&self) -> ConnectionManager {
        self.shared.manager.clone()
    }

    /// Checks that the server answers (`PING` on the shared connection).
    pub async fn ping(&self) -> Result<(), StoreError> {
        redis::cmd("PING")
            .exec_async(&mut self.connection())
            .await
            .map_err(map)
    }

    /// Idle dedicated connections kept for blocking reads (for diagnostics).
    pub fn idle_blocking_connections(&self) -> usize {
        self.blocking.idle()
    }
}
