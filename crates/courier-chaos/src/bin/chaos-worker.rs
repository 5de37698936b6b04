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
use courier_chaos::env_var as env;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgConnection;

/// The handler timeout: below the sessions' idle-in-transaction bound (see
/// `courier_chaos::Worker`), so that only a frozen or cut-off process hits that.
const HANDLER_TIMEOUT: Duration = Duration::from_secs(5);

/// The ledgered effect.
struct Ledgered {
    delay: Duration,
    /// The delay on attempts after the first (`CHAOS_RETRY_HANDLER_MS`,
    /// default `delay`).
    retry_delay: Duration,
    pid: i32,
    /// Panic on the first attempt of every message whose payload `n` is a
    /// multiple of this (`CHAOS_PANIC_EVERY`, 0: never), after the effect
    /// was written.
    panic_every: u64,
    /// Abort the process on the first attempt of every message whose `n` is
    /// a multiple of this (`CHAOS_ABORT_EVERY`, 0: never), after the effect
    /// was written and before its transaction commits.
    abort_every: u64,
    /// Abort the process on every attempt of the message whose `n` is this
    /// (`CHAOS_CRASH_ON`), before any write.
    crash_on: Option<u64>,
    /// Hang, after the writes of the first attempt of the message whose `n`
    /// is this (`CHAOS_HANG_ON`), for a minute in a way cancellation stops
    /// (`CHAOS_HANG=async`, the default) or for 12 s blocking the thread
    /// (`CHAOS_HANG=blocking`: a handler that ignores cancellation).
    hang_on: Option<u64>,
    hang_blocking: bool,
}

impl TransactionalHandler<PgConnection> for Ledgered {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &Message<serde_json::Value>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let fail = |error: sqlx::Error| HandlerError::retry(error);
        let n = message.payload["n"].as_u64().unwrap_or(1);
        if self.crash_on == Some(n) {
            eprintln!(
                "chaos: message {n} crashes the process (attempt {})",
                message.attempt
            );
            std::process::abort();
        }
        let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *conn)
            .await
            .map_err(fail)?;
        tokio::time::sleep(if message.attempt > 1 {
            self.retry_delay
        } else {
            self.delay
        })
        .await;
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
            "INSERT INTO ledger.runs (message_id, tenant, ordering_key, pid, started_at, ended_at,
                                      attempt)
             VALUES ($1, $2, $3, $4, $5, clock_timestamp(), $6)",
        )
        .bind(message.id)
        .bind(&message.tenant)
        .bind(&message.ordering_key)
        .bind(self.pid)
        .bind(started)
        .bind(message.attempt)
        .execute(&mut *conn)
        .await
        .map_err(fail)?;
        let first = message.attempt == 1;
        if self.panic_every > 0 && n.is_multiple_of(self.panic_every) && first {
            panic!("chaos: a handler panic after its writes (message {n})");
        }
        if self.hang_on == Some(n) && first {
            eprintln!(
                "chaos: message {n} hangs (blocking: {})",
                self.hang_blocking
            );
            if self.hang_blocking {
                std::thread::sleep(Duration::from_secs(12));
            } else {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
        if self.abort_every > 0 && n.is_multiple_of(self.abort_every) && first {
            eprintln!("chaos: aborting after the writes of message {n}, before its commit");
            std::process::abort();
        }
        Ok(())
    }
}

fn millis(name: &str) -> anyhow::Result<Duration> {
    let value: u64 = env(name)?
        .parse()
        .with_context(|| format!("{name} is not a number of milliseconds"))?;
    Ok(Duration::from_millis(value))
}

/// A number from the environment, if set.
fn optional(name: &str) -> anyhow::Result<Option<u64>> {
    std::env::var(name)
        .ok()
        .map(|value| {
            value
                .parse()
                .with_context(|| format!("{name} is not a number: {value:?}"))
        })
        .transpose()
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
    // A connection for each of the 8 transactional groups that may run at
    // once (concurrency 32 / groups of 4), and as many again for claims,
    // heartbeats, settling and maintenance: a pool smaller than the groups
    // starves the heartbeat while the groups wait on locks, and every lease
    // lapses (seen with 8 connections while a frozen worker held receipts).
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .context("connecting to the chaos cluster")?;
    let courier = Courier::postgres(pool);
    let lease = millis("CHAOS_LEASE_MS")?;
    let delay = millis("CHAOS_HANDLER_MS")?;
    let handler = Ledgered {
        delay,
        retry_delay: optional("CHAOS_RETRY_HANDLER_MS")?.map_or(delay, Duration::from_millis),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        panic_every: optional("CHAOS_PANIC_EVERY")?.unwrap_or(0),
        abort_every: optional("CHAOS_ABORT_EVERY")?.unwrap_or(0),
        crash_on: optional("CHAOS_CRASH_ON")?,
        hang_on: optional("CHAOS_HANG_ON")?,
        hang_blocking: std::env::var("CHAOS_HANG").is_ok_and(|mode| mode == "blocking"),
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
        .handler_timeout(Some(HANDLER_TIMEOUT))
        .build()
        .await?
        .start();
    println!("ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // The suite holds our stdin open: end of input means it died (a test
    // killed or timed out), and nothing must outlive it.
    let orphaned = courier_chaos::stdin_closed();
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
