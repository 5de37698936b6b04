//! `courier streams` as a user runs it: the real binary against native
//! streams in SQLite and PostgreSQL, against Redis, and through a running
//! daemon's API (`--url`, `--token`); the same verbs, the same JSON, the
//! same refusals naming the field.

// A test fails by panicking; its helpers' `expect`s are those failures.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const BINARY: &str = env!("CARGO_BIN_EXE_courier");

/// Runs `courier streams {verb} --tenant a --stream orders {target} {args}`
/// with `stdin` on standard input.
async fn streams(dir: &Path, target: &[String], verb: &str, args: &[&str], stdin: &str) -> Output {
    let mut command = tokio::process::Command::new(BINARY);
    command
        .args(["streams", verb, "--tenant", "a", "--stream", "orders"])
        .args(target)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for variable in [
        "COURIER_DATABASE_URL",
        "COURIER_SCHEMA",
        "COURIER_STREAMS__BACKEND",
        "COURIER_REDIS__URL",
        "COURIER_REDIS__KEY_PREFIX",
        "COURIER_URL",
        "COURIER_TOKEN",
    ] {
        command.env_remove(variable);
    }
    let mut child = command.spawn().expect("the courier binary runs");
    if let Some(mut input) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        input.write_all(stdin.as_bytes()).await.expect("stdin");
    }
    child.wait_with_output().await.expect("courier ends")
}

/// The JSON `courier streams list {target} {args}` printed.
async fn list(dir: &Path, target: &[String], args: &[&str]) -> Value {
    let output = tokio::process::Command::new(BINARY)
        .args(["streams", "list"])
        .args(target)
        .args(args)
        .current_dir(dir)
        .env_remove("COURIER_URL")
        .env_remove("COURIER_TOKEN")
        .env_remove("COURIER_DATABASE_URL")
        .env_remove("COURIER_STREAMS__BACKEND")
        .output()
        .await
        .expect("courier ends");
    assert!(
        output.status.success(),
        "streams list {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

/// The JSON a successful verb printed.
async fn ok(dir: &Path, target: &[String], verb: &str, args: &[&str]) -> Value {
    ok_with(dir, target, verb, args, "").await
}

async fn ok_with(dir: &Path, target: &[String], verb: &str, args: &[&str], stdin: &str) -> Value {
    let output = streams(dir, target, verb, args, stdin).await;
    assert!(
        output.status.success(),
        "streams {verb} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

/// The error line of a verb that must fail.
async fn refused(dir: &Path, target: &[String], verb: &str, args: &[&str]) -> String {
    let output = streams(dir, target, verb, args, "").await;
    assert!(
        !output.status.success(),
        "streams {verb} {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn ids(value: &Value) -> Vec<String> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| {
            v.as_str()
                .or_else(|| v["id"].as_str())
                .expect("an id")
                .to_owned()
        })
        .collect()
}

/// Every verb, in the order a user would run them, on `target`.
async fn every_verb_works_and_refuses_bad_input(dir: &Path, target: &[String]) {
    let appended = ok(
        dir,
        target,
        "append",
        &[
            "--payload",
            "{\"n\":1}",
            "--payload",
            "{\"n\":2}",
            "--header",
            "trace=t-1",
        ],
    )
    .await;
    let mut all = ids(&appended["ids"]);
    assert_eq!(all.len(), 2, "{appended}");
    let from_stdin = ok_with(dir, target, "append", &[], "3\n\n{\"n\":4}\n").await;
    all.extend(ids(&from_stdin["ids"]));
    assert_eq!(all.len(), 4, "{from_stdin}");

    let created = ok(
        dir,
        target,
        "group",
        &["--group", "g", "--start", "beginning"],
    )
    .await;
    assert_eq!(created, json!({"group": "g", "created": true}));
    let existed = ok(dir, target, "group", &["--group", "g"]).await;
    assert_eq!(existed["created"], json!(false));

    // Readable once every older writing transaction on a PostgreSQL server
    // has ended (other tests hold some): read until all are there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let range = loop {
        let range = ok(dir, target, "read", &[]).await;
        if ids(&range["entries"]).len() >= all.len() || std::time::Instant::now() > deadline {
            break range;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(ids(&range["entries"]), all);
    assert_eq!(range["entries"][0]["headers"], json!({"trace": "t-1"}));
    assert_eq!(range["entries"][2]["payload"], json!(3));
    let page = ok(dir, target, "read", &["--after", &all[1], "--count", "1"]).await;
    assert_eq!(ids(&page["entries"]), [all[2].clone()]);

    // A group hands an entry out once every older transaction on a
    // PostgreSQL server has ended: read until three came.
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read.len() < 3 && Instant::now() < deadline {
        let want = (3 - read.len()).to_string();
        let answer = ok(
            dir,
            target,
            "read",
            &[
                "--group",
                "g",
                "--consumer",
                "c1",
                "--count",
                &want,
                "--block-ms",
                "2000",
            ],
        )
        .await;
        read.extend(answer["entries"].as_array().cloned().unwrap_or_default());
    }
    assert_eq!(ids(&Value::Array(read.clone())), all[..3]);
    assert_eq!(read[0]["deliveries"], json!(1));

    let pending = ok(dir, target, "pending", &["--group", "g"]).await;
    assert_eq!(pending["summary"]["count"], json!(3), "{pending}");
    assert_eq!(pending["summary"]["consumers"], json!({"c1": 3}));
    let mine = ok(
        dir,
        target,
        "pending",
        &["--group", "g", "--consumer", "c2"],
    )
    .await;
    assert_eq!(mine["entries"], json!([]));

    let claimed = ok(
        dir,
        target,
        "claim",
        &[
            "--group",
            "g",
            "--consumer",
            "c2",
            "--min-idle-ms",
            "0",
            "--count",
            "1",
        ],
    )
    .await;
    assert_eq!(ids(&claimed["entries"]), [all[0].clone()]);
    assert_eq!(claimed["entries"][0]["deliveries"], json!(2));

    let consumers = ok(dir, target, "consumers", &["--group", "g"]).await;
    let pending_of: Vec<(String, u64)> = consumers["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["pending"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(pending_of, [("c1".to_owned(), 2), ("c2".to_owned(), 1)]);
    let busy = refused(
        dir,
        target,
        "consumers",
        &["--group", "g", "--delete", "c2"],
    )
    .await;
    assert!(busy.contains("pending"), "{busy}");

    let acked = ok(
        dir,
        target,
        "ack",
        &["--group", "g", &all[0], &all[1], &all[2]],
    )
    .await;
    assert_eq!(acked, json!({"acked": 3}));
    let deleted = ok(
        dir,
        target,
        "consumers",
        &["--group", "g", "--delete", "c2"],
    )
    .await;
    assert_eq!(deleted, json!({"deleted": "c2"}));
    let unknown = refused(
        dir,
        target,
        "consumers",
        &["--group", "g", "--delete", "c2"],
    )
    .await;
    assert!(unknown.contains("no consumer c2"), "{unknown}");

    let trimmed = ok(dir, target, "trim", &["--max-len", "1"]).await;
    assert_eq!(trimmed, json!({"removed": 3}));
    assert_eq!(
        ids(&ok(dir, target, "read", &[]).await["entries"]),
        [all[3].clone()]
    );

    // The listing shows the stream, its group and what the verbs left.
    let listed = list(dir, target, &[]).await;
    assert_eq!(
        listed,
        json!({
            "items": [{
                "tenant": "a",
                "stream": "orders",
                "length": 1,
                "last_id": all[3],
                "groups": [{
                    "name": "g",
                    "consumers": 1,
                    "pending": 0,
                    "lag": 1,
                    "last_delivered_id": all[2],
                }],
            }],
            "next_cursor": null,
        })
    );
    assert_eq!(
        list(dir, target, &["--tenant", "a", "--limit", "1"]).await,
        listed
    );
    for (args, field) in [
        (vec!["--limit", "0"], "limit"),
        (vec!["--tenant", "a:b"], "tenant"),
        (vec!["--cursor", "nope"], "cursor"),
    ] {
        let output = tokio::process::Command::new(BINARY)
            .args(["streams", "list"])
            .args(target)
            .args(&args)
            .current_dir(dir)
            .env_remove("COURIER_URL")
            .env_remove("COURIER_TOKEN")
            .output()
            .await
            .expect("courier ends");
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "list {args:?}");
        assert!(error.contains(field), "list {args:?}: {error}");
    }

    // Refusals name the field, and change nothing.
    for (verb, args, field) in [
        ("ack", vec!["--group", "g", "x"], "ids[0]"),
        ("read", vec!["--count", "0"], "count"),
        (
            "read",
            vec!["--group", "g", "--consumer", "c 1"],
            "consumer",
        ),
        (
            "read",
            vec!["--group", "g", "--consumer", "c", "--block-ms", "30001"],
            "block_ms",
        ),
        ("append", vec!["--payload", "{"], "payload[0]"),
        ("trim", vec![], "max_len"),
        ("group", vec!["--group", "h", "--start", "middle"], "start"),
        (
            "read",
            vec!["--group", "nope", "--consumer", "c"],
            "no group nope",
        ),
    ] {
        let error = refused(dir, target, verb, &args).await;
        assert!(error.contains(field), "{verb} {args:?}: {error}");
    }
    // A bad payload anywhere in the input stores nothing, however many good
    // ones (whole batches of 1,000) come before it, and is named by its line.
    let input = format!("{}{}\n", "1\n".repeat(1000), r#"{"s":"\u0000"}"#);
    let output = streams(dir, target, "append", &[], &input).await;
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("line 1001") && error.contains("U+0000"),
        "{error}"
    );
    let error = streams(dir, target, "read", &["--tenant", "a:b"], "").await;
    assert!(!error.status.success());
    assert_eq!(
        ids(&ok(dir, target, "read", &[]).await["entries"]),
        [all[3].clone()]
    );
    let pending = ok(dir, target, "pending", &["--group", "g"]).await;
    assert_eq!(pending["summary"]["count"], json!(0));
}

fn target(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_verbs_on_sqlite_native_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().unwrap();
    let migrated = std::process::Command::new(BINARY)
        .args(["migrate", "--database-url", db])
        .output()
        .unwrap();
    assert!(migrated.status.success());
    every_verb_works_and_refuses_bad_input(dir.path(), &target(&["--database-url", db])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_verbs_on_postgres_native_streams() {
    let fixture = courier_testkit::PgFixture::new().await.unwrap();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = courier_testkit::database_url();
    let args = target(&["--database-url", &url, "--schema", &fixture.schema]);
    every_verb_works_and_refuses_bad_input(dir.path(), &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_verbs_on_redis() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = format!("t_{:016x}:", fastrand::u64(..));
    let url = courier_testkit::redis_url();
    let args = target(&[
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-key-prefix",
        &prefix,
    ]);
    every_verb_works_and_refuses_bad_input(dir.path(), &args).await;
    let missing = streams(
        dir.path(),
        &target(&["--backend", "redis"]),
        "read",
        &[],
        "",
    )
    .await;
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--redis-url"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_verbs_through_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token =
        |name: &str, roles: &[courier_server::config::Role]| courier_server::config::TokenConfig {
            name: name.into(),
            sha256: hex(&Sha256::digest(name.as_bytes())),
            tenants: vec!["a".into()],
            roles: roles.to_vec(),
        };
    use courier_server::config::Role;
    let config = courier_server::Config {
        database_url: dir.path().join("courier.db").to_str().unwrap().to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        tokens: vec![
            token(
                "all",
                &[Role::Admin, Role::Consume, Role::Publish, Role::Read],
            ),
            token("consumer", &[Role::Consume]),
        ],
        ..courier_server::Config::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = courier_server::bind(config, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let url = format!("http://{}", running.local_addr());
    let done = tokio::spawn(running.finished());

    every_verb_works_and_refuses_bad_input(dir.path(), &target(&["--url", &url, "--token", "all"]))
        .await;
    let forbidden = refused(
        dir.path(),
        &target(&["--url", &url, "--token", "consumer"]),
        "append",
        &["--payload", "1"],
    )
    .await;
    assert!(forbidden.contains("403"), "{forbidden}");
    let other_tenant = tokio::process::Command::new(BINARY)
        .args([
            "streams", "list", "--tenant", "b", "--url", &url, "--token", "all",
        ])
        .output()
        .await
        .unwrap();
    assert!(!other_tenant.status.success());
    let error = String::from_utf8_lossy(&other_tenant.stderr);
    assert!(error.contains("403") && error.contains("tenant"), "{error}");

    let _ = stop.send(());
    done.await.unwrap().unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
