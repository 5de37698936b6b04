//! Practice sessions: seed 000 (the learning outbox processor) done right.
//!
//! A student submits a practice session: the report row and a
//! `practice_session_submitted` message commit in one transaction. The
//! `wrong_questions_v1` subscription's transactional handler upserts
//! `wrong_questions` (`wrong_count = wrong_count + 1`) in the delivery's
//! transaction, with the receipt and the completion, so each report counts
//! exactly once however often it is delivered and wherever a worker dies.
//!
//! `practice-sessions run` does it all on embedded SQLite and checks the counts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{Courier, HandlerError, Message, NewMessage, TransactionalHandler};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, SqliteConnection};

const TOPIC: &str = "practice_session_submitted";
const SUBSCRIPTION: &str = "wrong_questions_v1";

#[derive(Parser)]
#[command(
    version,
    about = "Practice sessions on Courier: reports, events and an exactly-once projection"
)]
struct Cli {
    /// `postgres://…` or a SQLite file path.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "practice-sessions.db",
        global = true
    )]
    database_url: String,
    /// PostgreSQL schema for Courier's tables (and the example's, via search_path).
    #[arg(long, default_value = "courier", global = true)]
    schema: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Submit sessions, deliver them all, and check every count (the default).
    Run {
        /// Sessions to submit.
        #[arg(long, default_value_t = 200)]
        sessions: usize,
    },
    /// Submit practice sessions (report + message in one transaction each).
    Submit {
        /// Sessions to submit.
        #[arg(long, default_value_t = 200)]
        sessions: usize,
    },
    /// Run the wrong_questions_v1 workers.
    Work {
        /// Stop once nothing is left to deliver.
        #[arg(long)]
        exit_when_drained: bool,
        /// Lease length in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
        /// Pause inside each handler (to widen the window for crash tests).
        #[arg(long, default_value_t = 0)]
        handler_delay_ms: u64,
    },
    /// Compare wrong_questions with what the reports say; exit 1 on any difference.
    Verify,
}

/// The event: which questions a student got wrong in one session.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PracticeSessionSubmitted {
    report_id: String,
    user_id: String,
    wrong_question_ids: Vec<i64>,
}

/// The `wrong_questions_v1` projection.
#[derive(Clone)]
struct WrongQuestions {
    delay: Duration,
}

impl TransactionalHandler<PgConnection> for WrongQuestions {
    type Payload = PracticeSessionSubmitted;

    async fn handle(
        &self,
        message: &Message<PracticeSessionSubmitted>,
        conn: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        for question in &message.payload.wrong_question_ids {
            sqlx::query(
                "INSERT INTO wrong_questions (tenant, user_id, question_id, wrong_count)
                 VALUES ($1, $2, $3, 1)
                 ON CONFLICT (tenant, user_id, question_id)
                 DO UPDATE SET wrong_count = wrong_questions.wrong_count + 1",
            )
            .bind(&message.tenant)
            .bind(&message.payload.user_id)
            .bind(question)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}

impl TransactionalHandler<SqliteConnection> for WrongQuestions {
    type Payload = PracticeSessionSubmitted;

    async fn handle(
        &self,
        message: &Message<PracticeSessionSubmitted>,
        conn: &mut SqliteConnection,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        for question in &message.payload.wrong_question_ids {
            sqlx::query(
                "INSERT INTO wrong_questions (tenant, user_id, question_id, wrong_count)
                 VALUES (?1, ?2, ?3, 1)
                 ON CONFLICT (tenant, user_id, question_id)
                 DO UPDATE SET wrong_count = wrong_questions.wrong_count + 1",
            )
            .bind(&message.tenant)
            .bind(&message.payload.user_id)
            .bind(question)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}

const APP_TABLES: &str = "
CREATE TABLE IF NOT EXISTS practice_reports (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  user_id text NOT NULL,
  wrong_question_ids text NOT NULL
);
CREATE TABLE IF NOT EXISTS wrong_questions (
  tenant text NOT NULL,
  user_id text NOT NULL,
  question_id bigint NOT NULL,
  wrong_count integer NOT NULL,
  PRIMARY KEY (tenant, user_id, question_id)
);";

fn session(index: usize) -> (String, PracticeSessionSubmitted) {
    let mut rng = fastrand::Rng::with_seed(u64::try_from(index).unwrap_or(0));
    let tenant = format!("school-{}", rng.usize(1..=3));
    let wrong = (0..rng.usize(1..=5)).map(|_| rng.i64(1..=20)).collect();
    (
        tenant,
        PracticeSessionSubmitted {
            report_id: uuid::Uuid::now_v7().to_string(),
            user_id: format!("student-{}", rng.usize(1..=10)),
            wrong_question_ids: wrong,
        },
    )
}

/// What every operation needs, on either backend.
enum App {
    Postgres(Courier<PgStore>, sqlx::PgPool),
    Sqlite(Courier<SqliteStore>, sqlx::SqlitePool),
}

impl App {
    async fn open(url: &str, schema: &str) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let options = courier::postgres::connect_options(url)?;
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(10)
                .connect_with(options.options([("search_path", schema)]))
                .await
                .with_context(|| format!("connecting to {url}"))?;
            let courier = Courier::postgres_with_schema(pool.clone(), schema)?;
            courier.migrate().await?;
            sqlx::raw_sql(APP_TABLES).execute(&pool).await?;
            Ok(App::Postgres(courier, pool))
        } else {
            let courier = Courier::connect_sqlite(url)
                .await
                .with_context(|| format!("opening {url}"))?;
            courier.migrate().await?;
            let pool = courier.store().pool().clone();
            sqlx::raw_sql(APP_TABLES).execute(&pool).await?;
            Ok(App::Sqlite(courier, pool))
        }
    }

    /// One session: the report and its message in one transaction.
    async fn submit(&self, sessions: usize) -> anyhow::Result<()> {
        let offset: i64 = self.scalar("SELECT count(*) FROM practice_reports").await?;
        let offset = usize::try_from(offset)?;
        for index in offset..offset + sessions {
            let (tenant, event) = session(index);
            // One student's sessions are counted one at a time: two
            // transactions upserting the same student's rows in different
            // orders deadlock on PostgreSQL (and, with short leases, kept a
            // worker from progressing).
            let message = NewMessage::new(&tenant, TOPIC, &event)?
                .with_idempotency_key(&event.report_id)
                .with_ordering_key(&event.user_id);
            let wrong = serde_json::to_string(&event.wrong_question_ids)?;
            match self {
                App::Postgres(courier, pool) => {
                    let mut tx = pool.begin().await?;
                    sqlx::query("INSERT INTO practice_reports (id, tenant, user_id, wrong_question_ids) VALUES ($1, $2, $3, $4)")
                        .bind(&event.report_id).bind(&tenant).bind(&event.user_id).bind(&wrong)
                        .execute(&mut *tx).await?;
                    courier.enqueue(&mut tx, &message).await?;
                    tx.commit().await?;
                }
                App::Sqlite(courier, pool) => {
                    let mut tx = pool.begin().await?;
                    sqlx::query("INSERT INTO practice_reports (id, tenant, user_id, wrong_question_ids) VALUES (?1, ?2, ?3, ?4)")
                        .bind(&event.report_id).bind(&tenant).bind(&event.user_id).bind(&wrong)
                        .execute(&mut *tx).await?;
                    courier.enqueue(&mut tx, &message).await?;
                    tx.commit().await?;
                }
            }
        }
        Ok(())
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(match self {
            App::Postgres(_, pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            App::Sqlite(_, pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        })
    }

    async fn rows(&self, sql: &str) -> anyhow::Result<Vec<(String, String, String)>> {
        Ok(match self {
            App::Postgres(_, pool) => sqlx::query_as(sql).fetch_all(pool).await?,
            App::Sqlite(_, pool) => sqlx::query_as(sql).fetch_all(pool).await?,
        })
    }

    async fn work(
        &self,
        exit_when_drained: bool,
        lease: Duration,
        delay: Duration,
    ) -> anyhow::Result<()> {
        let handler = WrongQuestions { delay };
        let stop = async {
            if exit_when_drained {
                self.wait_until_drained().await
            } else {
                tokio::signal::ctrl_c().await.map_err(anyhow::Error::from)
            }
        };
        match self {
            App::Postgres(courier, _) => {
                let worker = courier
                    .worker(SUBSCRIPTION)
                    .handle_transactional(TOPIC, 1, handler)
                    .lease(lease)
                    .build()
                    .await?
                    .start();
                let result = stop.await;
                worker.shutdown().await;
                result
            }
            App::Sqlite(courier, _) => {
                let worker = courier
                    .worker(SUBSCRIPTION)
                    .handle_transactional(TOPIC, 1, handler)
                    .lease(lease)
                    .build()
                    .await?
                    .start();
                let result = stop.await;
                worker.shutdown().await;
                result
            }
        }
    }

    /// Registers the subscription without running it, so messages wait for it.
    async fn register(&self) -> anyhow::Result<()> {
        let spec = courier::SubscriptionSpec::new(SUBSCRIPTION, [TOPIC]);
        match self {
            App::Postgres(courier, _) => {
                courier::OutboxStore::register_subscription(courier.store(), &spec).await?;
            }
            App::Sqlite(courier, _) => {
                courier::OutboxStore::register_subscription(courier.store(), &spec).await?;
            }
        }
        Ok(())
    }

    async fn wait_until_drained(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let left = self
                .scalar("SELECT count(*) FROM deliveries WHERE state <> 'dead'")
                .await?;
            if left == 0 {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("{left} deliveries still pending after 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Compares the projection with the reports; returns the number of rows that differ.
    async fn verify(&self) -> anyhow::Result<usize> {
        let mut expected: BTreeMap<(String, String, i64), i64> = BTreeMap::new();
        for (tenant, user, wrong) in self
            .rows("SELECT tenant, user_id, wrong_question_ids FROM practice_reports")
            .await?
        {
            for question in serde_json::from_str::<Vec<i64>>(&wrong)? {
                *expected
                    .entry((tenant.clone(), user.clone(), question))
                    .or_insert(0) += 1;
            }
        }
        let mut actual: BTreeMap<(String, String, i64), i64> = BTreeMap::new();
        let sql = "SELECT tenant, user_id, CAST(question_id AS TEXT) || ':' || CAST(wrong_count AS TEXT) FROM wrong_questions";
        for (tenant, user, pair) in self.rows(sql).await? {
            let (question, count) = pair.split_once(':').context("malformed row")?;
            actual.insert((tenant, user, question.parse()?), count.parse()?);
        }
        let mut differences = 0;
        for key in expected
            .keys()
            .chain(actual.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            let (want, got) = (
                expected.get(key).copied().unwrap_or(0),
                actual.get(key).copied().unwrap_or(0),
            );
            if want != got {
                differences += 1;
                eprintln!(
                    "{} / {} / question {}: expected {want}, found {got}",
                    key.0, key.1, key.2
                );
            }
        }
        let reports = self.scalar("SELECT count(*) FROM practice_reports").await?;
        let receipts = self.scalar("SELECT count(*) FROM receipts").await?;
        println!("reports: {reports}  receipts: {receipts}  projection rows: {}  differences: {differences}", actual.len());
        Ok(differences)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let app = App::open(&cli.database_url, &cli.schema).await?;
    match cli.command.unwrap_or(Command::Run { sessions: 200 }) {
        Command::Run { sessions } => {
            app.register().await?;
            let started = Instant::now();
            app.submit(sessions).await?;
            println!(
                "submitted {sessions} practice sessions to {}",
                cli.database_url
            );
            app.work(true, Duration::from_secs(30), Duration::ZERO)
                .await?;
            println!("delivered in {:.2?}", started.elapsed());
            if app.verify().await? > 0 {
                bail!("wrong_questions does not match the reports");
            }
            println!("every wrong_count is exact");
        }
        Command::Submit { sessions } => {
            app.register().await?;
            app.submit(sessions).await?;
            println!("submitted {sessions} practice sessions");
        }
        Command::Work {
            exit_when_drained,
            lease_ms,
            handler_delay_ms,
        } => {
            app.work(
                exit_when_drained,
                Duration::from_millis(lease_ms),
                Duration::from_millis(handler_delay_ms),
            )
            .await?;
        }
        Command::Verify => {
            if app.verify().await? > 0 {
                bail!("wrong_questions does not match the reports");
            }
            println!("every wrong_count is exact");
        }
    }
    Ok(())
}
