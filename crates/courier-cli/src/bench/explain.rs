//! Explain (PostgreSQL only, not part of `all`): loads a large deliveries
//! table through Courier's own enqueue path (`Courier::publish`, 1,000
//! messages per transaction, one subscription so each message fans out to
//! one delivery), runs `ANALYZE`, lists the indexes of the tables the hot
//! queries touch, and prints `EXPLAIN (ANALYZE, BUFFERS)` of each hot query
//! with the text the store runs ([`PgStore::query_sql`]) and parameters
//! bound as the store binds them:
//!
//! - `claim`: a batch of [`CLAIM_BATCH`] for the bench subscription;
//! - `complete`: the leases of a real claim of that size;
//! - `enqueue_plain` / `enqueue`: a batch of 1,000 new messages without / with
//!   idempotency keys (the fan-out trigger included);
//! - `prune_receipts`, `prune_messages`: everything older than now, in the
//!   maintenance's default batch, after the claimed batch was really
//!   completed (so finished messages qualify; plain completions write no
//!   receipt, so `prune_receipts` plans an empty `receipts`).
//!
//! `ANALYZE` executes the statement, so each runs in a transaction that is
//! rolled back: the table is the same for every query.

use std::time::{Duration, Instant};

use anyhow::Context;
use courier::postgres::PgStore;
use courier::{
    ClaimParams, ClaimedDelivery, Courier, LeaseRef, MaintenanceConfig, NewMessage, OutboxStore,
    RetryPolicy, Route, SubscriptionSpec,
};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;
use sqlx::{PgPool, Postgres};

use super::drain::{publish_all, LOAD_BATCH};
use super::fixture::{BenchPayload, Fixture};
use super::report::{ExplainedQuery, IndexInfo};
use super::{Measurement, Plan, Throughput};

const TOPIC: &str = "bench.explain";
const SUBSCRIPTION: &str = "bench";
/// Deliveries the explained claim asks for.
pub(crate) const CLAIM_BATCH: usize = 256;
/// The lease of the explained claims.
const LEASE: Duration = Duration::from_secs(30);

/// The plans and indexes the explain scenario found.
pub(crate) struct Explained {
    pub(crate) queries: Vec<ExplainedQuery>,
    pub(crate) indexes: Vec<IndexInfo>,
}

pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<Option<Explained>> {
    drop(fixture.fresh().await?);
    let Some((pool, schema)) = fixture.postgres() else {
        out.push(Measurement::skipped(
            "explain",
            "EXPLAIN (ANALYZE, BUFFERS) of the hot queries",
            "skipped: PostgreSQL only",
        ));
        return Ok(None);
    };
    let (pool, schema) = (pool.clone(), schema.to_owned());
    let courier = Courier::postgres_with_schema(pool.clone(), &schema)?;
    let store = courier.store();
    store
        .register_subscription(&SubscriptionSpec {
            name: SUBSCRIPTION.to_owned(),
            topics: vec![TOPIC.to_owned()],
            replay: None,
        })
        .await?;
    let count = plan.explain_messages;
    let started = Instant::now();
    publish_all(&courier, plan, "loading explain", count, |seq| {
        Ok(NewMessage::new("bench", TOPIC, &BenchPayload { seq })?)
    })
    .await
    .context("loading the explain table")?;
    let mut load = Measurement::throughput(
        "explain.load",
        "publish 1,000 per tx (explain's table)",
        Throughput::new(count, started.elapsed()),
        None,
    );
    load.note = Some("loading only; the plans follow the table".to_owned());
    out.push(load);
    fixture.analyze().await?;
    let indexes = indexes(&pool, &schema).await?;
    let queries = explain_all(store, &pool)
        .await
        .context("explaining the hot queries")?;
    Ok(Some(Explained { queries, indexes }))
}

async fn indexes(pool: &PgPool, schema: &str) -> anyhow::Result<Vec<IndexInfo>> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT tablename::text, indexname::text, indexdef FROM pg_indexes
         WHERE schemaname = $1 AND tablename IN ('deliveries', 'messages', 'receipts')
         ORDER BY tablename, indexname",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .context("listing indexes")?;
    Ok(rows
        .into_iter()
        .map(|(table, name, definition)| IndexInfo {
            table,
            name,
            definition,
        })
        .collect())
}

/// The store's text of `name`, or an error naming it.
fn sql<'s>(store: &'s PgStore, name: &str) -> anyhow::Result<&'s str> {
    store
        .query_sql(name)
        .with_context(|| format!("the store has no query named {name}"))
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of `sql`.
fn explained(sql: &str) -> String {
    format!("EXPLAIN (ANALYZE, BUFFERS)\n{sql}")
}

/// Runs an EXPLAIN query in a transaction that is then rolled back, and
/// returns the plan's lines.
async fn rolled_back(
    pool: &PgPool,
    query: QueryScalar<'_, Postgres, String, PgArguments>,
) -> anyhow::Result<String> {
    let mut tx = pool.begin().await?;
    let lines = query.fetch_all(&mut *tx).await?;
    tx.rollback().await?;
    Ok(lines.join("\n"))
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of an enqueue query over `messages`, bound as
/// `PgStore::enqueue_batch` binds them, rolled back.
async fn explain_enqueue(
    pool: &PgPool,
    sql: &str,
    messages: &[NewMessage],
) -> anyhow::Result<String> {
    let query = explained(sql);
    let arguments = courier::postgres::enqueue_arguments(messages)?;
    rolled_back(pool, sqlx::query_scalar_with(&query, arguments)).await
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

async fn explain_all(store: &PgStore, pool: &PgPool) -> anyhow::Result<Vec<ExplainedQuery>> {
    let mut out = Vec::new();
    let max_attempts = RetryPolicy::default().max_attempts;
    let worker_id = "bench-explain";
    let limit = i32::try_from(CLAIM_BATCH).unwrap_or(i32::MAX);

    // claim: bound as PgStore::claim binds it (one lease token for the
    // claim; one route, so its attempt budget is the uniform one). First a
    // full pass (tenants discovered, each scanned from its first entry), then
    // a floor pass starting half-way through the tenant's deliveries.
    let text = sql(store, "claim")?;
    let half_way: i64 = sqlx::query_scalar(&format!(
        "SELECT coalesce((min(id) + max(id)) / 2, 0) FROM {}.deliveries",
        store.schema()
    ))
    .fetch_one(pool)
    .await
    .context("the middle delivery id")?;
    for (floors, what) in [
        (Vec::new(), "full pass"),
        (vec![("bench", half_way)], "floor pass from half-way"),
    ] {
        let tenants: Vec<&str> = floors.iter().map(|(t, _)| *t).collect();
        let ids: Vec<i64> = floors.iter().map(|(_, f)| *f).collect();
        let plan = rolled_back(
            pool,
            sqlx::query_scalar(&explained(text))
                .bind(SUBSCRIPTION)
                .bind("")
                .bind(limit)
                .bind(limit)
                .bind(vec![TOPIC])
                .bind(vec![1_i32])
                .bind(vec![max_attempts])
                .bind(None::<i32>)
                .bind(millis(LEASE))
                .bind(worker_id)
                .bind(uuid::Uuid::new_v4())
                .bind(Some(max_attempts))
                .bind(&tenants)
                .bind(&ids)
                .bind(0_i64),
        )
        .await
        .with_context(|| format!("claim ({what})"))?;
        let floors_shown = if floors.is_empty() {
            "none".to_owned()
        } else {
            floors
                .iter()
                .map(|(t, f)| format!("{t} > {f}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(ExplainedQuery {
            name: "claim".into(),
            parameters: format!(
                "{what}; subscription {SUBSCRIPTION}, tenant cursor '', limit {CLAIM_BATCH}, 1 route, no in-flight limit, floors: {floors_shown}"
            ),
            sql: text.to_owned(),
            plan,
        });
    }

    // complete: the leases of a real claim.
    let claimed = store
        .claim(&ClaimParams {
            subscription: SUBSCRIPTION.to_owned(),
            routes: vec![Route {
                topic: TOPIC.to_owned(),
                schema_version: 1,
                max_attempts,
            }],
            limit: CLAIM_BATCH,
            lease: LEASE,
            worker_id: worker_id.to_owned(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: None,
        })
        .await
        .context("a real claim for complete's leases")?;
    let completions: Vec<LeaseRef> = claimed
        .deliveries
        .iter()
        .map(ClaimedDelivery::lease)
        .collect();
    let ids: Vec<i64> = completions.iter().map(|c| c.delivery_id).collect();
    let tokens: Vec<uuid::Uuid> = completions.iter().map(|c| c.lease_token).collect();
    let text = sql(store, "complete")?;
    let query = explained(text);
    let plan = rolled_back(pool, sqlx::query_scalar(&query).bind(&ids).bind(&tokens))
        .await
        .context("complete")?;
    out.push(ExplainedQuery {
        name: "complete".into(),
        parameters: format!("the {} leases of a real claim", ids.len()),
        sql: text.to_owned(),
        plan,
    });
    // Complete them for real, so the prune below finds finished messages.
    store
        .complete_many(&completions)
        .await
        .context("completing the claimed batch")?;

    // enqueue: a batch of 1,000, bound as PgStore::enqueue_batch binds it:
    // without idempotency keys (enqueue_plain.sql), then with one each
    // (enqueue.sql, ON CONFLICT on the idempotency index).
    for (name, keyed) in [("enqueue_plain", false), ("enqueue", true)] {
        let messages = (0..LOAD_BATCH)
            .map(|i| {
                let message = NewMessage::new("bench", TOPIC, &BenchPayload { seq: u64::MAX - i })?;
                Ok(if keyed {
                    message.with_idempotency_key(format!("explain-{i}"))
                } else {
                    message
                })
            })
            .collect::<Result<Vec<_>, courier::ValidationError>>()?;
        let text = sql(store, name)?;
        let plan = explain_enqueue(pool, text, &messages)
            .await
            .with_context(|| name.to_owned())?;
        let keys = if keyed {
            "an idempotency key each"
        } else {
            "no idempotency keys"
        };
        out.push(ExplainedQuery {
            name: name.into(),
            parameters: format!(
                "{LOAD_BATCH} new messages with {keys}, one tenant, one subscription (fan-out trigger included)"
            ),
            sql: text.to_owned(),
            plan,
        });
    }

    // prune: everything finished and older than now, in the default batch.
    let batch = i64::try_from(MaintenanceConfig::default().batch).unwrap_or(i64::MAX);
    for name in ["prune_receipts", "prune_messages"] {
        let text = sql(store, name)?;
        let query = explained(text);
        let plan = rolled_back(pool, sqlx::query_scalar(&query).bind(0_i64).bind(batch))
            .await
            .context(name)?;
        out.push(ExplainedQuery {
            name: name.into(),
            parameters: format!(
                "older than 0 ms (all finished), batch {batch}; {} deliveries completed before",
                completions.len()
            ),
            sql: text.to_owned(),
            plan,
        });
    }
    Ok(out)
}
