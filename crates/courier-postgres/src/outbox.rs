//! [`OutboxStore`] for PostgreSQL: enqueue, claim and settle deliveries.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier_core::{
    error_fingerprint, lease_expired_fingerprint, truncate_chars, BatchItem, BatchRollback,
    ClaimBatch, ClaimParams, ClaimedDelivery, Completion, EnqueueOutcome, ErrorKind, Extended,
    Failure, FailureApplied, LeaseRef, NewMessage, OutboxStore, PruneReport, Registration, Replay,
    RescueParams, Snooze, StoreError, SubscriptionSpec, TransactionalBatchOutcome,
    TransactionalOutcome, TxWork, ValidationError, MAX_ERROR_CHARS, MAX_SNOOZES,
};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::error::map;
use crate::floors::Settled;
use crate::rows::failures_applied;
use crate::{enqueue_arguments, migrate, millis, PgStore};

/// How long a registration only tries for the fan-out lock before it also
/// queues for it.
const FAN_OUT_TRY_FOR: Duration = Duration::from_secs(2);

/// The longest a registration waits for producers to let it have the lock.
const FAN_OUT_WAIT_AT_MOST: Duration = Duration::from_secs(30);

/// How long a registration queues for the lock at a time (new producers
/// queue behind it meanwhile).
const FAN_OUT_QUEUE_AT_MOST: Duration = Duration::from_millis(200);

/// The ids of `all` that are not in `some`, in `all`'s order.
fn not_in(all: &[i64], some: &[i64]) -> Vec<i64> {
    let some: std::collections::HashSet<i64> = some.iter().copied().collect();
    all.iter()
        .copied()
        .filter(|id| !some.contains(id))
        .collect()
}

/// `(delivery ids, lease tokens)` as the two arrays the settle queries take.
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

impl OutboxStore for PgStore {
    type Connection = PgConnection;
    const EXCLUSIVE_TRANSACTIONS: bool = false;

    async fn migrate(&self) -> Result<(), StoreError> {
        migrate::run(&self.inner.pool, self.q(), &self.inner.schema).await
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
        let mut tx = begin(&self.inner.pool, None).await?;
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
        let mut tx = self.begin_read_committed().await?;
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
        if created || added > 0 {
            sqlx::query(&self.q().fan_out_epoch_bump)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
        }
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
                let replayed = sqlx::query(&self.q().subscription_replay)
                    .bind(&spec.name)
                    .bind(from_time)
                    .bind(from_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?
                    .rows_affected();
                sqlx::query(&self.q().subscription_topics_since)
                    .bind(&spec.name)
                    .bind(from_time)
                    .bind(from_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                replayed
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
        self.claim_with_floors(params).await
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
        let fingerprints: Vec<String> = failures
            .iter()
            .zip(&errors)
            .map(|(f, error)| error_fingerprint(f.kind, error))
            .collect();
        let rows = sqlx::query(&self.q().fail)
            .bind(&ids)
            .bind(&tokens)
            .bind(&errors)
            .bind(&delays)
            .bind(&fingerprints)
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
        let fingerprints: Vec<String> = reasons
            .iter()
            .map(|reason| error_fingerprint(ErrorKind::Snooze, reason))
            .collect();
        let rows = sqlx::query(&self.q().snooze)
            .bind(&ids)
            .bind(&tokens)
            .bind(&delays)
            .bind(&reasons)
            .bind(MAX_SNOOZES)
            .bind(&fingerprints)
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
    ) -> Result<Extended, StoreError> {
        if leases.is_empty() {
            return Ok(Extended::default());
        }
        let (ids, tokens) = lease_columns(leases);
        let extended: Vec<i64> = sqlx::query_scalar(&self.q().extend)
            .bind(&ids)
            .bind(&tokens)
            .bind(millis(lease))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let missed = not_in(&ids, &extended);
        if missed.is_empty() {
            return Ok(Extended {
                extended,
                gone: Vec::new(),
            });
        }
        // The extension may have waited for a completion's commit and found
        // the row deleted: a new statement's snapshot tells gone from lost.
        let present: Vec<i64> = sqlx::query_scalar(&self.q().deliveries_present)
            .bind(&missed)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(Extended {
            extended,
            gone: not_in(&missed, &present),
        })
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
            .bind(lease_expired_fingerprint())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(moved
            .first()
            .and_then(|n| u64::try_from(*n).ok())
            .unwrap_or(0))
    }

    async fn run_transactional<'c>(
        &'c self,
        delivery: &'c ClaimedDelivery,
        work: TxWork<PgConnection>,
    ) -> Result<TransactionalOutcome, StoreError> {
        let outcome = self
            .run_transactional_batch(vec![(delivery, work)], false)
            .await?;
        Ok(courier_core::single_transactional_outcome(outcome))
    }

    async fn run_transactional_batch<'c>(
        &'c self,
        batch: Vec<(&'c ClaimedDelivery, TxWork<PgConnection>)>,
        isolate_failures: bool,
    ) -> Result<TransactionalBatchOutcome, StoreError> {
        let mut tx = begin(&self.inner.pool, None).await?;
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
                    &self.q().batch_savepoint_next
                } else {
                    &self.q().batch_savepoint
                };
                // A plain string runs as a simple query: two statements, one message.
                sqlx::Executor::execute(&mut *tx, sql.as_str())
                    .await
                    .map_err(map)?;
                savepoint_open = true;
            }
            match work(&mut tx).await {
                Ok(()) => {
                    ids.push(delivery.delivery_id);
                    tokens.push(delivery.lease_token);
                    items.push(BatchItem::Applied);
                }
                Err(error) if isolate_failures => {
                    sqlx::Executor::execute(&mut *tx, self.q().batch_savepoint_rollback.as_str())
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
        let receipts: i64 = sqlx::query_scalar(&self.q().prune_receipts)
            .bind(millis(older_than))
            .bind(batch)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)?;
        let receipts = u64::try_from(receipts).unwrap_or(0);
        // Not beside a registration's replay (see fan_out_lock_shared.sql).
        let mut tx = self.begin_read_committed().await?;
        sqlx::query(&self.q().fan_out_lock_shared)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        let messages: i64 = sqlx::query_scalar(&self.q().prune_messages)
            .bind(millis(older_than))
            .bind(batch)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let messages = u64::try_from(messages).unwrap_or(0);
        tx.commit().await.map_err(map)?;
        // Marks no claimer read (a subscription without workers) go with the rest.
        sqlx::query(&self.q().claim_marks_prune)
            .bind(batch)
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

/// A transaction on a connection of `pool`, opened with `statement` (a
/// plain `BEGIN` when `None`), such that dropping the caller at any point
/// leaves no pooled connection inside it. sqlx's `begin` alone is not
/// cancel-safe on PostgreSQL: dropped between sending `BEGIN` and reading
/// its reply, it returns the connection to the pool inside a transaction
/// nothing will end (launchbadge/sqlx#2054, transact-rs/sqlx#4393; 0.8.6 and
/// 0.9.0), and every later borrower's statements run in it and keep their
/// locks. Courier drops work mid-way by design (a handler whose lease is
/// lost or whose timeout passed), so the round trip runs on a task of its
/// own: a caller gone by its end drops the transaction there, which rolls
/// it back before the connection is used again.
pub(crate) async fn begin(
    pool: &sqlx::PgPool,
    statement: Option<String>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let pool = pool.clone();
    let begun = tokio::spawn(async move {
        match statement {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
    });
    match begun.await {
        Ok(begun) => begun.map_err(map),
        Err(error) => Err(StoreError::Database {
            source: Box::new(error),
            transient: true,
        }),
    }
}

impl PgStore {
    /// A transaction of the store's own at READ COMMITTED, whatever the
    /// database's default: its statements each see what committed before
    /// them (after a lock they waited for, in particular).
    pub(crate) async fn begin_read_committed(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        begin(
            &self.inner.pool,
            Some(self.q().begin_read_committed.clone()),
        )
        .await
    }

    /// Takes the fan-out lock exclusively in `tx` (see fan_out_lock_try.sql)
    /// without holding producers up for long: it tries without queueing, and
    /// once it has tried for [`FAN_OUT_TRY_FOR`] it also queues, each time for
    /// at most [`FAN_OUT_QUEUE_AT_MOST`] (what a producer then waits behind
    /// it), until [`FAN_OUT_WAIT_AT_MOST`] have passed.
    pub(crate) async fn lock_fan_out(&self, tx: &mut PgConnection) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let taken: bool = sqlx::query_scalar(&self.q().fan_out_lock_try)
                .fetch_one(&mut *tx)
                .await
                .map_err(map)?;
            if taken {
                return Ok(());
            }
            if started.elapsed() >= FAN_OUT_WAIT_AT_MOST {
                return Err(StoreError::Database {
                    source: format!(
                        "producers kept the fan-out lock of schema {} for {:?}: \
                         a transaction that enqueued and stays open (see pg_stat_activity) \
                         holds up subscription changes",
                        self.inner.schema, FAN_OUT_WAIT_AT_MOST
                    )
                    .into(),
                    transient: true,
                });
            }
            if started.elapsed() >= FAN_OUT_TRY_FOR && self.queue_for_fan_out(tx).await? {
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Queues for the fan-out lock for at most [`FAN_OUT_QUEUE_AT_MOST`];
    /// whether it was taken (a timed-out wait is undone, the transaction kept).
    async fn queue_for_fan_out(&self, tx: &mut PgConnection) -> Result<bool, StoreError> {
        sqlx::query(&self.q().savepoint)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        sqlx::query(&self.q().lock_timeout_set)
            .bind(format!("{}ms", FAN_OUT_QUEUE_AT_MOST.as_millis()))
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        match sqlx::query(&self.q().fan_out_lock).execute(&mut *tx).await {
            Ok(_) => {
                sqlx::query(&self.q().savepoint_release)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                // The rest of the registration waits as it would have.
                sqlx::query(&self.q().lock_timeout_set)
                    .bind("0")
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                Ok(true)
            }
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                // Gave up waiting: the savepoint also undoes the timeout.
                sqlx::query(&self.q().savepoint_rollback)
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                Ok(false)
            }
            Err(error) => Err(map(error)),
        }
    }
}
