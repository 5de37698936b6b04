//! `courier serve` as a user runs it: the real binary on a free port, a real
//! webhook receiver, publishing over HTTP and from the CLI, `courier status`,
//! SIGTERM; and two daemons sharing one PostgreSQL.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use courier_testkit::{eventually, Backend, PgFixture};

const BINARY: &str = env!("CARGO_BIN_EXE_courier");

/// Counts deliveries per `webhook-id`.
#[derive(Clone, Default)]
struct Receiver {
    seen: Arc<Mutex<HashMap<String, u32>>>,
}

impl Receiver {
    fn total(&self) -> u32 {
        self.seen.lock().map(|s| s.values().sum()).unwrap_or(0)
    }
    fn distinct(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap) -> &'static str {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if let Ok(mut seen) = receiver.seen.lock() {
        *seen.entry(id).or_insert(0) += 1;
    }
    "ok"
}

async fn start_receiver() -> anyhow::Result<(Receiver, u16)> {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let app = axum::Router::new()
        .route("/hook", post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((receiver, port))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn config(hook_port: u16) -> String {
    format!(
        r#"
[[subscriptions]]
name = "hook"
topics = ["invoice.*"]
concurrency = 16
[subscriptions.target]
type = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#
    )
}

/// `courier serve` with `dir/courier.toml`, in `dir`, its output discarded,
/// killed if dropped; `env` added to the test's environment.
fn serve_command(dir: &std::path::Path, env: &[(&str, String)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BINARY);
    command
        .arg("serve")
        .arg("--config")
        .arg(dir.join("courier.toml"))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

fn serve(dir: &std::path::Path, env: &[(&str, String)]) -> anyhow::Result<tokio::process::Child> {
    Ok(serve_command(dir, env).spawn()?)
}

async fn ready(port: u16) -> bool {
    eventually(Duration::from_secs(30), || async move {
        matches!(
            reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await,
            Ok(response) if response.status().is_success()
        )
    })
    .await
}

fn terminate(child: &tokio::process::Child) -> anyhow::Result<()> {
    let pid = child.id().ok_or_else(|| anyhow::anyhow!("no pid"))?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM failed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_sqlite_delivers_what_curl_and_the_cli_publish_and_stops_on_sigterm(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (receiver, hook_port) = start_receiver().await?;
    std::fs::write(dir.path().join("courier.toml"), config(hook_port))?;
    let port = free_port()?;
    let mut daemon = serve(
        dir.path(),
        &[("COURIER_LISTEN", format!("127.0.0.1:{port}"))],
    )?;
    assert!(ready(port).await, "the daemon never became ready");

    let client = reqwest::Client::new();
    let response = client
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .header("content-type", "application/json")
        .body(r#"{"tenant":"acme","topic":"invoice.paid","payload":{"invoice":7}}"#)
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 201);
    let cli = std::process::Command::new(BINARY)
        .args([
            "publish",
            "--tenant",
            "acme",
            "--topic",
            "invoice.void",
            "--payload",
            "{}",
        ])
        .current_dir(dir.path())
        .output()?;
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(eventually(Duration::from_secs(20), || async { receiver.total() == 2 }).await);

    let status = std::process::Command::new(BINARY)
        .arg("status")
        .current_dir(dir.path())
        .output()?;
    assert!(status.status.success());
    assert!(String::from_utf8_lossy(&status.stdout).contains("every delivery is done"));

    // The same verbs through the daemon's API.
    let url = format!("http://127.0.0.1:{port}");
    let remote = |args: &[&str]| {
        std::process::Command::new(BINARY)
            .args(args)
            .args(["--url", &url])
            .current_dir(dir.path())
            .output()
    };
    let listed = remote(&["subscriptions", "list"])?;
    assert!(listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stdout).contains("\"hook\""));
    let shown = remote(&["subscriptions", "show", "hook"])?;
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("\"backlog\""),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let paused = remote(&["subscriptions", "pause", "hook"])?;
    assert!(String::from_utf8_lossy(&paused.stdout).contains("\"paused\": true"));
    let stats = remote(&["status"])?;
    assert!(stats.status.success());
    let refused = remote(&["dlq", "list", "--topic", "not a topic"])?;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("topic"));
    // `dlq groups` through the API: its document (every delivery succeeded).
    let groups = remote(&["dlq", "groups", "--topic", "t"])?;
    assert!(
        groups.status.success(),
        "{}",
        String::from_utf8_lossy(&groups.stderr)
    );
    assert!(
        String::from_utf8_lossy(&groups.stdout).contains("\"items\": []"),
        "{}",
        String::from_utf8_lossy(&groups.stdout)
    );
    // `dlq show` through the API: an unknown id is the API's 404.
    let unknown = remote(&["dlq", "show", "999999"])?;
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no dead letter 999999"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    terminate(&daemon)?;
    let exit = tokio::time::timeout(Duration::from_secs(30), daemon.wait()).await??;
    assert!(exit.success(), "serve exited with {exit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_postgres_deliver_each_message_once_even_when_one_gets_sigterm(
) -> anyhow::Result<()> {
    let pg = PgFixture::new().await?;
    let dir = tempfile::tempdir()?;
    let (receiver, hook_port) = start_receiver().await?;
    std::fs::write(dir.path().join("courier.toml"), config(hook_port))?;
    let env = |port: u16| {
        vec![
            ("COURIER_LISTEN", format!("127.0.0.1:{port}")),
            ("COURIER_DATABASE_URL", courier_testkit::database_url()),
            ("COURIER_SCHEMA", pg.schema.clone()),
        ]
    };
    let (port_a, port_b) = (free_port()?, free_port()?);
    let mut first = serve(dir.path(), &env(port_a))?;
    let mut second = serve(dir.path(), &env(port_b))?;
    assert!(ready(port_a).await && ready(port_b).await);

    let n = 5000;
    let ndjson: String = (0..n)
        .map(|i| {
            format!(
                "{{\"tenant\":\"acme\",\"topic\":\"invoice.paid\",\"payload\":{{\"n\":{i}}}}}\n"
            )
        })
        .collect();
    let mut publish = tokio::process::Command::new(BINARY)
        .args([
            "publish",
            "--database-url",
            &courier_testkit::database_url(),
            "--schema",
            &pg.schema,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = publish.stdin.take() {
        use tokio::io::AsyncWriteExt;
        stdin.write_all(ndjson.as_bytes()).await?;
    }
    assert!(publish.wait().await?.success());

    // Stop one daemon mid-run; the other finishes the work.
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.total() >= 500
        })
        .await
    );
    terminate(&first)?;
    let exit = tokio::time::timeout(Duration::from_secs(60), first.wait()).await??;
    assert!(exit.success(), "the first daemon exited with {exit}");
    let drained = eventually(Duration::from_secs(120), || async {
        matches!(pg.scalar("SELECT count(*) FROM deliveries").await, Ok(0))
    })
    .await;
    terminate(&second)?;
    let _ = tokio::time::timeout(Duration::from_secs(60), second.wait()).await;
    assert!(drained, "not every message was delivered");
    assert_eq!(pg.scalar("SELECT count(*) FROM deliveries").await?, 0);
    assert_eq!(receiver.distinct(), usize::try_from(n)?);
    assert_eq!(
        receiver.total(),
        u32::try_from(n)?,
        "a message reached the endpoint twice"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_demo_delivers_sample_events_within_seconds() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("courier.toml"), "")?;
    let port = free_port()?;
    let mut command = tokio::process::Command::new(BINARY);
    command
        .args(["serve", "--demo"])
        .current_dir(dir.path())
        .env("COURIER_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let daemon = command.spawn()?;
    assert!(ready(port).await);
    let database = dir.path().join("courier.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", database.display())).await?;
    let delivered = eventually(Duration::from_secs(20), || async {
        matches!(
            // What the admin view calls completed: a message the subscription
            // receives with no open delivery (a webhook writes no receipt).
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM messages m
                 WHERE EXISTS (SELECT 1 FROM subscription_topics t
                               WHERE t.subscription = 'demo'
                                 AND (t.pattern = m.topic
                                      OR (t.prefix IS NOT NULL
                                          AND substr(m.topic, 1, length(t.prefix)) = t.prefix))
                                 AND (m.created_at, m.id) >= (t.since, t.since_id))
                   AND NOT EXISTS (SELECT 1 FROM deliveries d
                                   WHERE d.message_id = m.id AND d.subscription = 'demo')"
            )
            .fetch_one(&pool)
            .await,
            Ok(n) if n >= 2
        )
    })
    .await;
    // What a new user opening the dashboard sees: the page, and the demo's
    // deliveries in the throughput chart and the overview's rows.
    let page = reqwest::get(format!("http://127.0.0.1:{port}/")).await?;
    let page_ok = page.status().is_success();
    let page = page.text().await?;
    let throughput: serde_json::Value = serde_json::from_str(
        &reqwest::get(format!("http://127.0.0.1:{port}/v1/throughput"))
            .await?
            .text()
            .await?,
    )?;
    let stats: serde_json::Value = serde_json::from_str(
        &reqwest::get(format!("http://127.0.0.1:{port}/v1/stats"))
            .await?
            .text()
            .await?,
    )?;
    terminate(&daemon)?;
    assert!(delivered, "the demo subscription received nothing");
    assert!(page_ok && page.contains("/ui/app.js"), "{page}");
    let charted: u64 = throughput["delivered"]
        .as_array()
        .map_or(0, |series| series.iter().filter_map(|n| n.as_u64()).sum());
    assert!(charted >= 2, "{throughput}");
    let demo_row = stats["items"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["subscription"] == "demo"));
    assert!(
        demo_row.is_some_and(|row| row["completed_last_hour"].as_u64() >= Some(2)),
        "{stats}"
    );
    Ok(())
}

/// `courier serve --database-url … --listen …` serves without a config file
/// or environment, the flags winning over COURIER_DATABASE_URL and
/// COURIER_LISTEN; a bad flag is refused naming the key, before anything
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_takes_the_database_and_the_listen_address_as_flags() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let db = dir.path().join("flags.db");
    let mut daemon = tokio::process::Command::new(BINARY)
        .args(["serve", "--database-url"])
        .arg(&db)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("COURIER_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("COURIER_LISTEN", "127.0.0.1:1")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    assert!(ready(port).await, "the daemon answers on --listen");
    assert!(db.exists(), "the database is the one --database-url names");
    terminate(&daemon)?;
    assert!(daemon.wait().await?.success());

    let refused = std::process::Command::new(BINARY)
        .args(["serve", "--database-url", "mysql://x"])
        .current_dir(dir.path())
        .output()?;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("database_url"), "{stderr}");
    Ok(())
}

/// The environment the process `pid` started with (`/proc/{pid}/environ`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn environ(pid: u32) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|byte| *byte == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| String::from_utf8_lossy(entry).into_owned())
        .collect())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_caps_malloc_arenas_in_its_own_process_unless_the_environment_chose(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("courier.toml"), config(free_port()?))?;
    // The environment a daemon starts with, and the cap it should run with.
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: [Case; 3] = [
        // Nothing chosen: the binary restarts itself with the cap.
        (&[], Some("MALLOC_ARENA_MAX=2")),
        // An operator's value is kept.
        (&[("MALLOC_ARENA_MAX", "4")], Some("MALLOC_ARENA_MAX=4")),
        // Already restarted, and glibc dropped the variable (as it does for
        // programs with file capabilities): no second restart.
        (&[("ARENAS_CAPPED_BY_COURIER", "1")], None),
    ];
    for (env, expected) in cases {
        let port = free_port()?;
        let mut daemon = serve_command(
            dir.path(),
            &[("COURIER_LISTEN", format!("127.0.0.1:{port}"))],
        )
        .env_remove("MALLOC_ARENA_MAX")
        .env_remove("ARENAS_CAPPED_BY_COURIER")
        .envs(env.iter().copied())
        .spawn()?;
        let pid = daemon.id().ok_or_else(|| anyhow::anyhow!("no pid"))?;
        assert!(ready(port).await, "the daemon never became ready ({env:?})");
        // The process we started serves (it restarted itself in place, not as
        // a child), its environment is the one glibc read at start, and it
        // keeps its name for ps, pgrep and top.
        let environment = environ(pid)?;
        let arenas: Vec<&str> = environment
            .iter()
            .filter(|entry| entry.starts_with("MALLOC_ARENA_MAX="))
            .map(String::as_str)
            .collect();
        assert_eq!(arenas, expected.into_iter().collect::<Vec<_>>(), "{env:?}");
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
        assert_eq!(name.trim_end(), "courier", "{env:?}");
        terminate(&daemon)?;
        let status = tokio::time::timeout(Duration::from_secs(30), daemon.wait()).await??;
        assert!(status.success(), "the daemon ended with {status} ({env:?})");
    }
    Ok(())
}
