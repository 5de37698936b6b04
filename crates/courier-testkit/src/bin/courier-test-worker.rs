//! A worker process for multi-process tests: runs N workers per subscription
//! against a PostgreSQL schema, records every handler call in `handler_calls`
//! (outside the delivery transaction) and every effect in `effects` (inside
//! it), and exits 0 once nothing is left to deliver.
//!
//! Usage: courier-test-worker --schema S --subscriptions a,b --workers 2 [--delay-ms N]

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use courier::{HandlerError, Message, TransactionalHandler};
use courier_testkit::{pg_pool, Event};
use sqlx::{PgConnection, PgPool};

struct Recorder {
    calls: PgPool,
    delay: Duration,
}

impl TransactionalHandler<PgConnection> for Recorder {
    type Payload = Event;

    async fn handle(
        &self,
        message: &Message<Event>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO handler_calls (subscription, message_id) VALUES ($1, $2)")
            .bind(&message.subscription)
            .bind(message.id.to_string())
            .execute(&self.calls)
            .await?;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        sqlx::query(
            "INSERT INTO effects (subscription, message_id, calls) VALUES ($1, $2, 1)
             ON CONFLICT (subscription, message_id) DO UPDATE SET calls = effects.calls + 1",
        )
        .bind(&message.subscription)
        .bind(message.id.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }
}

fn arguments() -> anyhow::Result<HashMap<String, String>> {
    let mut args = std::env::args().skip(1);
    let mut map = HashMap::new();
    while let Some(key) = args.next() {
        let key = key
            .strip_prefix("--")
            .with_context(|| format!("expected --option, got {key:?}"))?
            .to_owned();
        let value = args
            .next()
            .with_context(|| format!("--{key} needs a value"))?;
        map.insert(key, value);
    }
    Ok(map)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = arguments()?;
    let schema = args.get("schema").context("--schema is required")?;
    let subscriptions = args
        .get("subscriptions")
        .context("--subscriptions is required")?;
    let workers: usize = args.get("workers").map_or(Ok(1), |w| w.parse())?;
    let delay = Duration::from_millis(args.get("delay-ms").map_or(Ok(0), |d| d.parse())?);
    // Handlers hold a transaction's connection while they record their call
    // through a second pool; one pool for both could starve itself.
    let pool = pg_pool(schema, 24).await?;
    let calls = pg_pool(schema, 4).await?;
    let courier = courier::Courier::postgres_with_schema(pool.clone(), schema)?;
    let mut running = Vec::new();
    for subscription in subscriptions.split(',') {
        for _ in 0..workers {
            running.push(
                courier
                    .worker(subscription)
                    .handle_transactional(
                        "order.placed",
                        1,
                        Recorder {
                            calls: calls.clone(),
                            delay,
                        },
                    )
                    .concurrency(4)
                    .batch_size(50)
                    .lease(Duration::from_secs(10))
                    .build()
                    .await?
                    .start(),
            );
        }
    }
    println!("ready");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut idle_checks = 0;
    while idle_checks < 3 {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("not drained within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE state <> 'dead'")
            .fetch_one(&pool)
            .await?;
        idle_checks = if left == 0 { idle_checks + 1 } else { 0 };
    }
    for worker in running {
        worker.shutdown().await;
    }
    Ok(())
}
