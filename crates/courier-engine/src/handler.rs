//! Typed handlers and how a claimed delivery reaches them.
//!
//! A [`Handler`] receives a decoded [`Message`] and makes its effect outside
//! Courier's database; it must be idempotent by [`Message::idempotency_key`]
//! because a crash between the effect and the completion redelivers.
//! A [`TransactionalHandler`] receives the delivery's open transaction: its
//! writes, the receipt and the completion commit together, so the effect
//! happens exactly once. A payload that does not decode into the handler's
//! type is a permanent failure (dead letter) carrying the decode error.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use courier_core::{ClaimedDelivery, HandlerError, Message, TxWork};
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;

/// Handles one topic's messages with effects outside Courier's database.
pub trait Handler: Send + Sync + 'static {
    /// The payload type messages decode into.
    type Payload: DeserializeOwned + Send + 'static;

    /// Applies one message. `Ok` completes the delivery; an error retries it
    /// per the retry policy, or dead-letters it if [`HandlerError::permanent`].
    fn handle(
        &self,
        message: Message<Self::Payload>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Handles one topic's messages inside the delivery's database transaction.
///
/// `C` is the backend's connection (`sqlx::PgConnection` or
/// `sqlx::SqliteConnection`); write through it and the writes commit with the
/// receipt and the completion, or roll back with them.
pub trait TransactionalHandler<C>: Send + Sync + 'static {
    /// The payload type messages decode into.
    type Payload: DeserializeOwned + Send + Sync + 'static;

    /// Applies one message through `conn`, inside the delivery's transaction.
    fn handle(
        &self,
        message: &Message<Self::Payload>,
        conn: &mut C,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A [`Handler`] made from an async closure.
pub struct FnHandler<T, F> {
    function: F,
    payload: PhantomData<fn() -> T>,
}

/// Wraps an async closure `|message: Message<T>| async { ... }` as a [`Handler`].
pub fn handler_fn<T, F, Fut>(function: F) -> FnHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    FnHandler {
        function,
        payload: PhantomData,
    }
}

impl<T, F, Fut> Handler for FnHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Payload = T;

    fn handle(&self, message: Message<T>) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (self.function)(message)
    }
}

/// Decodes a delivery into a typed message; a decode error is permanent.
pub(crate) fn decode<T: DeserializeOwned>(
    delivery: &ClaimedDelivery,
) -> Result<Message<T>, HandlerError> {
    let payload = serde_json::from_str(&delivery.payload).map_err(|error| {
        HandlerError::permanent(format!(
            "payload of {} v{} does not decode into {}: {error}",
            delivery.topic,
            delivery.schema_version,
            std::any::type_name::<T>()
        ))
    })?;
    Ok(Message {
        id: delivery.message_id,
        tenant: delivery.tenant.clone(),
        topic: delivery.topic.clone(),
        schema_version: delivery.schema_version,
        payload,
        headers: delivery.headers.clone(),
        ordering_key: delivery.ordering_key.clone(),
        priority: delivery.priority,
        subscription: delivery.subscription.clone(),
        attempt: delivery.attempt,
        occurred_at: delivery.occurred_at,
        enqueued_at: delivery.enqueued_at,
    })
}

/// What running a route's handler needs from the worker.
pub(crate) enum Prepared<C> {
    /// A future that makes the effect outside the database.
    Plain(BoxFuture<'static, Result<(), HandlerError>>),
    /// Work to run inside the delivery's transaction.
    Transactional(TxWork<C>),
}

/// A handler with its payload type erased.
pub(crate) trait ErasedHandler<C>: Send + Sync {
    fn prepare(&self, delivery: &ClaimedDelivery) -> Result<Prepared<C>, HandlerError>;

    /// Whether [`ErasedHandler::prepare`] gives work for the delivery's transaction.
    fn is_transactional(&self) -> bool;
}

pub(crate) struct PlainRoute<H>(pub(crate) Arc<H>);

impl<C, H: Handler> ErasedHandler<C> for PlainRoute<H> {
    fn prepare(&self, delivery: &ClaimedDelivery) -> Result<Prepared<C>, HandlerError> {
        let message = decode::<H::Payload>(delivery)?;
        let handler = Arc::clone(&self.0);
        Ok(Prepared::Plain(Box::pin(async move {
            handler.handle(message).await
        })))
    }

    fn is_transactional(&self) -> bool {
        false
    }
}

pub(crate) struct TransactionalRoute<H>(pub(crate) Arc<H>);

pub(crate) fn transactional_work<C, F>(work: F) -> TxWork<C>
where
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<(), HandlerError>> + Send + 'static,
{
    Box::new(work)
}

impl<C, H> ErasedHandler<C> for TransactionalRoute<H>
where
    C: Send + 'static,
    H: TransactionalHandler<C>,
{
    fn prepare(&self, delivery: &ClaimedDelivery) -> Result<Prepared<C>, HandlerError> {
        let message = decode::<H::Payload>(delivery)?;
        let handler = Arc::clone(&self.0);
        Ok(Prepared::Transactional(transactional_work(
            move |conn: &mut C| -> BoxFuture<'_, Result<(), HandlerError>> {
                Box::pin(async move { handler.handle(&message, conn).await })
            },
        )))
    }

    fn is_transactional(&self) -> bool {
        true
    }
}

/// An upcaster with its error type erased: the old payload in, the new one
/// out, or why it could not be upcast.
pub(crate) type UpcastFn =
    Arc<dyn Fn(serde_json::Value) -> Result<serde_json::Value, String> + Send + Sync>;

/// One registered upcaster of a topic: from one schema version to a later one.
#[derive(Clone)]
pub(crate) struct UpcastStep {
    pub(crate) from: i32,
    pub(crate) to: i32,
    pub(crate) upcast: UpcastFn,
}

/// Runs the deliveries of an older schema version through a chain of
/// upcasters, then hands them to the handler of the version the chain ends at,
/// as if they had been published at that version.
pub(crate) struct UpcastRoute<C> {
    pub(crate) topic: String,
    pub(crate) steps: Vec<UpcastStep>,
    pub(crate) target: Arc<dyn ErasedHandler<C>>,
}

impl<C> ErasedHandler<C> for UpcastRoute<C> {
    fn prepare(&self, delivery: &ClaimedDelivery) -> Result<Prepared<C>, HandlerError> {
        let mut payload: serde_json::Value =
            serde_json::from_str(&delivery.payload).map_err(|error| {
                HandlerError::permanent(format!(
                    "payload of {} v{} is not JSON to upcast: {error}",
                    delivery.topic, delivery.schema_version
                ))
            })?;
        for step in &self.steps {
            // A panicking upcaster fails like a failing one: it is named.
            payload =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (step.upcast)(payload)))
                    .unwrap_or_else(|_| Err("the upcaster panicked".to_owned()))
                    .map_err(|error| {
                        HandlerError::permanent(format!(
                            "upcaster of {} v{} → v{} failed: {error}",
                            self.topic, step.from, step.to
                        ))
                    })?;
        }
        let mut upcast = delivery.clone();
        upcast.payload = payload.to_string();
        // The version the chain ends at (a route always has a step).
        upcast.schema_version = self
            .steps
            .last()
            .map_or(delivery.schema_version, |step| step.to);
        self.target.prepare(&upcast)
    }

    fn is_transactional(&self) -> bool {
        self.target.is_transactional()
    }
}
