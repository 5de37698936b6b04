//! Courier's daemon as a library: the configuration, the HTTP API (with its
//! auth, metrics and OpenAPI document), webhook delivery, and the serve loop
//! that ties them to a database.
//!
//! The `courier serve` command is a thin wrapper over [`run`].

pub mod config;

pub use config::{Config, ConfigError};
