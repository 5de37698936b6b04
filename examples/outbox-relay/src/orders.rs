//! The application: an order's row in `orders` and its `order.placed`
//! event commit in one transaction of the application's own, and the
//! `order.placed` contract the relays hold every event to before it leaves.

use std::time::Duration;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{
    AdminStore, Courier, DeadLetterStore, Handler, HandlerError, Message, NewMessage, OutboxStore,
    StreamStore, TransactionalHandler,
};
use courier_server::relay::NativeStreamStore;
use courier_server::RawPayload;
use serde::Deserialize;
use uuid::Uuid;

use crate::{TENANT, TOPIC};

/// The `order.placed` (version 1) contract downstream consumers rely on.
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // Decoded to check the contract; the relays forward the JSON as written.
struct OrderPlaced {
    order_id: i64,
    customer: String,
    amount_cents: u64,
}

/// Relays only events that keep the `order.placed` contract: any other is a
/// permanent failure (dead-lettered at once, with the decode error), since
/// every retry would meet the same payload. The relayed message is the one
/// published, byte for byte; the check only reads it.
pub(crate) struct Contract<R>(pub(crate) R);

impl<R> Contract<R> {
    fn check(message: &Message<RawPayload>) -> Result<(), HandlerError> {
        serde_json::from_str::<OrderPlaced>(message.payload.get())
            .map(|_| ())
            .map_err(|error| {
                HandlerError::permanent(format!(
                    "the payload breaks the {} v{} contract: {error}",
                    message.topic, message.schema_version
                ))
            })
    }
}

impl<R: Handler<Payload = RawPayload>> Handler for Contract<R> {
    type Payload = RawPayload;

    async fn handle(&self, message: Message<RawPayload>) -> Result<(), HandlerError> {
        Self::check(&message)?;
        self.0.handle(message).await
    }
}

impl<C: Send + 'static, R: TransactionalHandler<C, Payload = RawPayload>> TransactionalHandler<C>
    for Contract<R>
{
    type Payload = RawPayload;

    async fn handle(
        &self,
        message: &Message<RawPayload>,
        conn: &mut C,
    ) -> Result<(), HandlerError> {
        Self::check(message)?;
        self.0.handle(message, conn).await
    }
}

/// One order's event: the good ones keep the contract; a poison one has its
/// amount as a decimal string (a producer bug the relay must not pass on).
pub(crate) fn order_event(
    order_id: i64,
    customer: &str,
    amount_cents: u64,
    poison: bool,
) -> Result<NewMessage, courier::ValidationError> {
    let payload = if poison {
        serde_json::json!({
            "order_id": order_id,
            "customer": customer,
            "amount_cents": format!("{}.{:02}", amount_cents / 100, amount_cents % 100),
        })
    } else {
        serde_json::json!({ "order_id": order_id, "customer": customer, "amount_cents": amount_cents })
    };
    Ok(NewMessage::new(TENANT, TOPIC, &payload)?
        .with_idempotency_key(format!("order-{order_id}-placed")))
}

/// A store the example's application writes orders to.
pub(crate) trait OrderStore:
    OutboxStore + DeadLetterStore + AdminStore + StreamStore + NativeStreamStore
{
    /// How long committed native entries may take to become readable: on
    /// PostgreSQL they are handed out below the oldest running writer's
    /// snapshot, so another session's open transaction delays them; on
    /// SQLite they are readable at once.
    const NATIVE_VISIBILITY_WAIT: Duration;

    /// Creates `orders` if it does not exist.
    async fn create_orders_table(&self) -> anyhow::Result<()>;

    /// Places one order: its row and its event commit in one transaction.
    async fn place_order(
        &self,
        courier: &Courier<Self>,
        customer: &str,
        amount_cents: u64,
        poison: bool,
    ) -> anyhow::Result<Uuid>;
}

impl OrderStore for PgStore {
    const NATIVE_VISIBILITY_WAIT: Duration = Duration::from_secs(30);

    async fn create_orders_table(&self) -> anyhow::Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (
               id bigserial PRIMARY KEY,
               customer text NOT NULL,
               amount_cents bigint NOT NULL,
               placed_at timestamptz NOT NULL DEFAULT now())",
        )
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn place_order(
        &self,
        courier: &Courier<Self>,
        customer: &str,
        amount_cents: u64,
        poison: bool,
    ) -> anyhow::Result<Uuid> {
        let mut tx = self.pool().begin().await?;
        let order_id: i64 = sqlx::query_scalar(
            "INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id",
        )
        .bind(customer)
        .bind(i64::try_from(amount_cents)?)
        .fetch_one(&mut *tx)
        .await?;
        let event = order_event(order_id, customer, amount_cents, poison)?;
        let outcome = courier.enqueue(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(outcome.id)
    }
}

impl OrderStore for SqliteStore {
    const NATIVE_VISIBILITY_WAIT: Duration = Duration::ZERO;

    async fn create_orders_table(&self) -> anyhow::Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (
               id INTEGER PRIMARY KEY AUTOINCREMENT,
               customer TEXT NOT NULL,
               amount_cents INTEGER NOT NULL,
               placed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
        )
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn place_order(
        &self,
        courier: &Courier<Self>,
        customer: &str,
        amount_cents: u64,
        poison: bool,
    ) -> anyhow::Result<Uuid> {
        // BEGIN IMMEDIATE: a read-then-write transaction never meets SQLITE_BUSY.
        let mut tx = self.begin().await?;
        let order_id: i64 = sqlx::query_scalar(
            "INSERT INTO orders (customer, amount_cents) VALUES (?1, ?2) RETURNING id",
        )
        .bind(customer)
        .bind(i64::try_from(amount_cents)?)
        .fetch_one(&mut *tx)
        .await?;
        let event = order_event(order_id, customer, amount_cents, poison)?;
        let outcome = courier.enqueue(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(outcome.id)
    }
}
