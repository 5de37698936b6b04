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
        "drain.exactly_once_failing",
        "drain.two_subscriptions",
        "drain.ordering_keys",
        "drain.tenants",
        "drain.priorities",
        "drain.processes_1",
        "drain.processes_2",
        "drain.processes_4",
        "latency.wake",
        "latency.poll",
        "fairness.solo",
        "fairness.big",
        "fairness.small",
        "held_xmin.held",
        "skipped: PostgreSQL only",
        "(backend default)",
    ] {
        assert!(table.contains(id), "{id} missing from:\n{table}");
    }
    // Every per-measurement file (courier-bench.db.<n>, -wal, -shm) is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read_dir")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn bench_rounds_report_each_cases_median_with_every_round() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--scenario",
            "drain",
            "--baseline",
            "--rounds",
            "3",
            "--json",
            "--no-progress",
        ],
    );
    let report = json_report(&output);
    assert_eq!(report["settings"]["rounds"], 3);
    for id in [
        "drain.noop",
        "drain.exactly_once",
        "drain.two_subscriptions",
        "drain.tenants",
    ] {
        let case = measurement(&report, id);
        let figures = |key: &str| -> Vec<f64> {
            case[key]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: no {key} in {case:#}"))
                .iter()
                .map(|figure| figure.as_f64().expect("a number"))
                .collect()
        };
        let rounds = figures("rounds");
        assert_eq!(rounds.len(), 3, "{id}: {case:#}");
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(case["per_second"].as_f64(), Some(sorted[1]), "{id}");
        // The ratio is the median of the rounds' own ratios, each listed.
        let mut ratios = figures("ratio_rounds");
        assert_eq!(ratios.len(), 3, "{id}: {case:#}");
        ratios.sort_by(f64::total_cmp);
        assert_eq!(case["ratio"].as_f64(), Some(ratios[1]), "{id}: {case:#}");
    }
    // SQLite runs no worker processes: skipped once, not three times.
    let skipped = report["measurements"]
        .as_array()
        .expect("measurements")
        .iter()
        .filter(|m| m["id"] == "drain.processes_1")
        .count();
    assert_eq!(skipped, 1);

    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--scenario",
            "enqueue",
            "--rounds",
            "2",
            "--no-progress",
        ],
    );
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let table = stdout(&output);
    assert!(table.contains("median of 2 rounds"), "{table}");
    assert!(table.contains("rounds "), "{table}");
    assert!(table.contains("% of the median"), "{table}");
}

/// The JSON report of a successful `courier bench --json` run.
fn json_report(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "stderr: {}", stderr(output));
    serde_json::from_str(&stdout(output)).expect("stdout is one JSON document")
}

/// The report's measurement `id`.
fn measurement<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["measurements"]
        .as_array()
        .and_then(|all| all.iter().find(|m| m["id"] == id))
        .unwrap_or_else(|| panic!("{id} missing from {report:#}"))
}

#[tokio::test]
async fn quick_streams_bench_measures_native_and_redis_streams_beside_raw_commands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("bench_streams");
    let url = database_url();
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--scenario",
            "streams",
            "--json",
            "--database-url",
            &url,
            "--schema",
            &schema,
            "--redis-url",
            &redis,
        ],
    );
    let report = json_report(&output);
    let find = |id: &str| measurement(&report, id);
    for backend in ["postgres", "redis"] {
        for case in [
            "append.1",
            "append.16",
            "read_ack.1",
            "read_ack.4",
            "subscription",
            "claim",
        ] {
            let m = find(&format!("streams.{backend}.{case}"));
            assert!(m["per_second"].as_f64().is_some_and(|r| r > 0.0), "{m:#}");
        }
        assert_eq!(find(&format!("streams.{backend}.claim"))["count"], 10_000);
        assert_eq!(
            find(&format!("streams.{backend}.subscription"))["count"],
            2000
        );
        assert!(find(&format!("streams.{backend}.latency"))["latency"]["p99_ms"].is_number());
    }
    // Redis figures stand beside raw commands.
    for case in ["append.1", "read_ack.1", "subscription"] {
        assert!(find(&format!("streams.redis.{case}"))["ratio"].is_number());
    }
}

#[tokio::test]
async fn quick_relays_bench_relays_every_message_to_each_target_beside_raw_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--quick",
            "--scenario",
            "relays",
            "--json",
            "--redis-url",
            &redis,
            "--nats-url",
            &nats,
        ],
    );
    let report = json_report(&output);
    let measurements = report["measurements"].as_array().expect("measurements");
    let find = |id: &str| measurement(&report, id);
    // Each case checked its target holds exactly the messages relayed.
    for target in ["native", "redis", "nats"] {
        let m = find(&format!("relays.{target}"));
        assert_eq!(m["count"], 2000, "{m:#}");
        assert!(m["per_second"].as_f64().is_some_and(|r| r > 0.0), "{m:#}");
    }
    for target in ["redis", "nats"] {
        assert!(find(&format!("relays.{target}"))["ratio"].is_number());
        // The relay's writes alone stand beside the same raw figure (each
        // checked its target holds every message it wrote).
        let writes = find(&format!("relays.{target}.writes"));
        assert_eq!(writes["count"], 2000, "{writes:#}");
        assert!(writes["ratio"].is_number(), "{writes:#}");
    }
    // Only the relay cases ran.
    assert!(measurements
        .iter()
        .all(|m| m["id"].as_str().is_some_and(|id| id.starts_with("relays."))));
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
            "--concurrency",
            "128",
            "--batch-size",
            "128",
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
    assert_eq!(report["settings"]["concurrency"], 128, "{report:#}");
    assert_eq!(report["settings"]["batch_size_is_default"], false);
    let measurements = report["measurements"].as_array().expect("measurements");
    assert_eq!(measurements.len(), 20, "{report:#}");
    let find = |id: &str| {
        measurements
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from {report:#}"))
    };
    let noop = find("drain.noop");
    assert_eq!(noop["count"], 2000);
    assert!(noop["ratio"].is_number(), "{noop:#}");
    // The same drain by 1, 2 and 4 `courier bench-worker` processes.
    for id in [
        "drain.processes_1",
        "drain.processes_2",
        "drain.processes_4",
    ] {
        let processes = find(id);
        assert_eq!(processes["count"], 2000, "{processes:#}");
        assert!(
            processes["per_second"]
                .as_f64()
                .is_some_and(|rate| rate > 0.0),
            "{processes:#}"
        );
        assert!(processes["ratio"].is_number(), "{processes:#}");
    }
    // Fairness: the big tenant's rate against its solo rate, small tenants' latency.
    assert_eq!(find("fairness.big")["count"], 5000);
    assert!(find("fairness.big")["ratio"].is_number());
    assert!(find("fairness.small")["latency"]["p99_ms"].is_number());
    // Held xmin: throughput before and during the hold, with dead tuples.
    let held = find("held_xmin.held");
    assert!(held["ratio"].is_number(), "{held:#}");
    assert!(
        held["details"]["dead_tuples_at_end"].is_number(),
        "{held:#}"
    );
    assert!(
        held["details"]["held_xmin_age_xids"].is_number(),
        "{held:#}"
    );
    assert!(find("held_xmin.before")["per_second"].is_number());
    let bars = report["bars"].as_array().expect("bars");
    for bar in ["fairness: small", "fairness: big", "held xmin"] {
        assert!(
            bars.iter()
                .any(|b| b["bar"].as_str().is_some_and(|s| s.starts_with(bar))),
            "{bar} missing from {bars:#?}"
        );
    }
    assert!(report["bars"]
        .as_array()
        .is_some_and(|bars| !bars.is_empty()));
    assert!(
        !schema_exists(&schema).await,
        "the bench schema was left behind"
    );
}

#[tokio::test]
async fn explain_prints_the_hot_queries_plans_and_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("explain");
    let url = database_url();
    let output = courier(
        dir.path(),
        &[
            "bench",
            "--scenario",
            "explain",
            "--messages",
            "2000",
            "--no-progress",
            "--database-url",
            &url,
            "--schema",
            &schema,
        ],
    );
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let table = stdout(&output);
    for needle in [
        "EXPLAIN (ANALYZE, BUFFERS) at 2,000 deliveries",
        "-- claim (queries/claim.sql",
        "-- complete (queries/complete.sql",
        "the 256 leases of a real claim",
        "-- enqueue_plain (queries/enqueue_plain.sql",
        "-- enqueue (queries/enqueue.sql",
        "-- prune_receipts (queries/prune_receipts.sql",
        "-- prune_messages (queries/prune_messages.sql",
        "Buffers: shared hit=",
        "Execution Time:",
        "deliveries_ready",
        "messages_enqueued",
        "receipts_completed_at",
    ] {
        assert!(table.contains(needle), "{needle} missing from:\n{table}");
    }
    // Nothing but the plans: the other scenarios did not run.
    assert!(!table.contains("drain.noop"), "{table}");
    assert!(
        !schema_exists(&schema).await,
        "the bench schema was left behind"
    );
}

#[test]
fn explain_and_held_xmin_on_sqlite_are_skipped_with_a_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    for scenario in ["explain", "held-xmin"] {
        let output = courier(
            dir.path(),
            &["bench", "--quick", "--scenario", scenario, "--no-progress"],
        );
        assert!(output.status.success(), "stderr: {}", stderr(&output));
        let table = stdout(&output);
        assert!(table.contains("skipped"), "{table}");
        assert!(table.contains("PostgreSQL only"), "{table}");
    }
}

#[test]
fn bench_refuses_worker_settings_out_of_range_naming_the_option() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (option, value) in [
        ("--concurrency", "0"),
        ("--batch-size", "10001"),
        ("--hold-seconds", "0"),
        ("--rounds", "0"),
        ("--rounds", "21"),
    ] {
        let output = courier(dir.path(), &["bench", "--quick", option, value]);
        assert_eq!(output.status.code(), Some(1), "{option} {value}");
        let message = stderr(&output);
        assert!(message.contains(&format!("invalid {option}")), "{message}");
        assert_eq!(message.trim().lines().count(), 1, "one line: {message}");
    }
    assert!(!dir.path().join("courier-bench.db").exists());
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

#[test]
fn subscriptions_can_be_created_with_a_replay_and_lose_topics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().expect("utf-8 path");
    let ok = |args: &[&str]| {
        let output = courier(dir.path(), args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        stdout(&output)
    };
    ok(&["migrate", "--database-url", db]);
    for n in 0..3 {
        let payload = format!("{{\"n\":{n}}}");
        ok(&[
            "publish",
            "--database-url",
            db,
            "--tenant",
            "acme",
            "--topic",
            "invoice.paid",
            "--payload",
            &payload,
        ]);
    }
    let created = ok(&[
        "subscriptions",
        "create",
        "audit",
        "--topic",
        "invoice.*",
        "--topic",
        "refund.issued",
        "--replay",
        "all",
        "--database-url",
        db,
    ]);
    assert!(
        created.contains("created audit, replaying 3 retained messages"),
        "{created}"
    );
    let again = ok(&[
        "subscriptions",
        "create",
        "audit",
        "--topic",
        "invoice.*",
        "--replay",
        "all",
        "--database-url",
        db,
    ]);
    assert!(again.contains("replayed nothing"), "{again}");
    let removed = ok(&[
        "subscriptions",
        "remove-topics",
        "audit",
        "refund.issued",
        "--database-url",
        db,
    ]);
    assert!(removed.contains("removed 1 of 1 topics"), "{removed}");
    let listed = ok(&["subscriptions", "list", "--database-url", db]);
    assert!(
        listed.contains("invoice.*") && !listed.contains("refund.issued"),
        "{listed}"
    );

    let bad = courier(
        dir.path(),
        &[
            "subscriptions",
            "create",
            "x",
            "--topic",
            "t",
            "--replay",
            "yesterday",
            "--database-url",
            db,
        ],
    );
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("RFC 3339"), "{}", stderr(&bad));
    let unknown = courier(
        dir.path(),
        &[
            "subscriptions",
            "remove-topics",
            "nope",
            "t",
            "--database-url",
            db,
        ],
    );
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("no subscription named"),
        "{}",
        stderr(&unknown)
    );
}

/// A failing command says what failed once: the database's own words are not
/// repeated by every error that wraps them (they were, four times, for a
/// missing database), and a log line on stderr carries no colour codes.
#[test]
fn an_error_is_printed_once_without_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = database_url();
    let missing = format!(
        "{}/courier_no_such_db",
        base.rsplit_once('/')
            .map_or(base.as_str(), |(head, _)| head)
    );
    for args in [
        vec!["status", "--database-url", missing.as_str()],
        vec!["serve", "--database-url", missing.as_str()],
    ] {
        let output = courier(dir.path(), &args);
        assert!(!output.status.success(), "{args:?}");
        let err = stderr(&output);
        assert_eq!(err.matches("does not exist").count(), 1, "{args:?}: {err}");
        assert!(!err.contains('\u{1b}'), "{args:?}: {err}");
    }
}

/// `dlq groups` prints its table; `--fingerprint` is taken by groups, list,
/// retry and discard, refused naming the flag when it is no fingerprint, and
/// is a filter (so it does not go with `--all`).
#[test]
fn dlq_groups_prints_a_table_and_fingerprint_filters_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().expect("utf-8 path");
    let migrated = courier(dir.path(), &["migrate", "--database-url", db]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let groups = courier(dir.path(), &["dlq", "groups", "--database-url", db]);
    assert!(groups.status.success(), "{}", stderr(&groups));
    for column in [
        "FINGERPRINT",
        "COUNT",
        "FIRST SEEN",
        "LAST SEEN",
        "SAMPLE ERROR",
    ] {
        assert!(stdout(&groups).contains(column), "{}", stdout(&groups));
    }
    // --limit means what the HTTP API's `limit` means, locally too: 1 to 500.
    for verb in ["groups", "list"] {
        for bad in ["0", "501", "many"] {
            let refused = courier(
                dir.path(),
                &["dlq", verb, "--limit", bad, "--database-url", db],
            );
            assert!(!refused.status.success(), "{verb} took --limit {bad}");
            assert!(
                stderr(&refused).contains("--limit") && stderr(&refused).contains("1 to 500"),
                "{}",
                stderr(&refused)
            );
        }
        let most = courier(
            dir.path(),
            &["dlq", verb, "--limit", "500", "--database-url", db],
        );
        assert!(most.status.success(), "{verb}: {}", stderr(&most));
    }
    for verb in ["groups", "list", "retry", "discard"] {
        let refused = courier(
            dir.path(),
            &["dlq", verb, "--fingerprint", "nope", "--database-url", db],
        );
        assert!(!refused.status.success(), "{verb} took a bad fingerprint");
        assert!(
            stderr(&refused).contains("--fingerprint"),
            "{verb}: {}",
            stderr(&refused)
        );
    }
    for verb in ["retry", "discard"] {
        let one = courier(
            dir.path(),
            &[
                "dlq",
                verb,
                "--fingerprint",
                "unknown",
                "--database-url",
                db,
            ],
        );
        assert!(one.status.success(), "{verb}: {}", stderr(&one));
        assert!(
            stdout(&one).contains("0 dead letter(s)"),
            "{}",
            stdout(&one)
        );
        let both = courier(
            dir.path(),
            &[
                "dlq",
                verb,
                "--all",
                "--fingerprint",
                "0123456789abcdef",
                "--database-url",
                db,
            ],
        );
        assert!(!both.status.success(), "--all with --fingerprint ran");
    }
}

#[test]
fn dlq_retry_and_discard_of_every_dead_letter_need_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().expect("utf-8 path");
    let migrated = courier(dir.path(), &["migrate", "--database-url", db]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    for verb in ["retry", "discard"] {
        let refused = courier(dir.path(), &["dlq", verb, "--database-url", db]);
        assert!(!refused.status.success(), "{verb} without a selection ran");
        assert!(stderr(&refused).contains("--all"), "{}", stderr(&refused));
        let all = courier(dir.path(), &["dlq", verb, "--all", "--database-url", db]);
        assert!(all.status.success(), "{verb} --all: {}", stderr(&all));
        assert!(
            stdout(&all).contains("0 dead letter(s)"),
            "{}",
            stdout(&all)
        );
        let both = courier(
            dir.path(),
            &["dlq", verb, "--all", "--topic", "t", "--database-url", db],
        );
        assert!(!both.status.success(), "--all with a filter ran");
        let ranged = courier(
            dir.path(),
            &[
                "dlq",
                verb,
                "--all",
                "--since",
                "2026-12-01T00:00:00Z",
                "--database-url",
                db,
            ],
        );
        assert!(!ranged.status.success(), "--all with --since ran");
    }
    // The time filters reach the store's check; the cursor is the API's.
    let empty_range = courier(
        dir.path(),
        &[
            "dlq",
            "list",
            "--since",
            "2026-12-02T00:00:00Z",
            "--until",
            "2026-12-01T00:00:00Z",
            "--database-url",
            db,
        ],
    );
    assert!(!empty_range.status.success());
    assert!(
        stderr(&empty_range).contains("dead_before"),
        "{}",
        stderr(&empty_range)
    );
    let bad_cursor = courier(
        dir.path(),
        &["dlq", "list", "--cursor", "nope", "--database-url", db],
    );
    assert!(!bad_cursor.status.success());
    assert!(
        stderr(&bad_cursor).contains("--cursor"),
        "{}",
        stderr(&bad_cursor)
    );
    let listed = courier(
        dir.path(),
        &[
            "dlq",
            "list",
            "--message-id",
            "01a233fa-3687-703b-a9c7-6083e8afef53",
            "--database-url",
            db,
        ],
    );
    assert!(listed.status.success(), "{}", stderr(&listed));
}

/// A call to a daemon that never answers ends at `--timeout-ms` with an
/// error saying so, and names go into the path percent-encoded: a name with
/// `/` or `?` cannot reach another route.
#[test]
fn remote_calls_time_out_and_percent_encode_their_path() {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let (seen, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            let _ = seen.send(line);
            // Hold the connection without answering.
            std::thread::sleep(std::time::Duration::from_secs(10));
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let output = courier(
        dir.path(),
        &[
            "subscriptions",
            "pause",
            "a/b?c",
            "--url",
            &url,
            "--timeout-ms",
            "300",
        ],
    );
    let took = started.elapsed();
    assert!(!output.status.success());
    assert!(
        took < std::time::Duration::from_secs(5),
        "took {took:?}: {}",
        stderr(&output)
    );
    assert!(stderr(&output).contains("timed out"), "{}", stderr(&output));
    let line = lines
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the request reached the listener");
    assert!(
        line.starts_with("POST /v1/subscriptions/a%2Fb%3Fc/pause "),
        "{line}"
    );
    // Publishing goes through the same client, timeout and all.
    let started = std::time::Instant::now();
    let output = courier(
        dir.path(),
        &[
            "publish",
            "--url",
            &url,
            "--timeout-ms",
            "300",
            "--tenant",
            "a",
            "--topic",
            "t",
            "--payload",
            "1",
        ],
    );
    assert!(!output.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(stderr(&output).contains("timed out"), "{}", stderr(&output));
}

#[test]
fn cancel_removes_a_waiting_message_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().expect("utf-8 path");
    let ok = |args: &[&str]| {
        let output = courier(dir.path(), args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        stdout(&output)
    };
    ok(&["migrate", "--database-url", db]);
    ok(&[
        "subscriptions",
        "create",
        "audit",
        "--topic",
        "invoice.*",
        "--database-url",
        db,
    ]);
    let published = ok(&[
        "publish",
        "--database-url",
        db,
        "--tenant",
        "acme",
        "--topic",
        "invoice.paid",
        "--payload",
        "{\"n\":1}",
    ]);
    let id = published
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .find(|word| uuid::Uuid::parse_str(word).is_ok())
        .unwrap_or_else(|| panic!("no id in {published:?}"))
        .to_owned();
    let cancelled: serde_json::Value =
        serde_json::from_str(&ok(&["cancel", &id, "--database-url", db])).expect("JSON");
    assert_eq!(
        cancelled,
        serde_json::json!({"id": id, "cancelled": true, "deliveries": 1})
    );
    let again = courier(dir.path(), &["cancel", &id, "--database-url", db]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains(&format!("no message {id}")),
        "{}",
        stderr(&again)
    );
}

async fn pg_execute(sql: &str) {
    let pool = sqlx::PgPool::connect(&database_url())
        .await
        .expect("connect");
    sqlx::raw_sql(sql).execute(&pool).await.expect("execute");
    pool.close().await;
}

/// The rows of `courier migrate status`'s table: (version, state).
fn status_rows(table: &str) -> Vec<(String, String)> {
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<&str>>())
        .take_while(|cells| {
            cells.len() >= 3 && cells[0].len() == 4 && cells[0].chars().all(|c| c.is_ascii_digit())
        })
        .map(|cells| (cells[0].to_owned(), cells[2].to_owned()))
        .collect()
}

#[tokio::test]
async fn migrate_status_lists_every_migration_pending_then_applied_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("status");
    let url = database_url();
    let status = [
        "migrate",
        "status",
        "--database-url",
        &url,
        "--schema",
        &schema,
    ];

    let before = courier(dir.path(), &status);
    assert_eq!(before.status.code(), Some(0), "stderr: {}", stderr(&before));
    let rows = status_rows(&stdout(&before));
    assert_eq!(
        rows.len(),
        courier::postgres::MIGRATIONS.len(),
        "{}",
        stdout(&before)
    );
    assert!(rows.iter().all(|(_, state)| state == "pending"), "{rows:?}");
    assert_eq!(rows[2].0, "0003");
    assert!(!schema_exists(&schema).await, "status created the schema");

    let migrated = courier(
        dir.path(),
        &["migrate", "--database-url", &url, "--schema", &schema],
    );
    assert!(migrated.status.success(), "stderr: {}", stderr(&migrated));
    let after = courier(dir.path(), &status);
    assert_eq!(after.status.code(), Some(0), "stderr: {}", stderr(&after));
    let rows = status_rows(&stdout(&after));
    assert_eq!(rows.len(), courier::postgres::MIGRATIONS.len());
    assert!(rows.iter().all(|(_, state)| state == "applied"), "{rows:?}");

    let mut json_args = status.to_vec();
    json_args.push("--json");
    let json = courier(dir.path(), &json_args);
    assert_eq!(json.status.code(), Some(0), "stderr: {}", stderr(&json));
    let document: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    assert_eq!(document["backend"], "postgres");
    assert_eq!(document["schema"], schema.as_str());
    let migrations = document["migrations"].as_array().expect("migrations");
    assert_eq!(migrations.len(), courier::postgres::MIGRATIONS.len());
    let third = &migrations[2];
    assert_eq!(third["version"], 3);
    assert_eq!(third["name"], "idle_workers");
    assert_eq!(third["state"], "applied");
    let checksum = third["checksum"].as_str().expect("checksum");
    assert_eq!(checksum.len(), 64);
    assert_eq!(third["recorded_checksum"].as_str(), Some(checksum));
    // The table shows the first 12 hex digits of the same checksum.
    assert!(stdout(&after).contains(&checksum[..12]));
    assert!(!stdout(&after).contains(&checksum[..13]));
    drop_schema(&schema).await;
}

#[tokio::test]
async fn migrate_refuses_a_changed_migration_by_name_and_status_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = fresh_schema("changed");
    let url = database_url();
    let migrate = ["migrate", "--database-url", &url, "--schema", &schema];
    let migrated = courier(dir.path(), &migrate);
    assert!(migrated.status.success(), "stderr: {}", stderr(&migrated));
    pg_execute(&format!(
        "UPDATE {schema}.schema_migrations SET checksum = repeat('0', 64) WHERE version = 3"
    ))
    .await;

    let refused = courier(dir.path(), &migrate);
    assert_eq!(refused.status.code(), Some(1));
    let message = stderr(&refused);
    assert!(
        message.contains(&format!(
            "migration 0003 idle_workers was changed after it was applied: recorded checksum {}, this binary has ",
            "0".repeat(64)
        )),
        "{message}"
    );
    assert_eq!(message.trim().lines().count(), 1, "one line: {message}");

    let status = courier(
        dir.path(),
        &[
            "migrate",
            "status",
            "--database-url",
            &url,
            "--schema",
            &schema,
        ],
    );
    assert_eq!(status.status.code(), Some(1));
    let rows = status_rows(&stdout(&status));
    assert_eq!(rows[2], ("0003".to_owned(), "changed".to_owned()));
    assert!(stdout(&status).contains("(recorded 000000000000)"));
    assert!(
        stderr(&status).contains("migration 0003 idle_workers was changed after it was applied"),
        "{}",
        stderr(&status)
    );
    drop_schema(&schema).await;
}

#[tokio::test]
async fn on_sqlite_status_creates_no_file_and_migrate_and_serve_refuse_a_changed_migration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("courier.db");
    let path = db.to_str().expect("UTF-8 path");

    let status = courier(dir.path(), &["migrate", "status", "--database-url", path]);
    assert_eq!(status.status.code(), Some(0), "stderr: {}", stderr(&status));
    let rows = status_rows(&stdout(&status));
    assert_eq!(
        rows.len(),
        courier::sqlite::MIGRATIONS.len(),
        "{}",
        stdout(&status)
    );
    assert!(rows.iter().all(|(_, state)| state == "pending"), "{rows:?}");
    assert!(!db.exists(), "status created the file");

    let migrated = courier(dir.path(), &["migrate", "--database-url", path]);
    assert!(migrated.status.success(), "stderr: {}", stderr(&migrated));
    let pool = courier::sqlite::connect(path, 1).await.expect("open");
    sqlx::query("UPDATE courier_schema_migrations SET checksum = 'edited' WHERE version = 3")
        .execute(&pool)
        .await
        .expect("update");
    pool.close().await;

    let expected = "migration 0003 tenant_rate_limits was changed after it was applied: \
                    recorded checksum edited, this binary has ";
    let refused = courier(dir.path(), &["migrate", "--database-url", path]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains(expected), "{}", stderr(&refused));

    let status = courier(dir.path(), &["migrate", "status", "--database-url", path]);
    assert_eq!(status.status.code(), Some(1));
    assert_eq!(
        status_rows(&stdout(&status))[2],
        ("0003".to_owned(), "changed".to_owned())
    );

    // The daemon migrates before it listens: it stops with the same error.
    let serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--database-url", path, "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env_remove("COURIER_DATABASE_URL")
        .kill_on_drop(true)
        .output();
    let served = tokio::time::timeout(std::time::Duration::from_secs(60), serve)
        .await
        .expect("serve stops on its own")
        .expect("the courier binary runs");
    assert_eq!(served.status.code(), Some(1));
    let message = stderr(&served);
    assert!(
        message.contains(&format!("cannot migrate the database: {expected}")),
        "{message}"
    );
}
