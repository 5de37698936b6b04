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
mod error;
mod floors;
mod migrate;
mod notifier;
mod queries;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier_core::{
    truncate_chars, Availability, BatchItem, BatchRollback, ClaimBatch, ClaimParams,
    ClaimedDelivery, Completion, DeadLetter, DeadLetterFilter, DeadLetterPage, DeadLetterStore,
    DeliverySummary, EnqueueOutcome, ErrorEntry, Failure, FailureApplied, LeaseRef, NewMessage,
    OutboxStore, PruneReport, Registration, Replay, RescueParams, Snooze, StoreError,
    SubscriptionSpec, TransactionalBatchOutcome, TxWork, ValidationError, MAX_ERROR_CHARS,
    MAX_SNOOZES,
};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::Arguments;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

pub use admin::MAX_MESSAGE_PAGE;
pub use migrate::SCHEMA_VERSION;
pub use notifier::PgNotifier;

use error::map;
use floors::{Claimed, Floors, Found, LaneKey, Pass, Planned, Settled};
use queries::Queries;

/// A turn of no tenant (no tenant has the empty name).
const NO_TENANT: &[String] = &[String::new()];

/// How long a registration tries for the fan-out lock before it queues for it.
const FAN_OUT_TRY_FOR: Duration = Duration::from_secs(2);

/// The longest a registration then waits for producers to let it have the lock.
const FAN_OUT_WAIT_AT_MOST: Duration = Duration::from_secs(30);

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

/// Opens a pool suited to Courier: JIT off (Courier's queries are short, and
/// JIT compilation would cost more than they do).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(map)?;
    let options = options.options([("jit", "off")]);
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
        migrate::current(&self.inner.pool, &self.inner.schema).await
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

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn parse_headers(text: &str) -> Result<BTreeMap<String, String>, StoreError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(StoreError::Corrupt("headers is not a JSON object".into()));
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

fn parse_errors(text: &str) -> Result<Vec<ErrorEntry>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("errors: {e}")))
}

fn claimed_from_row(row: &PgRow, subscription: &str) -> Result<ClaimedDelivery, sqlx::Error> {
    let headers: String = row.try_get("headers")?;
    Ok(ClaimedDelivery {
        delivery_id: row.try_get("id")?,
        message_id: row.try_get("message_id")?,
        subscription: subscription.to_owned(),
        tenant: row.try_get("tenant")?,
        topic: row.try_get("topic")?,
        schema_version: row.try_get("schema_version")?,
        ordering_key: row.try_get("ordering_key")?,
        payload: row.try_get("payload")?,
        headers: parse_headers(&headers).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        attempt: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        lease_token: row.try_get("lease_token")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        occurred_at: row.try_get("occurred_at")?,
        enqueued_at: row.try_get("created_at")?,
    })
}

fn dead_letter_from_row(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let errors: String = row.try_get("errors").map_err(map)?;
    Ok(DeadLetter {
        delivery_id: row.try_get("id").map_err(map)?,
        message_id: row.try_get("message_id").map_err(map)?,
        subscription: row.try_get("subscription").map_err(map)?,
        tenant: row.try_get("tenant").map_err(map)?,
        topic: row.try_get("topic").map_err(map)?,
        schema_version: row.try_get("schema_version").map_err(map)?,
        payload: row.try_get("payload").map_err(map)?,
        attempts: row.try_get("attempts").map_err(map)?,
        errors: parse_errors(&errors)?,
        dead_at: row.try_get("dead_at").map_err(map)?,
        enqueued_at: row.try_get("created_at").map_err(map)?,
    })
}

/// The `(id, dead)` rows fail.sql and snooze.sql return.
fn failures_applied(rows: &[PgRow]) -> Result<Vec<FailureApplied>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok(FailureApplied {
                delivery_id: row.try_get("id")?,
                dead: row.try_get("dead")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(map)
}

fn lease_columns(leases: &[LeaseRef]) -> (Vec<i64>, Vec<Uuid>) {
    leases
        .iter()
        .map(|lease| (lease.delivery_id, lease.lease_token))
        .unzip()
}

/// Splits a topic pattern into (pattern, prefix): exact topics have no prefix,
/// `prefix.*` matches topics starting with `prefix.`, `*` matches every topic.
fn pattern_prefix(pattern: &str) -> Result<Option<String>, ValidationError> {
    if pattern == "*" {
        return Ok(Some(String::new()));
    }
    if let Some(stem) = pattern.strip_suffix(".*") {
        courier_core::validate_name("topics", stem)?;
        return Ok(Some(format!("{stem}.")));
    }
    courier_core::validate_name("topics", pattern)?;
    Ok(None)
}

/// The attempt budget every route shares, if they all share one.
fn uniform_budget(budgets: &[i32]) -> Option<i32> {
    let first = *budgets.first()?;
    budgets.iter().all(|b| *b == first).then_some(first)
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
        arguments.add(&delays)
    })();
    encoded.map_err(|error| map(sqlx::Error::Encode(error)))?;
    Ok(arguments)
}

impl OutboxStore for PgStore {
    type Connection = PgConnection;
    const EXCLUSIVE_TRANSACTIONS: bool = false;

    async fn migrate(&self) -> Result<(), StoreError> {
        migrate::run(&self.inner.pool, &self.inner.schema).await
    }

    async fn enqueue_batch<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        messages: &'c [NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let n = messages.len();
        let arguments = enqueue_arguments(messages)?;
        // Without idempotency keys no row can be a duplicate: the insert
        // without ON CONFLICT, whose rows are not speculative insertions.
        let plain = messages.iter().all(|m| m.idempotency_key.is_none());
        let query = sqlx::query_with(
            if plain {
                &self.q().enqueue_plain
            } else {
                &self.q().enqueue
            },
            arguments,
        );
        let inserted: Vec<Uuid> = if plain {
            let written = query
                .execute(&mut *conn)
                .await
                .map_err(map)?
                .rows_affected();
            if usize::try_from(written).ok() != Some(n) {
                return Err(StoreError::Corrupt(format!(
                    "enqueue wrote {written} of {n} messages"
                )));
            }
            Vec::new()
        } else {
            query
                .fetch_all(&mut *conn)
                .await
                .map_err(map)?
                .iter()
                .map(|row| row.try_get(0))
                .collect::<Result<_, _>>()
                .map_err(map)?
        };
        if plain || inserted.len() == n {
            return Ok(messages
                .iter()
                .map(|m| EnqueueOutcome {
                    id: m.id,
                    duplicate: false,
                })
                .collect());
        }
        // Some were duplicates: find the first message of each skipped key.
        let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
        let (dup_tenants, dup_keys): (Vec<&str>, Vec<&str>) = messages
            .iter()
            .filter(|m| !inserted.contains(&m.id))
            .filter_map(|m| Some((m.tenant.as_str(), m.idempotency_key.as_deref()?)))
            .unzip();
        let rows = sqlx::query(&self.q().find_idempotent)
            .bind(&dup_tenants)
            .bind(&dup_keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(map)?;
        let mut existing: HashMap<(String, String), Uuid> = HashMap::with_capacity(rows.len());
        for row in rows {
            existing.insert(
                (
                    row.try_get("tenant").map_err(map)?,
                    row.try_get("idempotency_key").map_err(map)?,
                ),
                row.try_get("id").map_err(map)?,
            );
        }
        courier_core::enqueue_outcomes(messages, &inserted, &existing)
    }

    async fn publish_batch<'c>(
        &'c self,
        messages: &'c [NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        let outcomes = self.enqueue_batch(&mut tx, messages).await?;
        tx.commit().await.map_err(map)?;
        Ok(outcomes)
    }

    async fn register_subscription<'c>(
        &'c self,
        spec: &'c SubscriptionSpec,
    ) -> Result<Registration, StoreError> {
        courier_core::validate_name("subscription", &spec.name)?;
        let mut patterns = Vec::with_capacity(spec.topics.len());
        let mut prefixes = Vec::with_capacity(spec.topics.len());
        for pattern in &spec.topics {
            prefixes.push(pattern_prefix(pattern)?);
            patterns.push(pattern.as_str());
        }
        let unchanged: bool = sqlx::query_scalar(&self.q().subscription_registered)
            .bind(&spec.name)
            .bind(&patterns)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)?;
        if unchanged {
            // A worker restarting: nothing to change, so no lock to take.
            return Ok(Registration::default());
        }
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        self.lock_fan_out(&mut tx).await?;
        let created = !sqlx::query(&self.q().subscription_upsert)
            .bind(&spec.name)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .is_empty();
        let added = sqlx::query(&self.q().subscription_topics_add)
            .bind(&spec.name)
            .bind(&patterns)
            .bind(&prefixes)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .len();
        sqlx::query(&self.q().fan_out_epoch_bump)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        let replayed = match spec.replay.filter(|_| created) {
            None => 0,
            Some(replay) => {
                let (from_time, from_id) = match replay {
                    Replay::All => (None, Uuid::nil()),
                    Replay::Since(at) => (Some(at), Uuid::nil()),
                    Replay::FromMessage(id) => {
                        let at: Option<DateTime<Utc>> =
                            sqlx::query_scalar(&self.q().message_created_at)
                                .bind(id)
                                .fetch_optional(&mut *tx)
                                .await
                                .map_err(map)?;
                        let at = at.ok_or_else(|| {
                            ValidationError::new(
                                "replay",
                                format!("message {id} is not retained, so there is nothing to replay from"),
                            )
                        })?;
                        (Some(at), id)
                    }
                };
                sqlx::query(&self.q().subscription_replay)
                    .bind(&spec.name)
                    .bind(from_time)
                    .bind(from_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?
                    .rows_affected()
            }
        };
        tx.commit().await.map_err(map)?;
        Ok(Registration {
            created,
            topics_added: u64::try_from(added).unwrap_or(u64::MAX),
            replayed,
        })
    }

    async fn claim<'c>(&'c self, params: &'c ClaimParams) -> Result<ClaimBatch, StoreError> {
        if params.limit == 0 || params.routes.is_empty() {
            return Ok(ClaimBatch {
                deliveries: Vec::new(),
                next_tenant_cursor: params.tenant_cursor.clone(),
            });
        }
        let lane: LaneKey = (
            params.subscription.clone(),
            params
                .routes
                .iter()
                .map(|r| (r.topic.clone(), r.schema_version))
                .collect(),
        );
        let planned = self.inner.floors.plan(
            &lane,
            &params.tenant_cursor,
            params.limit,
            std::time::Instant::now(),
        );
        let batch = match self.claim_pass(params, &lane, &planned).await {
            Ok(batch) => batch,
            Err(error) => {
                self.inner.floors.abandon(&lane, &planned);
                return Err(error);
            }
        };
        // A lap's pass scans after the lap's cursor, not the caller's.
        let elsewhere = planned.cursor(&params.tenant_cursor) != params.tenant_cursor;
        if batch.deliveries.is_empty() && (planned.pass != Pass::Full || elsewhere) {
            // Nothing above the floors, or after the lap's cursor: scan after
            // the caller's cursor from the first entries before reporting
            // that there is nothing (the caller may go idle on it).
            return self.claim_pass(params, &lane, &planned.fallback()).await;
        }
        Ok(batch)
    }

    async fn complete_many<'c>(
        &'c self,
        completions: &'c [Completion],
    ) -> Result<Vec<i64>, StoreError> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, tokens) = lease_columns(completions);
        let done = sqlx::query_scalar(&self.q().complete)
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        self.inner.floors.settled(ids, Settled::Completed);
        Ok(done)
    }

    async fn fail_many<'c>(
        &'c self,
        failures: &'c [Failure],
    ) -> Result<Vec<FailureApplied>, StoreError> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = failures.iter().map(|f| f.lease.delivery_id).collect();
        let tokens: Vec<Uuid> = failures.iter().map(|f| f.lease.lease_token).collect();
        let errors: Vec<&str> = failures
            .iter()
            .map(|f| truncate_chars(&f.error, MAX_ERROR_CHARS))
            .collect();
        let delays: Vec<Option<i64>> = failures.iter().map(|f| f.retry_in.map(millis)).collect();
        let rows = sqlx::query(&self.q().fail)
            .bind(&ids)
            .bind(&tokens)
            .bind(&errors)
            .bind(&delays)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        self.inner.floors.settled(ids, Settled::Returned);
        failures_applied(&rows)
    }

    async fn snooze_many<'c>(
        &'c self,
        snoozes: &'c [Snooze],
    ) -> Result<Vec<FailureApplied>, StoreError> {
        if snoozes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = snoozes.iter().map(|z| z.lease.delivery_id).collect();
        let tokens: Vec<Uuid> = snoozes.iter().map(|z| z.lease.lease_token).collect();
        let delays: Vec<i64> = snoozes.iter().map(|z| millis(z.delay)).collect();
        let reasons: Vec<&str> = snoozes
            .iter()
            .map(|z| truncate_chars(&z.reason, MAX_ERROR_CHARS - 100))
            .collect();
        let rows = sqlx::query(&self.q().snooze)
            .bind(&ids)
            .bind(&tokens)
            .bind(&delays)
            .bind(&reasons)
            .bind(MAX_SNOOZES)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        self.inner.floors.settled(ids, Settled::Returned);
        failures_applied(&rows)
    }

    async fn extend_many<'c>(
        &'c self,
        leases: &'c [LeaseRef],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, tokens) = lease_columns(leases);
        sqlx::query_scalar(&self.q().extend)
            .bind(&ids)
            .bind(&tokens)
            .bind(millis(lease))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)
    }

    async fn release_many<'c>(&'c self, leases: &'c [LeaseRef]) -> Result<Vec<i64>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, tokens) = lease_columns(leases);
        let released = sqlx::query_scalar(&self.q().release)
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        self.inner.floors.settled(ids, Settled::Returned);
        Ok(released)
    }

    async fn rescue_expired<'c>(&'c self, params: &'c RescueParams) -> Result<u64, StoreError> {
        // fetch_all, never fetch_one (see run_transactional_batch): a
        // suspended portal would keep the rescue's row locks until the
        // connection is next used.
        let moved: Vec<i64> = sqlx::query_scalar(&self.q().rescue)
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
            .bind(millis(params.backoff_base) as f64)
            .bind(millis(params.backoff_cap) as f64)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(moved
            .first()
            .and_then(|n| u64::try_from(*n).ok())
            .unwrap_or(0))
    }

    async fn run_transactional_batch<'c>(
        &'c self,
        batch: Vec<(&'c ClaimedDelivery, TxWork<PgConnection>)>,
        isolate_failures: bool,
    ) -> Result<TransactionalBatchOutcome, StoreError> {
        let mut tx = self.inner.pool.begin().await.map_err(map)?;
        let (tenants, subscriptions, message_ids): (Vec<&str>, Vec<&str>, Vec<Uuid>) = batch
            .iter()
            .map(|(d, _)| (d.tenant.as_str(), d.subscription.as_str(), d.message_id))
            .collect();
        let written: std::collections::HashSet<(Uuid, String)> =
            sqlx::query_as(&self.q().receipts_insert_many)
                .bind(&tenants)
                .bind(&subscriptions)
                .bind(&message_ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?
                .into_iter()
                .collect();
        let mut items = Vec::with_capacity(batch.len());
        let mut ids = Vec::with_capacity(batch.len());
        let mut tokens = Vec::with_capacity(batch.len());
        let mut failed_messages: Vec<Uuid> = Vec::new();
        let mut failed_subscriptions: Vec<&str> = Vec::new();
        let mut savepoint_open = false;
        for (index, (delivery, work)) in batch.into_iter().enumerate() {
            let fresh = written.contains(&(delivery.message_id, delivery.subscription.clone()));
            if !fresh {
                ids.push(delivery.delivery_id);
                tokens.push(delivery.lease_token);
                items.push(BatchItem::AlreadyApplied);
                continue;
            }
            if isolate_failures {
                // One round trip per delivery: the previous savepoint is
                // released and the next one taken in the same message.
                let sql = if savepoint_open {
                    "RELEASE SAVEPOINT courier_item; SAVEPOINT courier_item"
                } else {
                    "SAVEPOINT courier_item"
                };
                // A plain string runs as a simple query: two statements, one message.
                sqlx::Executor::execute(&mut *tx, sql).await.map_err(map)?;
                savepoint_open = true;
            }
            match work(&mut tx).await {
                Ok(()) => {
                    ids.push(delivery.delivery_id);
                    tokens.push(delivery.lease_token);
                    items.push(BatchItem::Applied);
                }
                Err(error) if isolate_failures => {
                    sqlx::Executor::execute(&mut *tx, "ROLLBACK TO SAVEPOINT courier_item")
                        .await
                        .map_err(map)?;
                    failed_messages.push(delivery.message_id);
                    failed_subscriptions.push(delivery.subscription.as_str());
                    items.push(BatchItem::Failed(error));
                }
                Err(error) => {
                    tx.rollback().await.map_err(map)?;
                    return Ok(TransactionalBatchOutcome::RolledBack(
                        BatchRollback::HandlerFailed { index, error },
                    ));
                }
            }
        }
        if !failed_messages.is_empty() {
            sqlx::query(&self.q().receipts_delete_many)
                .bind(&failed_messages)
                .bind(&failed_subscriptions)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
        }
        if !ids.is_empty() {
            // fetch_all, never fetch_one, for a statement that writes: sqlx reads
            // one row with a row limit, which leaves the portal suspended and the
            // statement's implicit transaction open until the connection is next used.
            let completed: Vec<i64> = sqlx::query_scalar(&self.q().complete_leased)
                .bind(&ids)
                .bind(&tokens)
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?;
            if completed.first().and_then(|n| usize::try_from(*n).ok()) != Some(ids.len()) {
                tx.rollback().await.map_err(map)?;
                return Ok(TransactionalBatchOutcome::RolledBack(
                    BatchRollback::LeaseLost,
                ));
            }
        }
        tx.commit().await.map_err(map)?;
        self.inner.floors.settled(ids, Settled::Completed);
        Ok(TransactionalBatchOutcome::Committed(items))
    }

    async fn announce_idle<'c>(
        &'c self,
        subscription: &'c str,
        worker_id: &'c str,
        idle: bool,
    ) -> Result<bool, StoreError> {
        if idle {
            // The claim after an announcement must see every ready delivery.
            self.inner
                .floors
                .need_full_pass(subscription, std::time::Instant::now());
        }
        let sql = if idle {
            &self.q().idle_announce
        } else {
            &self.q().idle_withdraw
        };
        sqlx::query(sql)
            .bind(subscription)
            .bind(worker_id)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(true)
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<PruneReport, StoreError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let receipts = sqlx::query(&self.q().prune_receipts)
            .bind(millis(older_than))
            .bind(batch)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected();
        let messages = sqlx::query(&self.q().prune_messages)
            .bind(millis(older_than))
            .bind(batch)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected();
        Ok(PruneReport { messages, receipts })
    }

    async fn lead_maintenance<'c>(
        &'c self,
        holder: &'c str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let rows = sqlx::query(&self.q().leader_elect)
            .bind(holder)
            .bind(millis(lease))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(!rows.is_empty())
    }

    async fn resign_maintenance<'c>(&'c self, holder: &'c str) -> Result<(), StoreError> {
        sqlx::query(&self.q().leader_resign)
            .bind(holder)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(())
    }
}

impl DeadLetterStore for PgStore {
    async fn list_dead_letters<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<DeadLetterPage, StoreError> {
        let limit = i64::try_from(limit.clamp(1, 1000)).unwrap_or(1000);
        let rows = sqlx::query(&self.q().dead_letters_list)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(after.unwrap_or(0))
            .bind(limit + 1)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = rows
            .iter()
            .map(dead_letter_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > usize::try_from(limit).unwrap_or(usize::MAX) {
            items.pop();
            items.last().map(|d| d.delivery_id)
        } else {
            None
        };
        Ok(DeadLetterPage { items, next_cursor })
    }

    async fn get_dead_letter(&self, delivery_id: i64) -> Result<Option<DeadLetter>, StoreError> {
        let row = sqlx::query(&self.q().dead_letter_get)
            .bind(delivery_id)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        row.as_ref().map(dead_letter_from_row).transpose()
    }

    async fn retry_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_retry,
            Some(ids),
            &DeadLetterFilter::default(),
        )
        .await
    }

    async fn retry_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        self.select_dead_letters(&self.q().dead_letters_retry, None, filter)
            .await
    }

    async fn discard_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_discard,
            Some(ids),
            &DeadLetterFilter::default(),
        )
        .await
    }

    async fn discard_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        self.select_dead_letters(&self.q().dead_letters_discard, None, filter)
            .await
    }

    async fn message_deliveries(
        &self,
        message_id: Uuid,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        let rows = sqlx::query(&self.q().message_deliveries)
            .bind(message_id)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        rows.iter()
            .map(|row| {
                let errors: String = row.try_get("errors").map_err(map)?;
                Ok(DeliverySummary {
                    subscription: row.try_get("subscription").map_err(map)?,
                    state: row.try_get("state").map_err(map)?,
                    attempts: row
                        .try_get::<Option<i32>, _>("attempts")
                        .map_err(map)?
                        .unwrap_or(0),
                    errors: parse_errors(&errors)?,
                })
            })
            .collect()
    }
}

impl PgStore {
    /// Takes the fan-out lock exclusively in `tx` (see fan_out_lock_try.sql):
    /// tries for up to [`FAN_OUT_TRY_FOR`] without queueing ahead of
    /// producers, then waits for it, at most [`FAN_OUT_WAIT_AT_MOST`].
    pub(crate) async fn lock_fan_out(&self, tx: &mut PgConnection) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        while started.elapsed() < FAN_OUT_TRY_FOR {
            let taken: bool = sqlx::query_scalar(&self.q().fan_out_lock_try)
                .fetch_one(&mut *tx)
                .await
                .map_err(map)?;
            if taken {
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        // Producers kept it busy all along: queue for it, bounded.
        sqlx::query(&self.q().lock_timeout_set)
            .bind(format!("{}ms", FAN_OUT_WAIT_AT_MOST.as_millis()))
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        sqlx::query(&self.q().fan_out_lock)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        Ok(())
    }

    /// The claim statement for `planned`, serving `given` tenants above
    /// `floors` (none: discover tenants after the cursor).
    fn claim_query<'q>(
        &'q self,
        params: &'q ClaimParams,
        planned: &'q Planned,
        limit: i32,
        in_flight_limit: Option<i32>,
        given: &'q [String],
        floors: &'q [i64],
    ) -> sqlx::query::Query<'q, sqlx::Postgres, PgArguments> {
        let topics: Vec<&str> = params.routes.iter().map(|r| r.topic.as_str()).collect();
        let versions: Vec<i32> = params.routes.iter().map(|r| r.schema_version).collect();
        let budgets: Vec<i32> = params.routes.iter().map(|r| r.max_attempts).collect();
        let uniform = uniform_budget(&budgets);
        sqlx::query(&self.q().claim)
            .bind(&params.subscription)
            .bind(planned.cursor(&params.tenant_cursor))
            .bind(limit)
            .bind(limit)
            .bind(topics)
            .bind(versions)
            .bind(budgets)
            .bind(in_flight_limit)
            .bind(millis(params.lease))
            .bind(&params.worker_id)
            .bind(Uuid::new_v4())
            .bind(uniform)
            .bind(given)
            .bind(floors)
            .bind(match planned.pass {
                Pass::Full => 0,
                Pass::Floor { .. } => planned.discover_above,
            })
    }

    /// One claim statement, scanning as `pass` says; records what it found
    /// in the lane's floors.
    async fn claim_pass(
        &self,
        params: &ClaimParams,
        lane: &LaneKey,
        planned: &Planned,
    ) -> Result<ClaimBatch, StoreError> {
        let pass = &planned.pass;
        let limit = i32::try_from(params.limit).unwrap_or(i32::MAX);
        let in_flight_limit = params
            .tenant_in_flight_limit
            .map(|l| i32::try_from(l).unwrap_or(i32::MAX));
        let started = std::time::Instant::now();
        let (given, floors): (&[String], &[i64]) = match pass {
            Pass::Full => (&[], &[]),
            Pass::Floor {
                tenants, floors, ..
            } => (tenants, floors),
        };
        let rows = match in_flight_limit {
            None => self
                .claim_query(params, planned, limit, in_flight_limit, given, floors)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(map)?,
            Some(_) => {
                // Exact per-tenant counts: take the locks of the tenants this
                // claim serves first (see claim_in_flight_lock.sql), then
                // claim for exactly those tenants under a fresh snapshot.
                let mut tx = self.inner.pool.begin().await.map_err(map)?;
                let locked: Vec<String> = sqlx::query_scalar(&self.q().claim_in_flight_lock)
                    .bind(&params.subscription)
                    .bind(planned.cursor(&params.tenant_cursor))
                    .bind(given)
                    .bind(limit)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(map)?;
                let zeros;
                let (given, floors): (&[String], &[i64]) = match pass {
                    Pass::Floor { .. } => (given, floors),
                    // No tenant has the empty name: a turn of none.
                    Pass::Full if locked.is_empty() => (NO_TENANT, &[0]),
                    Pass::Full => {
                        zeros = vec![0; locked.len()];
                        (&locked, &zeros)
                    }
                };
                let rows = self
                    .claim_query(params, planned, limit, in_flight_limit, given, floors)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(map)?;
                tx.commit().await.map_err(map)?;
                rows
            }
        };
        let took = started.elapsed();
        let mut turn: Vec<String> = Vec::new();
        let mut turn_was_full = false;
        let mut last_tenant = String::new();
        let mut max_id = 0;
        let mut discovered: Vec<String> = Vec::new();
        if let Some(first) = rows.first() {
            max_id = first.try_get("max_id").map_err(map)?;
            discovered = first.try_get("discovered").map_err(map)?;
            let tenants_in_turn: i32 = first.try_get("tenants_in_turn").map_err(map)?;
            turn = first.try_get("turn_tenants").map_err(map)?;
            // A full turn means more tenants may wait after the last one served.
            turn_was_full = usize::try_from(tenants_in_turn).unwrap_or(0) >= params.limit;
            last_tenant = first
                .try_get::<Option<String>, _>("last_tenant")
                .map_err(map)?
                .unwrap_or_default();
        }
        let next_tenant_cursor = match pass {
            Pass::Floor { next_cursor, .. } => next_cursor.clone(),
            Pass::Full if turn_was_full => last_tenant.clone(),
            Pass::Full => String::new(),
        };
        let deliveries = rows
            .iter()
            .filter(|row| matches!(row.try_get::<Option<i64>, _>("id"), Ok(Some(_))))
            .map(|row| claimed_from_row(row, &params.subscription))
            .collect::<Result<Vec<_>, _>>()
            .map_err(map)?;
        let seen: Vec<Claimed<'_>> = deliveries
            .iter()
            .map(|d| Claimed {
                id: d.delivery_id,
                tenant: &d.tenant,
                ordered: d.ordering_key.is_some(),
            })
            .collect();
        self.inner.floors.record(
            lane,
            planned,
            &Found {
                cursor: planned.cursor(&params.tenant_cursor),
                last_tenant: &last_tenant,
                turn: &turn,
                turn_was_full,
                claimed: &seen,
                started,
                took,
                max_id,
                discovered: &discovered,
            },
        );
        Ok(ClaimBatch {
            deliveries,
            next_tenant_cursor,
        })
    }

    async fn select_dead_letters(
        &self,
        sql: &str,
        ids: Option<&[i64]>,
        filter: &DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        let result = sqlx::query(sql)
            .bind(ids)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(result.rows_affected())
    }
}
