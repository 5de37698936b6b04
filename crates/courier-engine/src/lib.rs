//! Courier's worker runtime, generic over any [`OutboxStore`](courier_core::OutboxStore).
//!
//! A [`Worker`] serves one subscription: it claims batches of deliveries for
//! the (topic, schema version) routes it has handlers for, runs each handler
//! under a lease that a heartbeat keeps extending, and settles the outcome
//! (complete, retry with backoff, or dead letter) in batched writes fenced by
//! the lease token. Transactional handlers run inside the delivery's database
//! transaction with its receipt and completion, so their effect happens once.
//!
//! Modules, one service each: `config` (settings, defaults and their
//! checks), `builder` (handler registration), [`handler`] (typed handlers and
//! decoding), `fetcher` (the claim loop), `executor` (running handlers under
//! their leases), `settle` (batched completion), `heartbeat` (lease
//! extension), `in_flight` (the lease ledger they share), [`trace_context`]
//! (the producer's trace carried through the outbox), `worker` (wires
//! them together, start and shutdown), [`maintenance`] (rescuer and pruner).

mod builder;
mod config;
mod executor;
mod fetcher;
pub mod handler;
mod heartbeat;
mod in_flight;
pub mod maintenance;
mod metrics_names;
mod settle;
pub mod stream_worker;
pub mod trace_context;
mod worker;

pub use builder::WorkerBuilder;
pub use config::{
    WorkerConfig, CATCH_ALL_TOPIC, CATCH_ALL_VERSION, DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY,
    DEFAULT_HANDLER_TIMEOUT, DEFAULT_LEASE, DEFAULT_POLL_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_TRANSACTION_BATCH_SIZE,
};
pub use handler::{handler_fn, Handler, TransactionalHandler};
pub use maintenance::{Maintenance, MaintenanceConfig};
pub use stream_worker::{
    stream_handler_fn, StreamHandler, StreamMessage, StreamStep, StreamSubscription,
    StreamSubscriptionConfig, StreamSubscriptionHandle, TransactionalStreamHandler,
};
pub use worker::{Worker, WorkerHandle};

/// Why a worker could not be built or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The configuration was refused.
    #[error(transparent)]
    Invalid(#[from] courier_core::ValidationError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] courier_core::StoreError),
}
