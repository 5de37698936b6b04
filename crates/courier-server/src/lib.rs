//! Courier's daemon as a library: the configuration, the HTTP API (with its
//! auth, metrics and OpenAPI document), webhook delivery, and the serve loop
//! that ties them to a database.
//!
//! The `courier serve` command is a thin wrapper over [`run`].

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod metrics;
pub mod store;

pub use api::{openapi, router, ApiState};
pub use auth::{Authenticator, Principal, TenantScope};
pub use config::{Config, ConfigError};
pub use error::ApiError;
