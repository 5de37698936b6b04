//! The claim: plan a pass from the lane's floors, run one `claim.sql`
//! statement, and record what it found.
//!
//! A claim asks [`Floors`](crate::floors::Floors) how to scan (a floor pass or
//! a full pass, see `floors.rs`) and runs that pass. A floor pass that claims
//! nothing is followed at once by a full pass after the caller's cursor, so
//! that "nothing" is only reported once the tenants' first entries were
//! looked at (the caller may go idle on it).
//!
//! Failure: when the planned pass fails, its plan is abandoned in the floors
//! and the error goes to the caller. With a tenant in-flight limit the
//! statement runs in a transaction behind an advisory lock per subscription
//! (`claim_in_flight_lock.sql`), so a claim cut off mid-way rolls back and
//! frees the lock with its transaction.

use courier_core::{ClaimBatch, ClaimParams, StoreError};
use sqlx::Row;
use uuid::Uuid;

use crate::error::map;
use crate::floors::{Claimed, Found, LaneKey, Pass, Planned};
use crate::rows::claimed_from_row;
use crate::{millis, PgStore};

/// The attempt budget every route shares, if they all share one.
fn uniform_budget(budgets: &[i32]) -> Option<i32> {
    let first = *budgets.first()?;
    budgets.iter().all(|b| *b == first).then_some(first)
}

impl PgStore {
    /// Claims up to `params.limit` deliveries the way the lane's floors plan
    /// it, falling back to a full pass when a floor pass finds nothing.
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
        if planned.pass != Pass::Full && batch.deliveries.is_empty() {
            // Nothing above the floors: scan from the first entries before
            // reporting that there is nothing (the caller may go idle on it).
            return self.claim_pass(params, &lane, &planned.fallback()).await;
        }
        Ok(batch)
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
        let topics: Vec<&str> = params.routes.iter().map(|r| r.topic.as_str()).collect();
        let versions: Vec<i32> = params.routes.iter().map(|r| r.schema_version).collect();
        let budgets: Vec<i32> = params.routes.iter().map(|r| r.max_attempts).collect();
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
        let claim = sqlx::query(&self.q().claim)
            .bind(&params.subscription)
            .bind(planned.cursor(&params.tenant_cursor))
            .bind(limit)
            .bind(limit)
            .bind(&topics)
            .bind(&versions)
            .bind(&budgets)
            .bind(in_flight_limit)
            .bind(millis(params.lease))
            .bind(&params.worker_id)
            .bind(Uuid::new_v4())
            .bind(uniform_budget(&budgets))
            .bind(given)
            .bind(floors)
            .bind(match pass {
                Pass::Full => 0,
                Pass::Floor { .. } => planned.discover_above,
            });
        let rows = if in_flight_limit.is_some() {
            // Counting a tenant's running deliveries is only exact if no other
            // claim of this subscription is in flight: take turns, so each
            // claim's snapshot includes the previous claim's rows.
            let mut tx = self.inner.pool.begin().await.map_err(map)?;
            sqlx::query(&self.q().claim_in_flight_lock)
                .bind(format!(
                    "{}:in-flight:{}",
                    self.inner.schema, params.subscription
                ))
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            let rows = claim.fetch_all(&mut *tx).await.map_err(map)?;
            tx.commit().await.map_err(map)?;
            rows
        } else {
            claim.fetch_all(&self.inner.pool).await.map_err(map)?
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
}
