//! The example run as a user runs it: its binary, on SQLite and PostgreSQL,
//! including a worker killed with SIGKILL mid-run and a full redelivery.

use std::process::Output;
use std::time::Duration;

use courier_testkit::{eventually, Backend, PgFixture, SqliteFixture};

const BINARY: &str = env!("CARGO_BIN_EXE_practice-sessions");

fn run(args: &[&str]) -> anyhow::Result<Output> {
    let output = std::process::Command::new(BINARY)
        .args(args)
        .env_remove("DATABASE_URL")
        .output()?;
    Ok(output)
}

fn must(args: &[&str]) -> anyhow::Result<String> {
    let output = run(args)?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

async fn kill_mid_run_then_redeliver_everything<B: Backend>(
    backend: &B,
    target: &[&str],
    redeliver_sql: &str,
) -> anyhow::Result<()> {
    let with = |extra: &[&str]| -> Vec<String> {
        extra
            .iter()
            .chain(target.iter())
            .map(|s| (*s).to_owned())
            .collect()
    };
    let args = |v: &Vec<String>| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
    let submit = with(&["submit", "--sessions", "300"]);
    must(&submit.iter().map(String::as_str).collect::<Vec<_>>())?;
    let work = with(&["work", "--lease-ms", "1500", "--handler-delay-ms", "20"]);
    let mut victim = tokio::process::Command::new(BINARY)
        .args(&work)
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .spawn()?;
    let progressed = eventually(Duration::from_secs(60), || async {
        matches!(backend.scalar("SELECT count(*) FROM receipts").await, Ok(n) if n >= 30)
    })
    .await;
    victim.kill().await?; // SIGKILL: no graceful shutdown, leases left behind
    assert!(
        progressed,
        "the first worker made no progress ({})",
        args(&work)
    );
    let done = backend.scalar("SELECT count(*) FROM receipts").await?;
    assert!(done < 300, "the worker finished before it could be killed");
    must(
        &with(&["work", "--exit-when-drained", "--lease-ms", "1500"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )?;
    let verified = must(
        &with(&["verify"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )?;
    assert!(verified.contains("differences: 0"), "{verified}");
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 300);

    // Deliver every message a second time: the receipts must skip every effect.
    let owed = backend.execute(redeliver_sql).await?;
    assert_eq!(owed, 300);
    must(
        &with(&["work", "--exit-when-drained"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )?;
    let verified = must(
        &with(&["verify"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )?;
    assert!(verified.contains("differences: 0"), "{verified}");
    assert_eq!(backend.scalar("SELECT count(*) FROM receipts").await?, 300);
    assert_eq!(backend.scalar("SELECT count(*) FROM deliveries").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_run_command_counts_every_wrong_answer_exactly_on_sqlite() -> anyhow::Result<()>
{
    let dir = tempfile_dir()?;
    let db = dir.join("practice.db");
    let db = db.to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
    let out = must(&["run", "--sessions", "150", "--database-url", db])?;
    assert!(out.contains("every wrong_count is exact"), "{out}");
    // Running it again adds 150 more sessions; every count is still exact.
    let out = must(&["run", "--sessions", "150", "--database-url", db])?;
    assert!(out.contains("reports: 300  receipts: 300"), "{out}");
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("practice-{}", uuid_like()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_and_a_full_redelivery_leave_every_count_exact_on_sqlite(
) -> anyhow::Result<()> {
    let sqlite = SqliteFixture::new().await?;
    let path = sqlite
        .path
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("path"))?
        .to_owned();
    kill_mid_run_then_redeliver_everything(
        &sqlite,
        &["--database-url", &path],
        "INSERT INTO deliveries (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at)
         SELECT id, 'wrong_questions_v1', tenant, topic, schema_version, ordering_key, 0 FROM messages",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_and_a_full_redelivery_leave_every_count_exact_on_postgres(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let url = courier_testkit::database_url();
    kill_mid_run_then_redeliver_everything(
        &pg,
        &["--database-url", &url, "--schema", &pg.schema],
        "INSERT INTO deliveries (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at)
         SELECT id, 'wrong_questions_v1', tenant, topic, schema_version, ordering_key, now() FROM messages",
    )
    .await
}
