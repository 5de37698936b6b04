//! A Courier worker process for the chaos suite: one subscription on the
//! suite's cluster, with a transactional handler whose effect is a row in the
//! ledger (`ledger.effects`, no unique key, so a double effect shows) and a
//! record of the run's start and end (`ledger.runs`), both in the delivery's
//! transaction. Settings come from the environment (see `courier_chaos::Worker`);
//! it prints `ready` once its worker runs and exits 0 after SIGTERM once shut down.

use std::time::Duration;

use anyhow::Context;
use courier::{
    Courier, HandlerError, MaintenanceConfig, Message, RetryPolicy, TransactionalHandler,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgConnection;

/// The ledgered effect.
struct Ledgered {
    delay: Duration,
    pid: i32,
    /// Panic on the first attempt of every message whose payload `n` is a
    /// multiple of this (0: never), after the effect was written.
    panic_every: u64,
}

impl TransactionalHandler<PgConnection> for Ledgered {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &Message<serde_json::Value>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let fail = |error: sqlx::Error| HandlerError::retry(error);
        let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *conn)
            .await
            .map_err(fail)?;
        tokio::time::sleep(self.delay).await;
        sqlx::query(
            "INSERT INTO ledger.effects (tenant, message_id, subscription) VALUES ($1, $2, $3)",
        )
        .bind(&message.tenant)
        .bind(message.id)
        .bind(&message.subscription)
        .execute(&mut *conn)
        .await
        .map_err(fail)?;
        sqlx::query(
            "INSERT INTO ledger.runs (message_id, tenant, ordering_key, pid, started_at, ended_at)
             VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
        )
        .bind(message.id)
        .bind(&message.tenant)
        .bind(&message.ordering_key)
        .bind(self.pid)
        .bind(started)
        .execute(&mut *conn)
        .await
        .map_err(fail)?;
        let n = message.payload["n"].as_u64().unwrap_or(1);
        if self.panic_every > 0 && n.is_multiple_of(self.panic_every) && message.attempt == 1 {
            panic!("chaos: a handler panic after its writes (message {n})");
        }
        Ok(())
    }
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

fn millis(name: &str) -> anyhow::Result<Duration> {
    let value: u64 = env(name)?
        .parse()
        .with_context(|| format!("{name} is not a number of milliseconds"))?;
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
    let options = courier::postgres::connect_options(&env("CHAOS_DATABASE_URL")?)?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .context("connecting to the chaos cluster")?;
    let courier = Courier::postgres(pool);
    let lease = millis("CHAOS_LEASE_MS")?;
    let handler = Ledgered {
        delay: millis("CHAOS_HANDLER_MS")?,
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        panic_every: std::env::var("CHAOS_PANIC_EVERY")
            .ok()
            .and_then(|every| every.parse().ok())
            .unwrap_or(0),
    };
    let mut retry = RetryPolicy::with_max_attempts(3);
    retry.base = Duration::from_millis(200);
    retry.cap = Duration::from_secs(5);
    // Rescues as prompt as the fixed settings ask: a dead worker's leases
    // are back within R = lease + poll + backoff cap, even when it was the
    // maintenance leader (with the defaults, a 15 s leader lease, a 5 s
    // rescue interval and a 2 s rescue backoff, it took 16 s once).
    let maintenance = MaintenanceConfig {
        rescue_interval: Duration::from_secs(1),
        leader_lease: Duration::from_secs(3),
        rescue_backoff: retry,
        ..MaintenanceConfig::default()
    };
    let worker = courier
        .worker(env("CHAOS_SUBSCRIPTION")?)
        .maintenance(Some(maintenance))
        .handle_transactional(env("CHAOS_TOPIC")?, 1, handler)
        // The ledger's checks find this process's leases by it.
        .worker_id(format!("chaos-{}", std::process::id()))
        .lease(lease)
        .heartbeat_interval(lease / 3)
        .poll_interval(Duration::from_millis(500))
        .shutdown_timeout(Duration::from_secs(10))
        .batch_size(32)
        .concurrency(32)
        // A group runs its handlers one after another in one transaction:
        // small groups, so that several run at once.
        .transaction_batch_size(4)
        .retry_policy(retry)
        .build()
        .await?
        .start();
    println!("ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // The suite holds our stdin open: end of input means it died (a test
    // killed or timed out), and nothing must outlive it.
    let orphaned = async {
        let mut buf = [0_u8; 64];
        let mut stdin = tokio::io::stdin();
        loop {
            match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = term.recv() => {
            worker.shutdown().await;
            // Not a return: the runtime would wait for the blocking read of
            // stdin before the process could exit.
            std::process::exit(0)
        }
        () = orphaned => std::process::exit(3),
    }
}
