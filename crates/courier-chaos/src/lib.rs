//! The chaos suite's harness: a PostgreSQL cluster of the suite's own on a
//! free port (never the shared server), Courier workers as separate
//! processes (`chaos-worker`), a producer that writes each message with its
//! oracle row in one transaction, and the ledger's invariants, checked after
//! every scenario and written as one row of the suite's table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{Courier, NewMessage};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The lease every scenario's workers hold.
pub const LEASE: Duration = Duration::from_secs(5);
/// The retry backoff's cap.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// The poll interval.
pub const POLL: Duration = Duration::from_millis(500);
/// The recovery bound R: lease + poll + backoff cap.
pub const RECOVERY: Duration = Duration::from_millis(5_000 + 500 + 5_000);
/// The workers' `idle_in_transaction_session_timeout`, in milliseconds: the
/// handler timeout (5 s) and a second.
pub const IDLE_IN_TRANSACTION_MS: u64 = 6_000;
/// The subscription and topic the scenarios use.
pub const SUBSCRIPTION: &str = "ledger";
/// The topic every message is on.
pub const TOPIC: &str = "chaos.event";
/// The `application_name` of every worker connection.
pub const WORKER_APPLICATION: &str = "chaos-worker";

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A PostgreSQL cluster made for one scenario (`initdb`, `pg_ctl`), stopped
/// and removed on drop.
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

fn pg_bin() -> anyhow::Result<PathBuf> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
        .with_context(|| format!("no PostgreSQL server under {}", root.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    // By version number: 9.6 sorts before 15.
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .map(|v| {
                v.split('.')
                    .map(|part| part.parse::<u32>().unwrap_or(0))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    });
    versions
        .pop()
        .context("no PostgreSQL version with initdb under /usr/lib/postgresql")
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgCluster {
    /// Creates and starts a cluster (trust authentication, fsync on), after
    /// stopping any earlier scenario's cluster whose test process is gone.
    pub async fn start() -> anyhow::Result<Self> {
        stop_orphaned_clusters();
        let dir = tempfile::Builder::new()
            .prefix("courier-chaos-pg")
            .tempdir()?;
        std::fs::write(dir.path().join("owner.pid"), std::process::id().to_string())?;
        let cluster = Self {
            bin: pg_bin()?,
            port: free_port()?,
            dir,
        };
        if running_as_root() {
            // PostgreSQL refuses to run as root: the cluster belongs to postgres.
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(cluster.dir.path())
                .status()?;
            anyhow::ensure!(status.success(), "chown of the cluster directory failed");
        }
        cluster
            .pg(
                "initdb",
                &[
                    "-D",
                    &cluster.data(),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                ],
            )
            .await?;
        cluster.ctl(&["start", "-w", "-t", "60"]).await?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    async fn pg(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let program = self.bin.join(tool);
        let mut command = if running_as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", program.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "{tool} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    async fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=60",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let data = self.data();
        let mut all = vec!["-D", &data, "-l", &log, "-o", &options];
        all.extend_from_slice(args);
        self.pg("pg_ctl", &all).await
    }

    /// Restarts the server: `fast` (a clean shutdown) or `immediate` (no
    /// checkpoint: crash recovery at start).
    pub async fn restart(&self, mode: &str) -> anyhow::Result<()> {
        self.ctl(&["restart", "-w", "-t", "60", "-m", mode]).await
    }

    /// The cluster's URL (database `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        stop_immediately(&self.bin, &self.dir.path().join("data"));
    }
}

/// Stops and removes the clusters of test processes that died without
/// dropping theirs (killed, or timed out): each cluster's directory names
/// its owner's pid in `owner.pid`.
fn stop_orphaned_clusters() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.filter_map(Result::ok).map(|entry| entry.path()) {
        let named = dir
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("courier-chaos-pg"));
        let Ok(owner) = std::fs::read_to_string(dir.join("owner.pid")) else {
            continue;
        };
        if !named || Path::new("/proc").join(owner.trim()).exists() {
            continue;
        }
        if let Ok(bin) = pg_bin() {
            stop_immediately(&bin, &dir.join("data"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `pg_ctl stop -m immediate` on the cluster in `data`, errors ignored.
fn stop_immediately(bin: &Path, data: &Path) {
    let program = bin.join("pg_ctl");
    let mut command = if running_as_root() {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(&program);
        command
    } else {
        std::process::Command::new(&program)
    };
    let _ = command
        .arg("-D")
        .arg(data)
        .args(["stop", "-m", "immediate", "-w"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Connects to `url`, retrying for up to 30 s (a server restarting).
pub async fn connect(url: &str, max: u32) -> anyhow::Result<PgPool> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
        {
            Ok(pool) => return Ok(pool),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error).context("connecting to the chaos cluster"),
        }
    }
}

/// Creates Courier's schema, the subscription, and the ledger's tables.
pub async fn prepare(pool: &PgPool) -> anyhow::Result<()> {
    let courier = Courier::postgres(pool.clone());
    courier.migrate().await?;
    courier::OutboxStore::register_subscription(
        courier.store(),
        &courier::SubscriptionSpec::new(SUBSCRIPTION, [TOPIC]),
    )
    .await?;
    sqlx::raw_sql(
        "CREATE SCHEMA ledger;
         CREATE TABLE ledger.oracle (tenant text NOT NULL, message_id uuid PRIMARY KEY,
                                     ordering_key text,
                                     at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE ledger.effects (tenant text NOT NULL, message_id uuid NOT NULL,
                                      subscription text NOT NULL,
                                      at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE ledger.stream_effects (entry_id text NOT NULL, n bigint NOT NULL,
                                             consumer text NOT NULL, deliveries bigint NOT NULL);
         CREATE TABLE ledger.quota (open boolean NOT NULL);
         INSERT INTO ledger.quota VALUES (true);
         CREATE TABLE ledger.runs (message_id uuid NOT NULL, tenant text NOT NULL,
                                   ordering_key text, pid integer NOT NULL,
                                   started_at timestamptz NOT NULL, ended_at timestamptz NOT NULL,
                                   attempt integer NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A cluster of the scenario's own with Courier's schema, the subscription
/// and the ledger, and a pool of 4 on it.
pub async fn ledgered_cluster() -> anyhow::Result<(PgCluster, PgPool)> {
    let cluster = PgCluster::start().await?;
    let pool = connect(&cluster.url(), 4).await?;
    prepare(&pool).await?;
    Ok((cluster, pool))
}

/// Waits until the ledger's subscription has no open delivery (each
/// completed or dead-lettered), for up to `limit`; how long that took.
pub async fn outbox_drained(pool: &PgPool, limit: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let open = count(
            pool,
            "SELECT count(*) FROM courier.deliveries WHERE subscription = 'ledger' AND state <> 'dead'",
        )
        .await;
        if matches!(open, Ok(0)) {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{open:?} deliveries still open after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records what arrived downstream as the ledger's effects: one row per
/// entry or message found there, under the tenant whose stream or subject
/// held it (so a copy shows as doubled, a missing one as lost, one in
/// another tenant's stream as crossed).
pub async fn record_downstream(
    pool: &PgPool,
    arrived: &[(String, uuid::Uuid)],
) -> anyhow::Result<()> {
    let (tenants, ids): (Vec<String>, Vec<uuid::Uuid>) = arrived.iter().cloned().unzip();
    sqlx::query(
        "INSERT INTO ledger.effects (tenant, message_id, subscription)
         SELECT t, m, 'ledger' FROM unnest($1::text[], $2::uuid[]) AS a (t, m)",
    )
    .bind(&tenants)
    .bind(&ids)
    .execute(pool)
    .await?;
    Ok(())
}

/// Writes one message and its oracle row in one producer transaction.
pub async fn produce(pool: &PgPool, tenant: &str, key: Option<&str>, n: u64) -> anyhow::Result<()> {
    let courier = Courier::postgres(pool.clone());
    let mut message = NewMessage::new(tenant, TOPIC, &serde_json::json!({ "n": n }))?;
    if let Some(key) = key {
        message = message.with_ordering_key(key);
    }
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO ledger.oracle (tenant, message_id, ordering_key) VALUES ($1, $2, $3)")
        .bind(tenant)
        .bind(message.id)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    courier.enqueue(&mut tx, &message).await?;
    tx.commit().await?;
    Ok(())
}

/// Writes messages `first..first + n` of `tenant` (no ordering key) and
/// their oracle rows in one producer transaction.
pub async fn produce_batch(pool: &PgPool, tenant: &str, first: u64, n: u64) -> anyhow::Result<()> {
    let courier = Courier::postgres(pool.clone());
    let messages = (first..first + n)
        .map(|i| NewMessage::new(tenant, TOPIC, &serde_json::json!({ "n": i })))
        .collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<uuid::Uuid> = messages.iter().map(|message| message.id).collect();
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO ledger.oracle (tenant, message_id) SELECT $1, unnest($2::uuid[])")
        .bind(tenant)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    courier.enqueue_batch(&mut tx, &messages).await?;
    tx.commit().await?;
    Ok(())
}

/// The tenant and ordering key of message `n` of a scenario's load: two
/// tenants, 20 keys, every fourth message without a key.
pub fn shape(n: u64) -> (&'static str, Option<String>) {
    let tenant = if n.is_multiple_of(2) {
        "acme"
    } else {
        "globex"
    };
    let key = (n % 4 != 3).then(|| format!("k{}", n % 20));
    (tenant, key)
}

/// The environment variable `name`, or an error naming it.
pub fn env_var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

/// Completes when this process's stdin closes: the suite holds every child's
/// stdin open, so that is the suite's end (it finished, was killed or timed
/// out), and nothing may outlive it. Exit the process after it with
/// `std::process::exit`: returning from `main` would wait for the blocking
/// read of stdin.
pub async fn stdin_closed() {
    let mut buf = [0_u8; 64];
    let mut stdin = tokio::io::stdin();
    loop {
        match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// A `chaos-worker` process.
pub struct Worker {
    child: Child,
    /// Held open: the worker exits when it closes (this process died).
    _stdin: tokio::process::ChildStdin,
    /// Its process id.
    pub pid: u32,
}

impl Worker {
    /// Starts the `chaos-worker` at `program` on `url`, its handler taking
    /// `handler` per message, and waits until it says it runs.
    pub async fn start(program: &str, url: &str, handler: Duration) -> anyhow::Result<Self> {
        Self::start_with(program, url, handler, &[]).await
    }

    /// [`Worker::start`] with extra environment (`CHAOS_PANIC_EVERY`).
    pub async fn start_with(
        program: &str,
        url: &str,
        handler: Duration,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        // Its connections carry a name, so a scenario can terminate them
        // alone. A session idle in a transaction for longer than the handler
        // timeout (5 s) and a margin belongs to a frozen or cut-off process:
        // the server ends it, and with it the row locks it holds (its
        // uncommitted receipts would hold up the delivery's next owner).
        let url = format!(
            "{url}?application_name={WORKER_APPLICATION}\
             &options=-c%20idle_in_transaction_session_timeout%3D{IDLE_IN_TRANSACTION_MS}"
        );
        let lease = LEASE.as_millis().to_string();
        let handler = handler.as_millis().to_string();
        let mut all: Vec<(&str, String)> = vec![
            ("CHAOS_DATABASE_URL", url),
            ("CHAOS_SUBSCRIPTION", SUBSCRIPTION.to_owned()),
            ("CHAOS_TOPIC", TOPIC.to_owned()),
            ("CHAOS_LEASE_MS", lease),
            ("CHAOS_HANDLER_MS", handler),
        ];
        all.extend(env.iter().cloned());
        Self::spawn(program, &all).await
    }

    /// Starts `program` with `env` and waits until it prints `ready`: the
    /// chaos worker as [`Worker::start_with`] configures it, or another of
    /// the suite's processes (`chaos-stream`).
    pub async fn spawn(program: &str, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let pid = child.id().context("the process exited at once")?;
        let stdin = child.stdin.take().context("the process's stdin")?;
        let stdout = child.stdout.take().context("the process's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .with_context(|| format!("{program} did not start within 60 s"))??;
        anyhow::ensure!(
            ready.as_deref() == Some("ready"),
            "{program} said {ready:?}"
        );
        Ok(Self {
            child,
            _stdin: stdin,
            pid,
        })
    }

    /// Sends `signal` (`KILL`, `TERM`, `STOP`, `CONT`).
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {} failed", self.pid);
        Ok(())
    }

    /// Waits for the process to exit; its exit code.
    pub async fn wait(&mut self) -> anyhow::Result<Option<i32>> {
        Ok(self.child.wait().await?.code())
    }
}

/// A `chaos-worker` restarted whenever it exits, as a process supervisor
/// (systemd, Kubernetes) would; killed when stopped or dropped.
pub struct Supervised {
    stop: tokio::sync::watch::Sender<bool>,
    exits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<anyhow::Result<Vec<Option<i32>>>>,
}

impl Supervised {
    /// Starts the worker as [`Worker::start_with`] does, and keeps it running.
    pub async fn start(
        program: &str,
        url: &str,
        handler: Duration,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let mut worker = Worker::start_with(program, url, handler, env).await?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let exits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = exits.clone();
        let (program, url) = (program.to_owned(), url.to_owned());
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect();
        let task = tokio::spawn(async move {
            let mut codes = Vec::new();
            loop {
                tokio::select! {
                    code = worker.wait() => codes.push(code?),
                    // Dropping the worker kills it.
                    _ = stopped.changed() => return Ok(codes),
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let env: Vec<(&str, String)> = env
                    .iter()
                    .map(|(key, value)| (key.as_str(), value.clone()))
                    .collect();
                worker = Worker::start_with(&program, &url, handler, &env).await?;
            }
        });
        Ok(Self { stop, exits, task })
    }

    /// How many times the worker exited (and was restarted) so far.
    pub fn exits(&self) -> usize {
        self.exits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Kills the worker; the exit code of each earlier exit (`None`: a
    /// signal, such as the `SIGABRT` of an abort).
    pub async fn stop(mut self) -> anyhow::Result<Vec<Option<i32>>> {
        let _ = self.stop.send(true);
        let codes = (&mut self.task).await?;
        // A commit it had already sent lands before the verdict is read.
        tokio::time::sleep(Duration::from_millis(500)).await;
        codes
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // A scenario that failed early: the task's worker is dropped, so killed.
        self.task.abort();
    }
}

/// What the ledger shows after a scenario.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Messages the load generator committed.
    pub messages: i64,
    /// Oracle rows with neither an effect in the ledger nor a dead letter.
    pub lost: i64,
    /// Receipts of the ledger's subscription with no effect behind them (the
    /// engine says applied, the ledger disagrees).
    pub unbacked: i64,
    /// Dead letters the scenario expects (a message that always crashes);
    /// any other number fails it.
    pub expected_dead_letters: i64,
    /// Messages whose effect was applied more than once.
    pub doubled: i64,
    /// Dead letters.
    pub dead_lettered: i64,
    /// Effects of no committed message.
    pub phantoms: i64,
    /// Effects recorded under another tenant than their message's.
    pub crossed: i64,
    /// Running deliveries whose lease expired longer than R ago.
    pub stuck: i64,
    /// Pairs of runs of one ordering key that overlapped in time.
    pub overlapping: i64,
    /// Dead letters over the attempt limit or without a last error.
    pub bad_attempts: i64,
}

impl Verdict {
    /// Whether every invariant holds.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.unbacked == 0
            && self.dead_lettered == self.expected_dead_letters
            && self.doubled == 0
            && self.phantoms == 0
            && self.crossed == 0
            && self.stuck == 0
            && self.overlapping == 0
            && self.bad_attempts == 0
    }
}

async fn count(pool: &PgPool, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

/// Checks the ledger's invariants.
pub async fn verdict(pool: &PgPool) -> anyhow::Result<Verdict> {
    Ok(Verdict {
        messages: count(pool, "SELECT count(*) FROM ledger.oracle").await?,
        lost: verdict_lost(pool).await?,
        unbacked: count(
            pool,
            "SELECT count(*) FROM courier.receipts r
             WHERE r.subscription = 'ledger'
               AND NOT EXISTS (SELECT 1 FROM ledger.effects e WHERE e.message_id = r.message_id)",
        )
        .await?,
        expected_dead_letters: 0,
        doubled: count(
            pool,
            "SELECT count(*) FROM (SELECT 1 FROM ledger.effects
                                   GROUP BY message_id, subscription HAVING count(*) > 1) d",
        )
        .await?,
        dead_lettered: count(
            pool,
            "SELECT count(*) FROM courier.deliveries WHERE state = 'dead'",
        )
        .await?,
        phantoms: count(
            pool,
            "SELECT count(*) FROM ledger.effects e
             WHERE NOT EXISTS (SELECT 1 FROM ledger.oracle o WHERE o.message_id = e.message_id)",
        )
        .await?,
        crossed: count(
            pool,
            "SELECT count(*) FROM ledger.effects e JOIN ledger.oracle o USING (message_id)
             WHERE e.tenant <> o.tenant",
        )
        .await?,
        stuck: count(pool, &stuck_sql()).await?,
        overlapping: count(
            pool,
            "SELECT count(*) FROM ledger.runs a JOIN ledger.runs b
               ON a.tenant = b.tenant AND a.ordering_key = b.ordering_key
              AND a.message_id < b.message_id
              AND a.started_at < b.ended_at AND b.started_at < a.ended_at",
        )
        .await?,
        bad_attempts: count(
            pool,
            "SELECT count(*) FROM courier.deliveries
             WHERE state = 'dead'
               AND (attempts > coalesce(max_attempts, 1) OR jsonb_array_length(errors) = 0)",
        )
        .await?,
    })
}

/// Waits until every oracle row has an effect or a dead letter, for up to
/// `limit`; how long that took. Called once the fault is over, it fails at
/// once when a delivery is stuck after the first R (running, its lease
/// expired more than R ago: a fault such as a locked table can keep the
/// rescuer from leases that expire meanwhile, but not past R after it).
pub async fn drained(pool: &PgPool, limit: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let checked = if start.elapsed() > RECOVERY {
            count(pool, &stuck_sql()).await.ok()
        } else {
            None
        };
        if let Some(stuck) = checked {
            if stuck > 0 {
                anyhow::bail!(
                    "{stuck} deliveries stuck: running, their lease expired over {RECOVERY:?} \
                     ago\n{}",
                    stuck_report(pool).await
                );
            }
        }
        let lost = verdict_lost(pool).await;
        if matches!(lost, Ok(0)) {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{lost:?} messages still undelivered after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a failure report needs to explain stuck deliveries: who holds
/// them, and what every session of the cluster is doing or waiting for.
async fn stuck_report(pool: &PgPool) -> String {
    let lines = |sql: &'static str| async move {
        match sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await {
            Ok(rows) => rows
                .iter()
                .map(|row| format!("  {row}\n"))
                .collect::<String>(),
            Err(error) => format!("  {error}\n"),
        }
    };
    let stuck = lines(
        "SELECT format('%s claimed by %s, attempt %s, expired %s ago', id, claimed_by, attempts,
                       clock_timestamp() - lease_expires_at)
         FROM courier.deliveries WHERE state = 'running' AND lease_expires_at < clock_timestamp()
         ORDER BY id LIMIT 20",
    )
    .await;
    let sessions = lines(
        "SELECT format('pid %s %s %s wait %s, in a transaction for %s, blocked by %s: %s', pid,
                       application_name, state, wait_event_type || ':' || wait_event,
                       clock_timestamp() - xact_start, pg_blocking_pids(pid), left(query, 90))
         FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
         ORDER BY pid",
    )
    .await;
    format!("stuck:\n{stuck}sessions:\n{sessions}")
}

/// Running deliveries whose lease expired more than R ago.
fn stuck_sql() -> String {
    format!(
        "SELECT count(*) FROM courier.deliveries
         WHERE state = 'running'
           AND lease_expires_at < clock_timestamp() - interval '{} milliseconds'",
        RECOVERY.as_millis()
    )
}

/// Oracle rows with neither an effect in the ledger nor a dead letter.
async fn verdict_lost(pool: &PgPool) -> anyhow::Result<i64> {
    count(
        pool,
        "SELECT count(*) FROM ledger.oracle o
         WHERE NOT EXISTS (SELECT 1 FROM ledger.effects e
                           WHERE e.message_id = o.message_id AND e.subscription = 'ledger')
           AND NOT EXISTS (SELECT 1 FROM courier.deliveries d
                           WHERE d.message_id = o.message_id AND d.subscription = 'ledger'
                             AND d.state = 'dead')",
    )
    .await
}

/// Prints the scenario's row and appends it to the suite's table
/// (`target/chaos/report.tsv`, printed by `scripts/chaos`); fails unless
/// every invariant holds.
pub fn report(scenario: &str, verdict: &Verdict, recovery: Duration) -> anyhow::Result<()> {
    let row = format!(
        "{scenario}\t{}\t{}\t{}\t{}\t{:.1}\t{}",
        verdict.messages,
        verdict.lost,
        verdict.doubled,
        verdict.dead_lettered,
        recovery.as_secs_f64(),
        if verdict.passed() { "pass" } else { "FAIL" }
    );
    println!("{row}\n{verdict:?}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/chaos");
    std::fs::create_dir_all(&dir)?;
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("report.tsv"))?;
    writeln!(file, "{row}")?;
    anyhow::ensure!(verdict.passed(), "{scenario}: {verdict:?}");
    Ok(())
}

/// How many effects each process applied (pid → count).
pub async fn effects_by_process(pool: &PgPool) -> anyhow::Result<HashMap<i32, i64>> {
    let rows: Vec<(i32, i64)> =
        sqlx::query_as("SELECT pid, count(*) FROM ledger.runs GROUP BY pid")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}
