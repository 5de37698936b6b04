//! Drives the real `courier` binary: quick bench runs on SQLite and
//! PostgreSQL, `migrate` into a fresh schema, and input that must be refused.
//! No timing is asserted anywhere: a bench run passes when it did all its work.

// A test fails by panicking; its helpers' `expect`s are those failures.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn courier(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(args)
        .current_dir(dir)
        .env_remove("COURIER_DATABASE_URL")
        .output()
        .expect("the courier binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fresh_schema(test: &str) -> String {
    format!("cli_{test}_{:08x}", fastrand::u32(..))
}

async fn schema_exists(schema: &str) -> bool {
    let pool = sqlx::PgPool::connect(&database_url())
        .await
        .expect("connect");
    let exists =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&pool)
            .await
            .expect("query");
    pool.close().await;
    exists
}

async fn drop_schema(schema: &str) {
    let pool = sqlx::PgPool::connect(&database_url())
        .await
        .expect("connect");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&pool)
        .await
        .expect("drop");
    pool.close().await;
}

#[test]
fn quick_bench_on_sqlite_prints_the_table_and_removes_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = courier(
        dir.path(),
        &["bench", "--quick", "--baseline", "--no-progress"],
    );
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let table = stdout(&output);
    for id in [
        "enqueue.single_1",
        "enqueue.single_16",
        "enqueue.batch_1000",
        "drain.noop",
        "drain.exactly_once",
        "drain.two_subscriptions",
        "drain.ordering_keys",
        "drain.tenants",
        "latency.wake",
        "latency.poll",
        "not measured yet: fairness, held-xmin",
    ] {
        assert!(table.contains(id), "{id} missing from:\n{table}");
    }
    assert!(!dir.path().join("courier-bench.db").exists());
}

#[tokio::test]
async fn quick_bench_on_postgres_prints_json_and_drops_its_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("bench");
    let url = database_url();
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--baseline",
            "--json",
            "--database-url",
            &url,
            "--schema",
            &schema,
        ],
    );
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let report: serde_json::Value =
        serde_json::from_str(&stdout(&output)).expect("stdout is one JSON document");
    assert_eq!(report["backend"], "postgres");
    let measurements = report["measurements"].as_array().expect("measurements");
    assert_eq!(measurements.len(), 10, "{report:#}");
    let noop = measurements
        .iter()
        .find(|m| m["id"] == "drain.noop")
        .expect("drain.noop");
    assert_eq!(noop["count"], 2000);
    assert!(noop["ratio"].is_number(), "{noop:#}");
    assert!(report["bars"]
        .as_array()
        .is_some_and(|bars| !bars.is_empty()));
    assert!(
        !schema_exists(&schema).await,
        "the bench schema was left behind"
    );
}

#[tokio::test]
async fn migrate_creates_courier_tables_in_a_fresh_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("migrate");
    let url = database_url();
    let output = courier(
        dir.path(),
        &["migrate", "--database-url", &url, "--schema", &schema],
    );
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(stdout(&output).contains(&schema), "{}", stdout(&output));
    assert!(schema_exists(&schema).await);
    // A second run finds the schema current and succeeds.
    let again = courier(
        dir.path(),
        &["migrate", "--database-url", &url, "--schema", &schema],
    );
    assert!(again.status.success(), "stderr: {}", stderr(&again));
    drop_schema(&schema).await;
}

#[test]
fn migrate_refuses_a_bad_schema_name_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = courier(
        dir.path(),
        &[
            "migrate",
            "--database-url",
            &database_url(),
            "--schema",
            "Robert'); DROP",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(message.contains("invalid schema"), "{message}");
    assert_eq!(message.trim().lines().count(), 1, "one line: {message}");
}

#[tokio::test]
async fn bench_refuses_a_schema_that_already_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("taken");
    let url = database_url();
    let created = courier(
        dir.path(),
        &["migrate", "--database-url", &url, "--schema", &schema],
    );
    assert!(created.status.success(), "stderr: {}", stderr(&created));
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--database-url",
            &url,
            "--schema",
            &schema,
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("already exists"),
        "{}",
        stderr(&output)
    );
    assert!(
        schema_exists(&schema).await,
        "the bench dropped a schema it did not create"
    );
    drop_schema(&schema).await;
}

#[test]
fn bench_refuses_to_delete_an_existing_sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("app.db"), b"precious").expect("write");
    let output = courier(
        dir.path(),
        &["bench", "--quick", "--database-url", "app.db"],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("already exists"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read(dir.path().join("app.db")).expect("read"),
        b"precious"
    );
}
