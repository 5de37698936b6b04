//! Courier's PostgreSQL store.
//!
//! [`PgStore`] keeps the outbox in its own schema (default `courier`): the
//! `messages` table producers insert into, the per-subscription `deliveries`
//! that workers claim with `FOR UPDATE SKIP LOCKED`, `receipts`, and the
//! subscriptions. Every query lives in `queries/*.sql`, rendered once per
//! schema. Every lease check uses the database clock. [`PgNotifier`] turns the
//! fan-out trigger's NOTIFY into worker wake-ups. The operators' view
//! ([`AdminStore`](courier_core::AdminStore)) lists messages with their
//! per-subscription state and pauses subscriptions: a paused subscription's
//! claims take nothing until it is resumed.

mod admin;
mod claim;
mod dead_letters;
mod error;
mod floors;
mod migrate;
mod notifier;
mod outbox;
mod queries;
mod rows;
mod stream_receipts;
mod streams;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier_core::{
    Availability, EnqueueOutcome, NewMessage, OutboxStore, StoreError, ValidationError,
};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions};
use sqlx::Arguments;
use sqlx::{PgConnection, PgPool};

pub use admin::MAX_MESSAGE_PAGE;
pub use migrate::{MIGRATIONS, SCHEMA_VERSION};
pub use notifier::{PgNotifier, LISTEN_CHECK};
pub use streams::POLL_INTERVAL as STREAM_POLL_INTERVAL;

use error::map;
use floors::Floors;
use queries::Queries;

/// The schema Courier's tables live in unless another is chosen.
pub const DEFAULT_SCHEMA: &str = "courier";

/// Courier's outbox on PostgreSQL. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    queries: Queries,
    floors: Floors,
    /// The stream notification listener, started by the first blocked read.
    stream_wakeups: std::sync::OnceLock<Arc<streams::StreamWakeups>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

/// Checks a PostgreSQL schema name: `[a-z_][a-z0-9_]{0,62}` (it is spliced into SQL).
pub fn validate_schema(schema: &str) -> Result<(), ValidationError> {
    let mut chars = schema.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if !first_ok
        || schema.len() > 63
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(ValidationError::new(
            "schema",
            format!("{schema:?} must match [a-z_][a-z0-9_]{{0,62}}"),
        ));
    }
    Ok(())
}

/// The session settings [`connect_options`] gives every connection, each
/// unless the URL's `options` parameter sets it (`options=-c
/// statement_timeout=0` turns one off): a statement runs at most 30 s, waits
/// at most 10 s for a lock, and a session idle inside a transaction for 2
/// minutes (a process frozen or cut off mid-transaction) is ended by the
/// server, so that its row locks do not hold up every other worker.
/// Migrations lift the first two for their own transaction.
pub const SESSION_TIMEOUTS: [(&str, &str); 3] = [
    ("statement_timeout", "30s"),
    ("lock_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "120s"),
];

/// The connection options Courier wants for `url`: the URL's own, with JIT
/// off and the [`SESSION_TIMEOUTS`] the URL does not set itself.
///
/// JIT is off because Courier's statements are short, but once autovacuum has
/// given a backlog's tables statistics, the claim's estimated cost passes
/// PostgreSQL's default `jit_above_cost` and each claim spends far longer
/// compiling than running (measured: 156 ms instead of 6.5 ms for 256
/// deliveries of a 100,000 backlog). Build your own pool from these when you
/// share it with Courier; [`connect`] does. The timeouts apply to everything
/// run on these connections, a transactional handler's own statements too.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(map)?;
    let own = options.get_options().unwrap_or_default().to_owned();
    let timeouts = SESSION_TIMEOUTS
        .into_iter()
        .filter(|(name, _)| !own.contains(name));
    Ok(options.options([("jit", "off")]).options(timeouts))
}

/// Opens a pool suited to Courier: [`connect_options`] (JIT off), at most
/// `max_connections` connections.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let options = connect_options(url)?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(map)
}

impl PgStore {
    /// A store over `pool` in the default schema `courier`.
    pub fn new(pool: PgPool) -> Self {
        Self::build(pool, DEFAULT_SCHEMA.to_owned())
    }

    /// A store over `pool` in `schema` (checked against `[a-z_][a-z0-9_]{0,62}`).
    pub fn with_schema(pool: PgPool, schema: &str) -> Result<Self, ValidationError> {
        validate_schema(schema)?;
        Ok(Self::build(pool, schema.to_owned()))
    }

    fn build(pool: PgPool, schema: String) -> Self {
        let queries = Queries::render(&schema);
        Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                queries,
                floors: Floors::default(),
                stream_wakeups: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The same database and pool with claim laps (passes from every
    /// tenant's first entry, see the README's note on long transactions) at
    /// least `spacing` apart, as a held snapshot makes them when laps are
    /// expensive. For tests of what must not wait for a lap; the store's
    /// floors start over.
    #[doc(hidden)]
    #[must_use]
    pub fn with_min_lap_spacing(&self, spacing: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool: self.inner.pool.clone(),
                schema: self.inner.schema.clone(),
                queries: Queries::render(&self.inner.schema),
                floors: Floors::with_min_lap_spacing(spacing),
                stream_wakeups: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The pool the store runs its own work on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding Courier's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Where this store's next claims of `subscription` start each tenant's
    /// scan: deliveries at or below a tenant's floor are only looked at by
    /// full laps (see the README's note on long transactions). For
    /// diagnostics and tests; tenants this store does not know are absent.
    pub fn claim_floors(&self, subscription: &str) -> BTreeMap<String, i64> {
        self.inner.floors.of(subscription)
    }

    /// The NOTIFY channel the fan-out trigger signals on.
    pub fn notify_channel(&self) -> String {
        format!("{}.courier", self.inner.schema)
    }

    /// The schema version in the database (0 before the first migration).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        migrate::current(&self.inner.pool, self.q(), &self.inner.schema).await
    }

    /// Every migration this build ships and every one the schema records,
    /// oldest first, with its state ([`courier_core::MigrationStatus`]):
    /// applied, pending, changed (its recorded checksum is not this
    /// build's: [`courier_core::OutboxStore::migrate`] would refuse), or
    /// unknown (applied by a newer build). Reads only, takes no lock, and
    /// creates nothing: a schema never migrated lists every migration
    /// pending. A migration an older build applied without recording a
    /// checksum reads applied with none recorded; the next migration run
    /// records this build's (trust on first use).
    pub async fn migration_status(&self) -> Result<Vec<courier_core::MigrationStatus>, StoreError> {
        migrate::status(&self.inner.pool, self.q(), &self.inner.schema).await
    }

    /// Applies the migrations up to schema `version` only (a later one is
    /// left for [`courier_core::OutboxStore::migrate`]): for upgrade tests
    /// and for staging an upgrade. This build's queries expect
    /// [`SCHEMA_VERSION`]; run nothing else on a schema held back.
    pub async fn migrate_to(&self, version: i64) -> Result<(), StoreError> {
        migrate::run_to(&self.inner.pool, self.q(), &self.inner.schema, version).await
    }

    /// Whether a connection of this store's pool would JIT-compile Courier's
    /// claims (see [`connect_options`]). Workers on such a pool warn once at
    /// start.
    pub async fn jit_enabled(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar(&self.q().jit_enabled)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)
    }

    /// Enqueues one message on the caller's connection (inside their transaction).
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        message: &NewMessage,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut outcomes = self
            .enqueue_batch(conn, std::slice::from_ref(message))
            .await?;
        outcomes
            .pop()
            .ok_or_else(|| StoreError::Corrupt("enqueue returned no outcome".into()))
    }

    fn q(&self) -> &Queries {
        &self.inner.queries
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The bound arguments of the store's enqueue queries (`enqueue` and
/// `enqueue_plain`, see [`PgStore::query_sql`]) for `messages`, each checked
/// first: one array per column, in the order the queries take them. For
/// tools that run those queries exactly as the store does.
pub fn enqueue_arguments(messages: &[NewMessage]) -> Result<PgArguments, StoreError> {
    let n = messages.len();
    let mut ids = Vec::with_capacity(n);
    let mut tenants = Vec::with_capacity(n);
    let mut topics = Vec::with_capacity(n);
    let mut versions = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut headers = Vec::with_capacity(n);
    let mut ordering_keys = Vec::with_capacity(n);
    let mut idempotency_keys = Vec::with_capacity(n);
    let mut occurred = Vec::with_capacity(n);
    let mut available_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(n);
    let mut delays: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut priorities: Vec<i16> = Vec::with_capacity(n);
    for message in messages {
        message.validate()?;
        ids.push(message.id);
        tenants.push(message.tenant.as_str());
        topics.push(message.topic.as_str());
        versions.push(message.schema_version);
        payloads.push(message.payload.as_str());
        headers.push(message.headers_json());
        ordering_keys.push(message.ordering_key.as_deref());
        idempotency_keys.push(message.idempotency_key.as_deref());
        occurred.push(message.occurred_at);
        let (at, delay) = match message.available {
            Availability::Now => (None, None),
            Availability::At(at) => (Some(at), None),
            Availability::After(delay) => (None, Some(millis(delay))),
        };
        available_at.push(at);
        delays.push(delay);
        priorities.push(message.priority);
    }
    let mut arguments = PgArguments::default();
    let encoded = (|| {
        arguments.add(&ids)?;
        arguments.add(&tenants)?;
        arguments.add(&topics)?;
        arguments.add(&versions)?;
        arguments.add(&payloads)?;
        arguments.add(&headers)?;
        arguments.add(&ordering_keys)?;
        arguments.add(&idempotency_keys)?;
        arguments.add(&occurred)?;
        arguments.add(&available_at)?;
        arguments.add(&delays)?;
        arguments.add(&priorities)
    })();
    encoded.map_err(|error| map(sqlx::Error::Encode(error)))?;
    Ok(arguments)
}
