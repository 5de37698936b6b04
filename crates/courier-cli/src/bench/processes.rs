//! Drain by worker processes (PostgreSQL): `drain.noop`'s backlog, topic,
//! subscription and no-op handler, drained by 1, 2 and 4 separate
//! `courier bench-worker` processes on the one database instead of a worker
//! inside the bench.
//!
//! The parent registers the subscription before loading (so every message
//! fans out to it), loads and analyzes as `drain.noop` does, starts the
//! children and waits until each says `ready` (connected, worker built).
//! The clock runs from writing `go` to the children until no delivery is
//! open (every outcome settled); then each child gets `stop`, shuts its
//! worker down and says `handled <n>`. The measurement fails if the children
//! handled fewer messages than were loaded, if any delivery is left or
//! dead-lettered, or if a child exits early or with a failure; the children
//! are killed on every error path (and on Ctrl-C), never left running.
//!
//! [`worker_process`] is the child's side: the hidden `courier bench-worker`
//! subcommand.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use courier::{handler_fn, Courier, HandlerError, Message};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::drain::{load_noop, redelivered_note, time_limit, TOPIC};
use super::fixture::{BenchPayload, Fixture};
use super::measure::Progress;
use super::{Measurement, Plan, Throughput};

/// How many worker processes each measurement runs.
const PROCESSES: [usize; 3] = [1, 2, 4];
/// The subscription, as `drain.noop`'s.
const SUBSCRIPTION: &str = "bench";
/// Connections each worker process may open.
const WORKER_POOL_SIZE: u32 = 8;

/// How long a child may take to connect and build its worker.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long a child may take to shut down after `stop` (the worker's
/// shutdown timeout is 30 s by default).
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// What `courier bench-worker` was asked to do: one worker for
/// `subscription`, handling `topic` (version 1) with a no-op handler.
#[derive(Debug, Clone)]
pub struct WorkerProcessOptions {
    /// `postgres://…`.
    pub database_url: String,
    /// The schema Courier's tables are in.
    pub schema: String,
    /// The subscription to work for (registered if it does not exist).
    pub subscription: String,
    /// The topic the no-op handler takes.
    pub topic: String,
    /// Handlers running at once; the backend's default if `None`.
    pub concurrency: Option<usize>,
    /// Deliveries claimed per round trip; the backend's default if `None`.
    pub batch_size: Option<usize>,
}

/// The child's side, `courier bench-worker`: connects, builds the worker
/// (registering the subscription), prints `ready` on stdout, waits for a
/// line `go` on stdin, runs the worker until a line `stop`, the end of stdin,
/// SIGTERM or SIGINT, shuts it down gracefully and prints `handled <n>` (its
/// handler calls). An error (stdin closed before `go` included) is returned
/// before `handled` is printed.
pub async fn worker_process(options: &WorkerProcessOptions) -> anyhow::Result<()> {
    // A smaller pool than a daemon's: four of these beside the bench's own
    // pool (and, in CI, other tests) must stay inside max_connections.
    let pool = courier::postgres::connect(&options.database_url, WORKER_POOL_SIZE)
        .await
        .context("connecting to PostgreSQL")?;
    let courier = Courier::postgres_with_schema(pool, &options.schema)?;
    let handled = Arc::new(AtomicU64::new(0));
    let mut builder = courier.worker(options.subscription.as_str());
    if let Some(concurrency) = options.concurrency {
        builder = builder.concurrency(concurrency);
    }
    if let Some(batch_size) = options.batch_size {
        builder = builder.batch_size(batch_size);
    }
    let counter = Arc::clone(&handled);
    let worker = builder
        .handle(
            options.topic.as_str(),
            1,
            handler_fn(move |_message: Message<BenchPayload>| {
                counter.fetch_add(1, Ordering::Relaxed);
                async { Ok::<(), HandlerError>(()) }
            }),
        )
        .build()
        .await
        .context("building the worker")?;
    let mut commands = stdin_lines();
    say("ready")?;
    let go = tokio::select! {
        go = wait_for_go(&mut commands) => go?,
        () = terminated() => false,
    };
    if go {
        let running = worker.start();
        tokio::select! {
            () = wait_for_stop(&mut commands) => {}
            () = terminated() => {}
        }
        running.shutdown().await;
    }
    // The pool closes as the process exits (closing it here would leave the
    // LISTEN task retrying on a closed pool, warning as it does).
    say(&format!("handled {}", handled.load(Ordering::Relaxed)))
}

/// Standard input's lines, read on a thread of their own (the channel closes
/// at the end of input or on a read error).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Whether `go` arrived (`false` for `stop`); an error if input ended first.
async fn wait_for_go(
    commands: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> anyhow::Result<bool> {
    while let Some(line) = commands.recv().await {
        match line.trim() {
            "go" => return Ok(true),
            "stop" => return Ok(false),
            _ => {}
        }
    }
    anyhow::bail!("standard input ended before `go`")
}

/// Returns at a line `stop` or the end of input.
async fn wait_for_stop(commands: &mut tokio::sync::mpsc::UnboundedReceiver<String>) {
    while let Some(line) = commands.recv().await {
        if line.trim() == "stop" {
            return;
        }
    }
}

/// Completes on SIGTERM or SIGINT (never, where neither can be listened for).
async fn terminated() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    () = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => interrupt.await,
        }
    }
    #[cfg(not(unix))]
    interrupt.await;
}

/// One line on stdout, flushed at once (the parent waits for it).
fn say(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("writing to standard output")
}

/// `drain.processes_1`, `_2` and `_4`, or a skipped note for each where they
/// cannot run: on SQLite, and without `worker_program` (the bench code run
/// from another executable than `courier`, as `cargo bench` does).
pub(crate) async fn run<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    worker_program: Option<&Path>,
    baseline: Option<Throughput>,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    for processes in PROCESSES {
        let id = format!("drain.processes_{processes}");
        let label = label(processes);
        if fixture.postgres().is_none() {
            out.push(Measurement::skipped(
                &id,
                &label,
                "skipped: PostgreSQL only (a SQLite file takes one writer at a time, so more processes only queue)",
            ));
            continue;
        }
        let Some(program) = worker_program else {
            out.push(Measurement::skipped(
                &id,
                &label,
                "skipped: needs the `courier` binary to start `courier bench-worker` processes (run `courier bench`)",
            ));
            continue;
        };
        let measurement = drain(fixture, plan, processes, program, baseline)
            .await
            .with_context(|| id.clone())?;
        out.push(measurement);
    }
    Ok(())
}

fn label(processes: usize) -> String {
    match processes {
        1 => "no-op handler, 1 worker process".to_owned(),
        n => format!("no-op handler, {n} worker processes"),
    }
}

async fn drain<F: Fixture>(
    fixture: &mut F,
    plan: &Plan,
    processes: usize,
    program: &Path,
    baseline: Option<Throughput>,
) -> anyhow::Result<Measurement> {
    let id = format!("drain.processes_{processes}");
    let courier = fixture.fresh().await?;
    let url = fixture
        .postgres_url()
        .context("worker processes need a PostgreSQL URL")?
        .to_owned();
    let schema = fixture
        .postgres()
        .map(|(_, schema)| schema.to_owned())
        .context("worker processes need PostgreSQL")?;
    // Building a worker registers the subscription, which must exist before
    // the messages are enqueued for them to fan out to it; this one never runs.
    drop(
        plan.configure(courier.worker(SUBSCRIPTION))
            .handle(
                TOPIC,
                1,
                handler_fn(|_message: Message<BenchPayload>| async { Ok::<(), HandlerError>(()) }),
            )
            .build()
            .await?,
    );
    load_noop(&courier, plan, &format!("loading {id}")).await?;
    fixture.analyze().await?;

    // Dropped on every early return below: kill_on_drop ends the children.
    let mut children = Vec::with_capacity(processes);
    for _ in 0..processes {
        children.push(WorkerChild::spawn(program, &url, &schema, plan)?);
    }
    for child in &mut children {
        child.expect_ready().await?;
    }

    let deliveries = plan.messages;
    let done = Arc::new(AtomicU64::new(0));
    let shown = Arc::clone(&done);
    let progress = Progress::start(plan.progress, &id, Some(deliveries), move || {
        shown.load(Ordering::Relaxed)
    });
    let started = Instant::now();
    for child in &mut children {
        child.send("go").await?;
    }
    let limit = time_limit(deliveries);
    let finished = tokio::time::timeout(limit, async {
        loop {
            let left = fixture.deliveries_open().await?;
            done.store(
                deliveries.saturating_sub(u64::try_from(left).unwrap_or(0)),
                Ordering::Relaxed,
            );
            if left == 0 {
                return anyhow::Ok(());
            }
            for child in &mut children {
                child.still_running()?;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let elapsed = started.elapsed();
    progress.finish();
    match finished {
        Ok(waited) => waited?,
        Err(_) => {
            let left = fixture.deliveries_left().await?;
            anyhow::bail!("{left} of {deliveries} deliveries left after {limit:?}");
        }
    }

    for child in &mut children {
        child.send("stop").await?;
    }
    let mut handled = 0;
    for child in &mut children {
        handled += child.finish().await?;
    }
    let left = fixture.deliveries_left().await?;
    if left != 0 {
        anyhow::bail!("{left} deliveries left or dead-lettered after the drain");
    }
    if handled < deliveries {
        anyhow::bail!("the worker processes handled {handled} of {deliveries} messages");
    }
    let mut measurement = Measurement::throughput(
        &id,
        &label(processes),
        Throughput::new(deliveries, elapsed),
        baseline,
    );
    let workers = format!(
        "{processes} `courier bench-worker` process{}, one worker each; peak RSS is not measured",
        if processes == 1 { "" } else { "es" }
    );
    measurement.note = Some(match redelivered_note(handled, deliveries) {
        Some(note) => format!("{workers}; {note}"),
        None => workers,
    });
    Ok(measurement)
}

/// A `courier bench-worker` child and its pipes; killed if dropped running.
struct WorkerChild {
    process: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl WorkerChild {
    fn spawn(program: &Path, url: &str, schema: &str, plan: &Plan) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::new(program);
        command
            .arg("bench-worker")
            .args(["--schema", schema])
            .args(["--subscription", SUBSCRIPTION])
            .args(["--topic", TOPIC]);
        if let Some(concurrency) = plan.concurrency {
            command.args(["--concurrency", &concurrency.to_string()]);
        }
        if let Some(batch_size) = plan.batch_size {
            command.args(["--batch-size", &batch_size.to_string()]);
        }
        // The URL (a password, perhaps) goes by environment, not on the
        // command line anyone can read in `ps`.
        command
            .env("COURIER_DATABASE_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut process = command
            .spawn()
            .with_context(|| format!("starting {} bench-worker", program.display()))?;
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            anyhow::bail!("the worker process's pipes were not opened");
        };
        Ok(Self {
            process,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        })
    }

    /// The child's next line on stdout, `None` at its end.
    async fn line(&mut self, limit: Duration, waiting_for: &str) -> anyhow::Result<Option<String>> {
        tokio::time::timeout(limit, self.stdout.next_line())
            .await
            .map_err(|_| {
                anyhow::anyhow!("a worker process did not say {waiting_for} within {limit:?}")
            })?
            .context("reading a worker process's output")
    }

    async fn expect_ready(&mut self) -> anyhow::Result<()> {
        match self.line(READY_LIMIT, "`ready`").await? {
            Some(line) if line.trim() == "ready" => Ok(()),
            Some(line) => anyhow::bail!("a worker process said {line:?} instead of `ready`"),
            None => {
                let status = self.process.wait().await?;
                anyhow::bail!("a worker process exited ({status}) before it was ready")
            }
        }
    }

    async fn send(&mut self, command: &str) -> anyhow::Result<()> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .and(self.stdin.flush().await)
            .with_context(|| format!("telling a worker process to {command}"))
    }

    /// An error if the child has exited.
    fn still_running(&mut self) -> anyhow::Result<()> {
        match self.process.try_wait()? {
            Some(status) => anyhow::bail!("a worker process exited ({status}) during the drain"),
            None => Ok(()),
        }
    }

    /// After `stop`: its `handled <n>`, once it has exited successfully.
    async fn finish(&mut self) -> anyhow::Result<u64> {
        let mut handled = None;
        while let Some(line) = self.line(STOP_LIMIT, "`handled <n>`").await? {
            if let Some(count) = line.trim().strip_prefix("handled ") {
                handled = Some(count.parse::<u64>().with_context(|| {
                    format!("a worker process said {line:?}, not `handled <n>`")
                })?);
            }
        }
        let status = tokio::time::timeout(STOP_LIMIT, self.process.wait())
            .await
            .map_err(|_| {
                anyhow::anyhow!("a worker process did not exit within {STOP_LIMIT:?}")
            })??;
        if !status.success() {
            anyhow::bail!("a worker process failed ({status})");
        }
        handled.context("a worker process exited without saying `handled <n>`")
    }
}
