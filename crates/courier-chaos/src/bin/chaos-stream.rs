//! A stream subscription process for the chaos suite: one Redis stream
//! subscription (`acme/events` under the prefix `chaos:`) whose
//! transactional handler writes its effect (`ledger.stream_effects`: the
//! entry id, the consumer and the delivery count, no unique key) with the
//! receipt in the suite's PostgreSQL cluster. With `CHAOS_QUOTA` set, the
//! handler defers (a tenant over its quota) while `ledger.quota.open` is
//! false. Settings come from the environment; it prints `ready` once the
//! subscription runs, and exits when its stdin closes.

use std::time::Duration;

use anyhow::Context;
use courier::redis::RedisStreamStore;
use courier::{
    GroupStart, HandlerError, StreamKey, StreamMessage, StreamSubscription,
    StreamSubscriptionConfig, TransactionalStreamHandler,
};
use courier_chaos::env_var as env;
use sqlx::PgConnection;

/// The ledgered effect.
struct Ledgered {
    consumer: String,
    delay: Duration,
    quota: bool,
}

impl TransactionalStreamHandler<PgConnection> for Ledgered {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &StreamMessage<serde_json::Value>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        if self.quota {
            let open: bool = sqlx::query_scalar("SELECT open FROM ledger.quota")
                .fetch_one(&mut *conn)
                .await?;
            if !open {
                return Err(HandlerError::snooze(
                    Duration::from_secs(1),
                    "tenant acme is over its quota",
                ));
            }
        }
        tokio::time::sleep(self.delay).await;
        sqlx::query(
            "INSERT INTO ledger.stream_effects (entry_id, n, consumer, deliveries)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(message.id.to_string())
        .bind(message.payload["n"].as_i64().unwrap_or(-1))
        .bind(&self.consumer)
        .bind(i64::try_from(message.deliveries).unwrap_or(i64::MAX))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

fn millis(name: &str, default: u64) -> anyhow::Result<Duration> {
    let value = match std::env::var(name) {
        Ok(value) => value
            .parse()
            .with_context(|| format!("{name} is not a number of milliseconds: {value:?}"))?,
        Err(_) => default,
    };
    Ok(Duration::from_millis(value))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CHAOS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let pool = courier::postgres::connect(&env("CHAOS_DATABASE_URL")?, 8).await?;
    let receipts = courier::postgres::PgStore::new(pool);
    let streams = RedisStreamStore::connect(&env("CHAOS_REDIS_URL")?, "chaos:").await?;
    let consumer = env("CHAOS_CONSUMER")?;
    let mut config = StreamSubscriptionConfig::new("ledger", StreamKey::new("acme", "events")?)?;
    config.consumer = consumer.clone();
    config.start = GroupStart::Beginning;
    config.batch = 20;
    config.concurrency = 4;
    config.block = Duration::from_millis(500);
    config.min_idle = millis("CHAOS_MIN_IDLE_MS", 1_000)?;
    config.claim_interval = Duration::from_millis(500);
    config.consumer_idle_limit = millis("CHAOS_CONSUMER_IDLE_MS", 3_600_000)?;
    if let Ok(max) = std::env::var("CHAOS_MAX_DELIVERIES") {
        config.max_deliveries = max
            .parse()
            .with_context(|| format!("CHAOS_MAX_DELIVERIES is not a number: {max:?}"))?;
    }
    config.defer_min = Duration::from_secs(1);
    config.defer_max = Duration::from_secs(2);
    let handler = Ledgered {
        consumer,
        delay: millis("CHAOS_HANDLER_MS", 0)?,
        quota: std::env::var("CHAOS_QUOTA").is_ok(),
    };
    let subscription = StreamSubscription::transactional(streams, receipts, config, handler)?;
    subscription.ensure_group().await?;
    let running = subscription.start();
    println!("ready");
    courier_chaos::stdin_closed().await;
    running.shutdown().await;
    std::process::exit(0)
}
