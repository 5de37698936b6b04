//! [`OutboxStore`] for SQLite: enqueue, claim and settle deliveries.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use courier_core::{
    error_fingerprint, lease_expired_fingerprint, truncate_chars, validate_name, Availability,
    BatchItem, BatchRollback, ClaimBatch, ClaimParams, ClaimedDelivery, Completion, EnqueueOutcome,
    ErrorKind, Extended, Failure, FailureApplied, LeaseRef, NewMessage, OutboxStore, PruneReport,
    Registration, Replay, RescueParams, Snooze, StoreError, SubscriptionSpec,
    TransactionalBatchOutcome, TransactionalOutcome, TxWork, ValidationError, MAX_ERROR_CHARS,
    MAX_SNOOZES,
};
use serde_json::{json, Value};
use sqlx::{Connection, SqliteConnection};
use uuid::Uuid;

use crate::error::map;
use crate::rows::{self, get};
use crate::{migrate, millis, queries, SqliteStore};

/// The most bound parameters one SQLite statement takes (`SQLITE_MAX_VARIABLE_NUMBER`
/// in the bundled build).
const MAX_BOUND_PARAMETERS: usize = 32_766;

/// Messages per enqueue statement; a larger batch is split, inside a savepoint
/// so that it stays all or nothing.
const ENQUEUE_ROWS_PER_STATEMENT: usize = MAX_BOUND_PARAMETERS / queries::ENQUEUE_PARAMS_PER_ROW;

/// The most tenants one claim serves. A turn with more tenants than this is
/// cut here and the cursor continues after the last one; it keeps the claim
/// statement's parameters and compound terms well inside SQLite's limits.
pub const MAX_TENANTS_PER_TURN: usize = 1000;

/// `[delivery id, lease token]` pairs as the JSON array the settle queries read.
fn leases_json(leases: impl Iterator<Item = (i64, Uuid)>) -> String {
    Value::Array(
        leases
            .map(|(delivery_id, lease_token)| json!([delivery_id, lease_token.to_string()]))
            .collect(),
    )
    .to_string()
}

/// [`leases_json`] of lease references.
fn lease_refs_json<'a>(leases: impl Iterator<Item = &'a LeaseRef>) -> String {
    leases_json(leases.map(|l| (l.delivery_id, l.lease_token)))
}

/// Keeps `ids` in the order of `requested` (the caller's order), once each.
fn in_request_order(requested: impl Iterator<Item = i64>, applied: &HashSet<i64>) -> Vec<i64> {
    let mut seen = HashSet::new();
    requested
        .filter(|id| applied.contains(id) && seen.insert(*id))
        .collect()
}

/// The `(id, dead)` rows fail.sql and snooze.sql return, in the order of
/// `requested` (the caller's), once each.
fn failures_applied(
    requested: impl Iterator<Item = i64>,
    rows: &[sqlx::sqlite::SqliteRow],
) -> Result<Vec<FailureApplied>, StoreError> {
    let mut dead_by_id = HashMap::with_capacity(rows.len());
    for row in rows {
        dead_by_id.insert(get::<i64>(row, "id")?, get::<i64>(row, "dead")? != 0);
    }
    let applied: HashSet<i64> = dead_by_id.keys().copied().collect();
    Ok(in_request_order(requested, &applied)
        .into_iter()
        .map(|delivery_id| FailureApplied {
            delivery_id,
            dead: dead_by_id.get(&delivery_id).copied().unwrap_or(false),
        })
        .collect())
}

/// Splits a topic pattern into (pattern, prefix): exact topics have no prefix,
/// `stem.*` matches topics starting with `stem.`, `*` matches every topic.
/// Holds `tx` (and its write lock) until the database clock reads at least
/// `at` ms: at most a millisecond or two. A registration or removal stamped
/// with the millisecond after it took the lock then commits only once every
/// later message is at least as late.
pub(crate) async fn wait_for_clock(conn: &mut SqliteConnection, at: i64) -> Result<(), StoreError> {
    while sqlx::query_scalar::<_, i64>(queries::CLOCK_MS)
        .fetch_one(&mut *conn)
        .await
        .map_err(map)?
        < at
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

fn pattern_prefix(pattern: &str) -> Result<Option<String>, ValidationError> {
    if pattern == "*" {
        return Ok(Some(String::new()));
    }
    if let Some(stem) = pattern.strip_suffix(".*") {
        validate_name("topics", stem)?;
        return Ok(Some(format!("{stem}.")));
    }
    validate_name("topics", pattern)?;
    Ok(None)
}

/// `total` split over `parts` as evenly as it goes: each part gets
/// `total / parts`, and the remainder goes one each to the parts from a
/// random one on (so no part is favoured claim after claim). The parts add
/// up to `total`.
fn even_split(total: i64, parts: usize) -> impl Iterator<Item = i64> {
    let k = i64::try_from(parts.max(1)).unwrap_or(i64::MAX);
    let each = total.max(0) / k;
    let extra = total.max(0) % k;
    let random = Uuid::new_v4().as_u128() % u128::try_from(k).unwrap_or(1);
    let offset = i64::try_from(random).unwrap_or(0);
    (0..k).map(move |i| each + i64::from((i + offset) % k < extra))
}

/// Claims up to each tenant's quota of ready deliveries in one statement
/// (claim.sql with at least `pieces` pieces: one per tenant, the others
/// naming no tenant and taking 0), inside the claim's transaction.
async fn claim_quotas(
    tx: &mut SqliteConnection,
    params: &ClaimParams,
    routes: &str,
    quotas: &[(&str, i64)],
    pieces: usize,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let pieces = pieces.max(quotas.len());
    let sql = queries::claim(pieces);
    let mut query = sqlx::query(&sql)
        .bind(&params.subscription)
        .bind(routes)
        .bind(millis(params.lease))
        .bind(&params.worker_id);
    for (tenant, quota) in quotas {
        query = query.bind(*tenant).bind(*quota);
    }
    for _ in quotas.len()..pieces {
        query = query.bind("").bind(0_i64);
    }
    let rows = query.fetch_all(&mut *tx).await.map_err(map)?;
    let mut deliveries = Vec::with_capacity(rows.len());
    for row in &rows {
        if let Some(delivery) = rows::claimed(row, &params.subscription)? {
            deliveries.push(delivery);
        }
    }
    Ok(deliveries)
}

impl SqliteStore {
    /// Inserts `messages` (already validated) in one statement; returns the
    /// ids actually inserted.
    async fn insert_messages(
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
    ) -> Result<HashSet<Uuid>, StoreError> {
        let sql = queries::enqueue(messages.len());
        let mut query = sqlx::query(&sql);
        for message in messages {
            let (available_at, delay) = match message.available {
                Availability::Now => (None, None),
                Availability::At(at) => (Some(at.timestamp_millis()), None),
                Availability::After(delay) => (None, Some(millis(delay))),
            };
            query = query
                .bind(message.id.to_string())
                .bind(message.tenant.as_str())
                .bind(message.topic.as_str())
                .bind(message.schema_version)
                .bind(message.payload.as_str())
                .bind(message.headers_json())
                .bind(message.ordering_key.as_deref())
                .bind(message.idempotency_key.as_deref())
                .bind(message.occurred_at.timestamp_millis())
                .bind(available_at)
                .bind(delay)
                .bind(message.priority);
        }
        let returned = query.fetch_all(&mut *conn).await.map_err(map)?;
        returned.iter().map(|row| rows::uuid(row, "id")).collect()
    }
}

impl OutboxStore for SqliteStore {
    type Connection = SqliteConnection;
    const EXCLUSIVE_TRANSACTIONS: bool = true;

    async fn migrate(&self) -> Result<(), StoreError> {
        migrate::run(&self.inner.pool).await
    }

    async fn enqueue_batch<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        messages: &'c [NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        for message in messages {
            message.validate()?;
        }
        let inserted = if messages.len() <= ENQUEUE_ROWS_PER_STATEMENT {
            Self::insert_messages(conn, messages).await?
        } else {
            // More rows than one statement can bind: a savepoint (or, outside a
            // transaction, a transaction) keeps the batch all or nothing.
            let mut tx = conn.begin().await.map_err(map)?;
            let mut inserted = HashSet::with_capacity(messages.len());
            for chunk in messages.chunks(ENQUEUE_ROWS_PER_STATEMENT) {
                inserted.extend(Self::insert_messages(&mut tx, chunk).await?);
            }
            tx.commit().await.map_err(map)?;
            inserted
        };
        self.wake();
        if inserted.len() == messages.len() {
            return Ok(messages
                .iter()
                .map(|m| EnqueueOutcome {
                    id: m.id,
                    duplicate: false,
                })
                .collect());
        }
        // Some were duplicates: find the first message of each skipped key.
        let keys: Vec<Value> = messages
            .iter()
            .filter(|m| !inserted.contains(&m.id))
            .filter_map(|m| Some(json!([m.tenant, m.idempotency_key.as_deref()?])))
            .collect();
        let rows = sqlx::query(queries::FIND_IDEMPOTENT)
            .bind(Value::Array(keys).to_string())
            .fetch_all(&mut *conn)
            .await
            .map_err(map)?;
        let mut existing: HashMap<(String, String), Uuid> = HashMap::with_capacity(rows.len());
        for row in &rows {
            existing.insert(
                (get(row, "tenant")?, get(row, "idempotency_key")?),
                rows::uuid(row, "id")?,
            );
        }
        courier_core::enqueue_outcomes(messages, &inserted, &existing)
    }

    async fn publish_batch<'c>(
        &'c self,
        messages: &'c [NewMessage],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        let outcomes = self.enqueue_batch(&mut tx, messages).await?;
        tx.commit().await.map_err(map)?;
        // Again after the commit: the bump inside enqueue_batch may have woken
        // a worker before the messages were visible.
        self.wake();
        Ok(outcomes)
    }

    async fn register_subscription<'c>(
        &'c self,
        spec: &'c SubscriptionSpec,
    ) -> Result<Registration, StoreError> {
        let _turn = self.write_turn().await?;
        validate_name("subscription", &spec.name)?;
        let mut topics = Vec::with_capacity(spec.topics.len());
        for pattern in &spec.topics {
            topics.push(json!([pattern, pattern_prefix(pattern)?]));
        }
        // One writer at a time: producers commit wholly before or after this.
        let mut tx = self.begin().await?;
        // Messages enqueued before this took the write lock have an earlier
        // millisecond than `since`; those after its commit (which waits for
        // `since`, below) one at least as late: the admin views read which
        // messages the new patterns receive by it.
        let locked_at: i64 = sqlx::query_scalar(queries::CLOCK_MS)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let since = locked_at.saturating_add(1);
        let created = !sqlx::query(queries::SUBSCRIPTION_UPSERT)
            .bind(&spec.name)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .is_empty();
        let added = sqlx::query(queries::SUBSCRIPTION_TOPICS_ADD)
            .bind(&spec.name)
            .bind(Value::Array(topics).to_string())
            .bind(since)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .len();
        let replayed = match spec.replay.filter(|_| created) {
            None => 0,
            Some(replay) => {
                let (from_time, from_id) = match replay {
                    Replay::All => (None, String::new()),
                    Replay::Since(at) => (Some(at.timestamp_millis()), String::new()),
                    Replay::FromMessage(id) => {
                        let id = id.to_string();
                        let at: Option<i64> = sqlx::query_scalar(queries::MESSAGE_CREATED_AT)
                            .bind(&id)
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
                let replayed = sqlx::query(queries::SUBSCRIPTION_REPLAY)
                    .bind(&spec.name)
                    .bind(from_time)
                    .bind(&from_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?
                    .rows_affected();
                sqlx::query(queries::SUBSCRIPTION_TOPICS_SINCE)
                    .bind(&spec.name)
                    .bind(from_time)
                    .bind(&from_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                replayed
            }
        };
        if added > 0 {
            wait_for_clock(&mut tx, since).await?;
        }
        tx.commit().await.map_err(map)?;
        if replayed > 0 {
            self.wake();
        }
        Ok(Registration {
            created,
            topics_added: u64::try_from(added).unwrap_or(u64::MAX),
            replayed,
        })
    }

    async fn claim<'c>(&'c self, params: &'c ClaimParams) -> Result<ClaimBatch, StoreError> {
        let _turn = self.write_turn().await?;
        if params.limit == 0 || params.routes.is_empty() {
            return Ok(ClaimBatch {
                deliveries: Vec::new(),
                next_tenant_cursor: params.tenant_cursor.clone(),
            });
        }
        let turn_size = params.limit.min(MAX_TENANTS_PER_TURN);
        let routes = Value::Array(
            params
                .routes
                .iter()
                .map(|r| json!([r.topic, r.schema_version, r.max_attempts]))
                .collect(),
        )
        .to_string();

        let mut tx = self.begin().await?;
        let tenant_rows = sqlx::query(queries::CLAIM_TENANTS)
            .bind(&params.subscription)
            .bind(&params.tenant_cursor)
            .bind(i64::try_from(turn_size).unwrap_or(i64::MAX))
            .bind(params.tenant_in_flight_limit.is_some())
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let mut turn: Vec<(String, i64)> = Vec::with_capacity(tenant_rows.len());
        let mut tokens: HashMap<String, i64> = HashMap::new();
        for row in &tenant_rows {
            let tenant: String = get(row, "tenant")?;
            if let Some(left) = get::<Option<i64>>(row, "tokens")? {
                tokens.insert(tenant.clone(), left);
            }
            turn.push((tenant, get(row, "running")?));
        }
        // A full turn means more tenants may wait after the last one in it. The
        // cursor moves on even when nothing was claimed from this turn (routes
        // or in-flight limits), so tenants later in byte order are not starved.
        let next_tenant_cursor = match turn.last() {
            Some((last, _)) if turn.len() >= turn_size => last.clone(),
            _ => String::new(),
        };
        // What each tenant may take at most: its in-flight room and its
        // whole tokens (None: no bound).
        let bounds: Vec<(&str, Option<i64>)> = turn
            .iter()
            .map(|(tenant, running)| {
                let room = params
                    .tenant_in_flight_limit
                    .map(|limit| (i64::from(limit) - running).max(0));
                let bound = match (room, tokens.get(tenant)) {
                    (Some(room), Some(left)) => Some(room.min(*left)),
                    (room, left) => room.or(left.copied()),
                };
                (tenant.as_str(), bound)
            })
            .collect();
        // First an equal share each, at most its bound; then what tenants
        // with less ready work left of their shares goes to the tenants that
        // took their whole share. (The split's remainder is not handed out:
        // claims of 100 instead of 128 over 50 backlogged tenants drained
        // them faster in `courier bench`.)
        let share = (params.limit / bounds.len().max(1)).max(1);
        let share = i64::try_from(share).unwrap_or(i64::MAX);
        let quota_of = |bound: Option<i64>| bound.map_or(share, |b| share.min(b));
        let quotas: Vec<(&str, i64)> = bounds
            .iter()
            .map(|(tenant, bound)| (*tenant, quota_of(*bound)))
            .filter(|(_, quota)| *quota > 0)
            .collect();
        if quotas.is_empty() {
            tx.commit().await.map_err(map)?;
            return Ok(ClaimBatch {
                deliveries: Vec::new(),
                next_tenant_cursor,
            });
        }
        // The statement is prepared and cached per connection for each number
        // of tenant pieces; rounding that number up to a power of two (the
        // extra pieces name no tenant and take 0) keeps a handful of variants
        // instead of one per turn size: with 50 tenants the cached variants
        // had grown the process by tens of MB. The top-up uses the same
        // variant, so it adds none.
        let pieces = quotas.len().next_power_of_two();
        let mut deliveries = claim_quotas(&mut tx, params, &routes, &quotas, pieces).await?;
        // The shares less what they took: what tenants short of ready work or
        // at their bound left.
        let shares = share.saturating_mul(i64::try_from(bounds.len()).unwrap_or(i64::MAX));
        let spare = shares - i64::try_from(deliveries.len()).unwrap_or(i64::MAX);
        if spare > 0 {
            let mut got: HashMap<&str, i64> = HashMap::new();
            for delivery in &deliveries {
                *got.entry(delivery.tenant.as_str()).or_insert(0) += 1;
            }
            // The tenants that took their whole share and may take more.
            let wanting: Vec<(&str, i64)> = bounds
                .iter()
                .filter_map(|(tenant, bound)| {
                    let quota = quota_of(*bound);
                    let taken = got.get(tenant).copied().unwrap_or(0);
                    let room = bound.map_or(i64::MAX, |b| b - taken);
                    (quota > 0 && taken == quota && room > 0).then_some((*tenant, room))
                })
                .collect();
            let more: Vec<(&str, i64)> = wanting
                .iter()
                .zip(even_split(spare, wanting.len()))
                .map(|((tenant, room), share)| (*tenant, share.min(*room)))
                .filter(|(_, quota)| *quota > 0)
                .collect();
            if !more.is_empty() {
                deliveries.extend(claim_quotas(&mut tx, params, &routes, &more, pieces).await?);
            }
        }
        if !tokens.is_empty() {
            let mut spent: HashMap<&str, i64> = HashMap::new();
            for delivery in &deliveries {
                if tokens.contains_key(&delivery.tenant) {
                    *spent.entry(delivery.tenant.as_str()).or_insert(0) += 1;
                }
            }
            for (tenant, n) in spent {
                sqlx::query(queries::TENANT_RATE_SPEND)
                    .bind(&params.subscription)
                    .bind(tenant)
                    .bind(n)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
            }
        }
        tx.commit().await.map_err(map)?;

        deliveries.sort_by_key(|d: &ClaimedDelivery| d.delivery_id);
        Ok(ClaimBatch {
            deliveries,
            next_tenant_cursor,
        })
    }

    async fn complete_many<'c>(
        &'c self,
        completions: &'c [Completion],
    ) -> Result<Vec<i64>, StoreError> {
        let _turn = self.write_turn().await?;
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(queries::COMPLETE)
            .bind(lease_refs_json(completions.iter()))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut applied = HashSet::with_capacity(rows.len());
        for row in &rows {
            applied.insert(get::<i64>(row, "id")?);
        }
        Ok(in_request_order(
            completions.iter().map(|c| c.delivery_id),
            &applied,
        ))
    }

    async fn fail_many<'c>(
        &'c self,
        failures: &'c [Failure],
    ) -> Result<Vec<FailureApplied>, StoreError> {
        let _turn = self.write_turn().await?;
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        let items = Value::Array(
            failures
                .iter()
                .map(|f| {
                    let error = truncate_chars(&f.error, MAX_ERROR_CHARS);
                    json!([
                        f.lease.delivery_id,
                        f.lease.lease_token.to_string(),
                        error,
                        f.retry_in.map(millis),
                        error_fingerprint(f.kind, error),
                    ])
                })
                .collect(),
        )
        .to_string();
        let rows = sqlx::query(queries::FAIL)
            .bind(items)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        failures_applied(failures.iter().map(|f| f.lease.delivery_id), &rows)
    }

    async fn snooze_many<'c>(
        &'c self,
        snoozes: &'c [Snooze],
    ) -> Result<Vec<FailureApplied>, StoreError> {
        let _turn = self.write_turn().await?;
        if snoozes.is_empty() {
            return Ok(Vec::new());
        }
        let items = Value::Array(
            snoozes
                .iter()
                .map(|z| {
                    let reason = truncate_chars(&z.reason, MAX_ERROR_CHARS - 100);
                    json!([
                        z.lease.delivery_id,
                        z.lease.lease_token.to_string(),
                        millis(z.delay),
                        reason,
                        error_fingerprint(ErrorKind::Snooze, reason),
                    ])
                })
                .collect(),
        )
        .to_string();
        let rows = sqlx::query(queries::SNOOZE)
            .bind(items)
            .bind(MAX_SNOOZES)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        failures_applied(snoozes.iter().map(|z| z.lease.delivery_id), &rows)
    }

    async fn extend_many<'c>(
        &'c self,
        leases: &'c [LeaseRef],
        lease: Duration,
    ) -> Result<Extended, StoreError> {
        let _turn = self.write_turn().await?;
        if leases.is_empty() {
            return Ok(Extended::default());
        }
        let ids: Vec<i64> = sqlx::query_scalar(queries::EXTEND)
            .bind(lease_refs_json(leases.iter()))
            .bind(millis(lease))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let applied: std::collections::HashSet<i64> = ids.into_iter().collect();
        let extended = in_request_order(leases.iter().map(|l| l.delivery_id), &applied);
        let missed: Vec<i64> = leases
            .iter()
            .map(|l| l.delivery_id)
            .filter(|id| !applied.contains(id))
            .collect();
        if missed.is_empty() {
            return Ok(Extended {
                extended,
                gone: Vec::new(),
            });
        }
        // The extension waited its turn behind the write that may have
        // completed these: the ones no longer stored are gone, not lost.
        let present: std::collections::HashSet<i64> =
            sqlx::query_scalar(queries::DELIVERIES_PRESENT)
                .bind(serde_json::Value::from(missed.clone()).to_string())
                .fetch_all(&self.inner.pool)
                .await
                .map_err(map)?
                .into_iter()
                .collect();
        Ok(Extended {
            extended,
            gone: missed
                .into_iter()
                .filter(|id| !present.contains(id))
                .collect(),
        })
    }

    async fn release_many<'c>(&'c self, leases: &'c [LeaseRef]) -> Result<Vec<i64>, StoreError> {
        let _turn = self.write_turn().await?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = sqlx::query_scalar(queries::RELEASE)
            .bind(lease_refs_json(leases.iter()))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let applied = ids.into_iter().collect();
        Ok(in_request_order(
            leases.iter().map(|l| l.delivery_id),
            &applied,
        ))
    }

    async fn rescue_expired<'c>(&'c self, params: &'c RescueParams) -> Result<u64, StoreError> {
        let _turn = self.write_turn().await?;
        let result = sqlx::query(queries::RESCUE)
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
            .bind(millis(params.backoff_base))
            .bind(millis(params.backoff_cap))
            .bind(lease_expired_fingerprint())
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(result.rows_affected())
    }

    async fn run_transactional<'c>(
        &'c self,
        delivery: &'c ClaimedDelivery,
        work: TxWork<SqliteConnection>,
    ) -> Result<TransactionalOutcome, StoreError> {
        let outcome = self
            .run_transactional_batch(vec![(delivery, work)], false)
            .await?;
        Ok(courier_core::single_transactional_outcome(outcome))
    }

    async fn run_transactional_batch<'c>(
        &'c self,
        batch: Vec<(&'c ClaimedDelivery, TxWork<SqliteConnection>)>,
        isolate_failures: bool,
    ) -> Result<TransactionalBatchOutcome, StoreError> {
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        // Each statement is a hand-off to sqlx's SQLite thread, made while
        // this transaction holds the database's only write lock: the group's
        // own statements are one per group (lease check, receipts,
        // completions), so only the handlers' statements are per message.
        //
        // Every lease is checked before any work runs: from here to commit
        // this transaction holds the write lock, so nobody can take one over.
        let leases = leases_json(batch.iter().map(|(d, _)| (d.delivery_id, d.lease_token)));
        let held: i64 = sqlx::query_scalar(queries::LEASE_CHECK_MANY)
            .bind(&leases)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        if usize::try_from(held).ok() != Some(batch.len()) {
            tx.rollback().await.map_err(map)?;
            return Ok(TransactionalBatchOutcome::RolledBack(
                BatchRollback::LeaseLost,
            ));
        }
        let receipts = Value::Array(
            batch
                .iter()
                .map(|(d, _)| json!([d.tenant, d.subscription, d.message_id.to_string()]))
                .collect(),
        )
        .to_string();
        let inserted = sqlx::query(queries::RECEIPTS_INSERT_MANY)
            .bind(receipts)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let mut fresh = HashSet::with_capacity(inserted.len());
        for row in &inserted {
            fresh.insert((
                get::<String>(row, "message_id")?,
                get::<String>(row, "subscription")?,
            ));
        }
        let mut items = Vec::with_capacity(batch.len());
        let mut done = Vec::with_capacity(batch.len());
        for (index, (delivery, work)) in batch.into_iter().enumerate() {
            let message_id = delivery.message_id.to_string();
            if !fresh.contains(&(message_id, delivery.subscription.clone())) {
                items.push(BatchItem::AlreadyApplied);
                done.push(delivery);
                continue;
            }
            // Savepoints cost two more hand-offs a message: taken only when
            // the caller asks for failures to be isolated.
            if isolate_failures {
                sqlx::Executor::execute(&mut *tx, "SAVEPOINT courier_item")
                    .await
                    .map_err(map)?;
            }
            match work(&mut tx).await {
                Ok(()) => {
                    if isolate_failures {
                        sqlx::Executor::execute(&mut *tx, "RELEASE SAVEPOINT courier_item")
                            .await
                            .map_err(map)?;
                    }
                    items.push(BatchItem::Applied);
                    done.push(delivery);
                }
                Err(error) if isolate_failures => {
                    // Its writes and receipt go; its lease stays for the caller.
                    sqlx::Executor::execute(
                        &mut *tx,
                        "ROLLBACK TO SAVEPOINT courier_item; RELEASE SAVEPOINT courier_item",
                    )
                    .await
                    .map_err(map)?;
                    sqlx::query(queries::RECEIPT_DELETE)
                        .bind(delivery.message_id.to_string())
                        .bind(&delivery.subscription)
                        .execute(&mut *tx)
                        .await
                        .map_err(map)?;
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
        if !done.is_empty() {
            let completed = sqlx::query(queries::COMPLETE_IN_TX)
                .bind(leases_json(
                    done.iter().map(|d| (d.delivery_id, d.lease_token)),
                ))
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?;
            if completed.len() != done.len() {
                tx.rollback().await.map_err(map)?;
                return Ok(TransactionalBatchOutcome::RolledBack(
                    BatchRollback::LeaseLost,
                ));
            }
        }
        tx.commit().await.map_err(map)?;
        Ok(TransactionalBatchOutcome::Committed(items))
    }

    /// SQLite has no LISTEN/NOTIFY, so there is nobody to announce idleness
    /// to: workers wake through the in-process counter
    /// ([`SqliteStore::wakeups`]) and their polling. Returns `false` without
    /// touching the database, and the engine stops announcing.
    async fn announce_idle<'c>(
        &'c self,
        _subscription: &'c str,
        _worker_id: &'c str,
        _idle: bool,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<PruneReport, StoreError> {
        let _turn = self.write_turn().await?;
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let receipts = sqlx::query(queries::PRUNE_RECEIPTS)
            .bind(millis(older_than))
            .bind(batch)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected()
            + sqlx::query(queries::PRUNE_STREAM_RECEIPTS)
                .bind(millis(older_than))
                .bind(batch)
                .execute(&self.inner.pool)
                .await
                .map_err(map)?
                .rows_affected();
        let messages = sqlx::query(queries::PRUNE_MESSAGES)
            .bind(millis(older_than))
            .bind(batch)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?
            .rows_affected();
        sqlx::query(queries::PRUNE_REMOVED_TOPICS)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(PruneReport { messages, receipts })
    }

    async fn lead_maintenance<'c>(
        &'c self,
        holder: &'c str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let _turn = self.write_turn().await?;
        let rows = sqlx::query(queries::LEADER_ELECT)
            .bind(holder)
            .bind(millis(lease))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(!rows.is_empty())
    }

    async fn resign_maintenance<'c>(&'c self, holder: &'c str) -> Result<(), StoreError> {
        let _turn = self.write_turn().await?;
        sqlx::query(queries::LEADER_RESIGN)
            .bind(holder)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(())
    }
}
