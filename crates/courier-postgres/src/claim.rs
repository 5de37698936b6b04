//! The claim: plan a pass from the lane's floors, run one `claim.sql`
//! statement, and record what it found.
//!
//! A claim asks [`Floors`](crate::floors::Floors) how to scan (a floor pass or
//! a full pass, see `floors.rs`) and runs that pass. A floor pass, or a lap's
//! pass that started after the lap's cursor rather than the caller's, that
//! claims nothing is followed at once by a full pass after the caller's
//! cursor, so that "nothing" is only reported once the tenants' first
//! entries after that cursor were looked at (the caller may go idle on it).
//! About once a second a lane first reads the database's claim marks (work
//! any process put back below its floors) and lowers its floors to them.
//!
//! Failure: when the planned pass fails, its plan is abandoned in the floors
//! and the error goes to the caller. With a tenant in-flight limit the
//! statement runs in a transaction that first takes an advisory lock per
//! tenant it serves (`claim_in_flight_lock.sql`), so claims of other tenants
//! never wait for it and a claim cut off mid-way rolls back and frees the
//! locks with its transaction.

use courier_core::{ClaimBatch, ClaimParams, StoreError};
use sqlx::postgres::PgArguments;
use sqlx::Row;
use uuid::Uuid;

use crate::error::map;
use crate::floors::{Claimed, Found, LaneKey, Pass, Planned};
use crate::rows::claimed_from_row;
use crate::{millis, PgStore};

/// A turn of no tenant (no tenant has the empty name).
const NO_TENANT: &[String] = &[String::new()];

/// The claim's routes as the topic and version arrays its statements bind.
fn route_columns(params: &ClaimParams) -> (Vec<&str>, Vec<i32>) {
    params
        .routes
        .iter()
        .map(|r| (r.topic.as_str(), r.schema_version))
        .unzip()
}

/// The attempt budget every route shares, if they all share one.
fn uniform_budget(budgets: &[i32]) -> Option<i32> {
    let first = *budgets.first()?;
    budgets.iter().all(|b| *b == first).then_some(first)
}

impl PgStore {
    /// Claims up to `params.limit` deliveries the way the lane's floors plan
    /// it, falling back to a full pass after the caller's cursor when the
    /// planned pass finds nothing.
    pub(crate) async fn claim_with_floors(
        &self,
        params: &ClaimParams,
    ) -> Result<ClaimBatch, StoreError> {
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
        let now = std::time::Instant::now();
        if self.inner.floors.marks_due(&lane, now) {
            if let Err(error) = self.read_claim_marks(params, &lane, now).await {
                // Claim anyway: the marks are read again in a second, and
                // laps find what they announce meanwhile.
                tracing::warn!(%error, subscription = %params.subscription, "could not read claim marks");
            }
        }
        let planned = self
            .inner
            .floors
            .plan(&lane, &params.tenant_cursor, params.limit, now);
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

    /// Lowers the lane's floors to the due claim marks of its routes: work
    /// any process put back below them (see claim_marks_due.sql).
    async fn read_claim_marks(
        &self,
        params: &ClaimParams,
        lane: &LaneKey,
        now: std::time::Instant,
    ) -> Result<(), StoreError> {
        let (topics, versions) = route_columns(params);
        let lows: Vec<(String, i64)> = sqlx::query_as(&self.q().claim_marks_due)
            .bind(&params.subscription)
            .bind(topics)
            .bind(versions)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        self.inner.floors.lower(lane, &lows, now);
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
        let (topics, versions) = route_columns(params);
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
                let mut tx = self.begin_read_committed().await?;
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
                urgent: d.priority > 0,
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
}
