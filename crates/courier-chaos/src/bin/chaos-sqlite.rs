//! A Courier process on the chaos suite's SQLite file, as a producer or a
//! worker (`CHAOS_ROLE`), for the scenario that kills them all with SIGKILL
//! every 20 s.
//!
//! - `producer`: writes messages `CHAOS_FIRST`, `CHAOS_FIRST + CHAOS_STEP`, …
//!   each with its `ledger_oracle` row in one transaction, and prints
//!   `committed N` once the commit returned (a line the suite holds it to);
//!   an error (the write lock busy past its timeout) is printed as `error …`
//!   and the same message is tried again.
//! - `worker`: the suite's subscription, its transactional handler writing one
//!   `ledger_effects` row per message in the delivery's transaction.
//!
//! Both print `ready` once they run and exit when their stdin closes.

use std::time::Duration;

use anyhow::Context;
use courier::{
    Courier, HandlerError, MaintenanceConfig, Message, NewMessage, RetryPolicy,
    TransactionalHandler,
};
use courier_chaos::env_var as env;
use sqlx::SqliteConnection;

struct Ledgered;

impl TransactionalHandler<SqliteConnection> for Ledgered {
    type Payload = serde_json::Value;

    async fn handle(
        &self,
        message: &Message<serde_json::Value>,
        conn: &mut SqliteConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO ledger_effects (tenant, message_id, attempt) VALUES (?, ?, ?)")
            .bind(&message.tenant)
            .bind(message.id.to_string())
            .bind(message.attempt)
            .execute(&mut *conn)
            .await
            .map_err(HandlerError::retry)?;
        Ok(())
    }
}

fn number(name: &str) -> anyhow::Result<u64> {
    env(name)?
        .parse()
        .with_context(|| format!("{name} is not a number"))
}

async fn produce(courier: &Courier<courier::sqlite::SqliteStore>) -> anyhow::Result<()> {
    let (mut n, step) = (number("CHAOS_FIRST")?, number("CHAOS_STEP")?);
    let pool = courier.store().pool().clone();
    loop {
        let tenant = if n.is_multiple_of(2) {
            "acme"
        } else {
            "globex"
        };
        let message =
            NewMessage::new(tenant, &env("CHAOS_TOPIC")?, &serde_json::json!({ "n": n }))?
                .with_ordering_key(format!("k{}", n % 20));
        let attempt = async {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO ledger_oracle (tenant, message_id, n) VALUES (?, ?, ?)")
                .bind(tenant)
                .bind(message.id.to_string())
                .bind(i64::try_from(n)?)
                .execute(&mut *tx)
                .await?;
            courier.enqueue(&mut tx, &message).await?;
            tx.commit().await?;
            anyhow::Ok(())
        };
        match attempt.await {
            Ok(()) => {
                println!("committed {n}");
                n += step;
            }
            Err(error) => println!("error {error:#}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let courier = Courier::connect_sqlite(&env("CHAOS_SQLITE_PATH")?).await?;
    let orphaned = courier_chaos::stdin_closed();
    match env("CHAOS_ROLE")?.as_str() {
        "producer" => {
            println!("ready");
            tokio::select! {
                result = produce(&courier) => result?,
                () = orphaned => {}
            }
        }
        "worker" => {
            let mut retry = RetryPolicy::with_max_attempts(3);
            retry.base = Duration::from_millis(200);
            retry.cap = Duration::from_secs(5);
            let maintenance = MaintenanceConfig {
                rescue_interval: Duration::from_secs(1),
                leader_lease: Duration::from_secs(3),
                rescue_backoff: retry,
                ..MaintenanceConfig::default()
            };
            let lease = Duration::from_secs(5);
            let _worker = courier
                .worker(env("CHAOS_SUBSCRIPTION")?)
                .maintenance(Some(maintenance))
                .handle_transactional(env("CHAOS_TOPIC")?, 1, Ledgered)
                .worker_id(format!("chaos-{}", std::process::id()))
                .lease(lease)
                .heartbeat_interval(lease / 3)
                .poll_interval(Duration::from_millis(500))
                .retry_policy(retry)
                .build()
                .await?
                .start();
            println!("ready");
            orphaned.await;
        }
        role => anyhow::bail!("CHAOS_ROLE must be producer or worker, not {role:?}"),
    }
    // Not a return: the runtime would wait for the blocking read of stdin.
    std::process::exit(0)
}
