//! The example run as a user runs it, its binary unchanged on every stream
//! backend: native streams on SQLite and on PostgreSQL, and Redis Streams
//! with the runs and receipts in SQLite. Each run appends the events, lets
//! both workflows start their runs (one of them under a quota that defers)
//! and exits non-zero unless every event started exactly one run of each.

use std::process::Output;

use courier_testkit::PgFixture;

const BINARY: &str = env!("CARGO_BIN_EXE_handler-workflows");

fn run(args: &[&str]) -> anyhow::Result<Output> {
    Ok(std::process::Command::new(BINARY)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .output()?)
}

fn must(args: &[&str]) -> anyhow::Result<String> {
    let output = run(args)?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    anyhow::ensure!(
        stdout.contains("ok: every event started exactly one run"),
        "{stdout}"
    );
    Ok(stdout)
}

#[test]
fn native_streams_on_sqlite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("workflows.db");
    let db = db
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("path is not UTF-8"))?;
    let out = must(&[
        "--database-url",
        db,
        "--events",
        "600",
        "--quota-per-second",
        "300",
    ])?;
    assert!(out.contains("enrich: 600 runs for 600 events"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_streams_on_postgres() -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let url = courier_testkit::database_url();
    let out = must(&[
        "--database-url",
        &url,
        "--schema",
        &pg.schema,
        "--events",
        "600",
        "--quota-per-second",
        "300",
    ])?;
    assert!(out.contains("notify: 600 runs for 600 events"), "{out}");
    Ok(())
}

#[test]
fn redis_streams_with_runs_in_sqlite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("workflows.db");
    let db = db
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("path is not UTF-8"))?;
    let out = must(&[
        "--database-url",
        db,
        "--streams",
        "redis",
        "--redis-url",
        &courier_testkit::redis_url(),
        "--events",
        "600",
        "--quota-per-second",
        "300",
    ])?;
    assert!(out.contains("enrich: 600 runs for 600 events"), "{out}");
    Ok(())
}
