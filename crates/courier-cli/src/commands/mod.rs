//! The operator verbs — publish, cancel, status, dead letters and
//! subscriptions — each written once, against one [`Target`]: the database
//! directly (`--database-url`, `--schema`, the default) or a running daemon's
//! API (`--url`, `--token`). A verb's local and remote paths sit side by
//! side in its one function; locally it prints tables and lines for people
//! (`status --json` the API's shape), through a daemon the API's JSON,
//! pretty-printed. The streams verbs, built the same way around
//! [`StreamsTarget`](crate::streams::StreamsTarget), are in
//! [`crate::streams`].

pub mod cancel;
pub mod dlq;
pub mod publish;
pub mod status;
pub mod subscriptions;

pub use cancel::cancel;
pub use publish::{publish, PublishArgs};
pub use status::status;

use crate::database::Database;
use crate::ops::{self, Remote, RemoteArgs, Store};

/// Which database the operator verbs work on, or which daemon.
#[derive(clap::Args)]
pub struct DbArgs {
    /// `postgres://…`, or a SQLite file path.
    #[arg(long, env = "COURIER_DATABASE_URL", default_value = "courier.db")]
    pub database_url: String,
    /// PostgreSQL schema holding Courier's tables.
    #[arg(long, env = "COURIER_SCHEMA", default_value = courier::postgres::DEFAULT_SCHEMA)]
    pub schema: String,
    /// `--url`, `--token`, `--timeout-ms`: a running daemon instead.
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Where a verb goes: a running daemon's API, or the database directly.
pub enum Target {
    /// A running daemon's API (`--url`).
    Remote(Remote),
    /// The database (`--database-url`, `--schema`); not opened yet.
    Local(LocalStore),
}

impl Target {
    /// The daemon of `--url`, else the database of `--database-url`. Nothing
    /// is connected to yet: a verb checks its own arguments first, and opens
    /// the database with [`LocalStore::open`] only when it gets there.
    pub fn open(args: &DbArgs) -> anyhow::Result<Self> {
        Ok(match args.remote.remote()? {
            Some(remote) => Self::Remote(remote),
            None => Self::Local(LocalStore {
                database_url: args.database_url.clone(),
                schema: args.schema.clone(),
            }),
        })
    }

    /// The daemon, for a verb only the API has; without `--url`, an error
    /// saying it is required.
    pub fn remote(&self) -> anyhow::Result<&Remote> {
        match self {
            Self::Remote(remote) => Ok(remote),
            Self::Local(_) => anyhow::bail!("invalid arguments: --url is required here"),
        }
    }
}

/// The database a verb works on without `--url`, as the command line named it.
pub struct LocalStore {
    database_url: String,
    schema: String,
}

impl LocalStore {
    /// Opens the database; refuses one that `courier migrate` (or `serve`)
    /// never set up (see [`Store::open`]).
    pub async fn open(&self) -> anyhow::Result<Store> {
        Store::open(&Database::parse(&self.database_url)?, &self.schema).await
    }
}

/// `POST path` with an empty JSON object to the daemon; prints its answer.
async fn post_empty(remote: &Remote, path: &str) -> anyhow::Result<()> {
    ops::print_json(&remote.post(path, serde_json::json!({})).await?)
}
