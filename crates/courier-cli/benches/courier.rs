//! `cargo bench -p courier-cli`: `courier bench --quick` (every scenario in
//! `all`) through [`courier_cli::bench::run`], on SQLite in a temporary
//! directory and, when it is reachable, on PostgreSQL (`DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, in a schema of its own that is
//! dropped at the end). Prints each report's table. For full-size runs and
//! the other options use the `courier bench` command (see BENCHMARKS.md).

use std::time::Duration;

use anyhow::Context;
use courier_cli::bench::{self, BenchOptions};
use courier_cli::database::Database;

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench` (and any filter); this target has no filters.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(benches())
}

fn quick(database: Database) -> BenchOptions {
    let mut options = BenchOptions::new(database);
    options.quick = true;
    options.baseline = true;
    options
}

async fn benches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let path = dir.path().join("courier-bench.db");
    let path = path
        .to_str()
        .context("the temporary directory's path is not UTF-8")?
        .to_owned();
    let report = bench::run(&quick(Database::Sqlite { path }))
        .await
        .context("the SQLite bench")?;
    println!("{}", report.to_table());

    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    match reachable(&url).await {
        Ok(()) => {
            let report = bench::run(&quick(Database::Postgres { url }))
                .await
                .context("the PostgreSQL bench")?;
            println!("{}", report.to_table());
        }
        Err(error) => println!("PostgreSQL skipped: {url} is not reachable ({error:#})"),
    }
    Ok(())
}

/// Whether a connection to `url` opens within 5 seconds.
async fn reachable(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let connection = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(url))
        .await
        .context("timed out")??;
    connection.close().await?;
    Ok(())
}
