//! Courier's daemon as a library: the configuration, the HTTP API (with its
//! auth, metrics and OpenAPI document) and its streams routes, webhook
//! delivery for subscriptions and stream subscriptions, relays to Redis
//! streams, NATS JetStream and native streams, and the serve loop that ties
//! them to a database and a stream backend.
//!
//! `courier serve` is a thin wrapper over [`run`]:
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let config = courier_server::Config::load(None)?; // defaults + COURIER_* variables
//! let telemetry = courier_server::init_telemetry(&config)?; // logs, and `[otel]` export
//! courier_server::run(config, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! telemetry.shutdown().await; // the last spans
//!
//! # Ok(()) }
//! ```

pub mod api;
pub mod auth;
pub mod config;
pub mod cursor;
pub mod daemon;
pub mod dashboard;
pub mod error;
pub mod guard;
pub mod http_server;
pub mod limits;
pub mod metrics;
pub mod outcomes;
pub mod redact;
pub mod relay;
pub mod sessions;
pub mod store;
pub mod stream_api;
pub mod stream_store;
pub mod stream_subscriptions;
pub mod stream_webhook;
pub mod telemetry;
pub mod throughput;
pub mod webhook;

pub use api::{metrics_router, openapi, router, ApiState};
pub use auth::{Authenticator, Principal, TenantScope};
pub use config::{Config, ConfigError};
pub use daemon::{bind, init_logging, run, Running, ServeError};
pub use error::ApiError;
pub use relay::{NativeRelay, NatsRelay, RedisRelay};
pub use stream_store::ApiStreams;
pub use telemetry::{init_telemetry, Telemetry, TelemetryError};
pub use webhook::WebhookHandler;

/// A message payload exactly as it was published: the daemon's targets
/// (webhooks, relays) take their messages' payloads in this form, so what
/// they send is the stored JSON text, byte for byte, never a re-encoding of
/// it (which would turn integers beyond 64 bits into floats, change the last
/// digit of some floats and collapse duplicate keys).
pub type RawPayload = Box<serde_json::value::RawValue>;
