//! What the operator verbs ([`crate::commands`], [`crate::streams`]) stand
//! on: [`Store`], a Courier database's operations (the same database a
//! `courier serve` uses); [`Remote`], a running daemon's API; NDJSON
//! publishing; JSON and table printing.

use std::io::BufRead;

use anyhow::{bail, Context};
use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{
    AdminStore, Courier, DeadLetter, DeadLetterFilter, DeadLetterKey, DeadLetterStore,
    DeliveryStats, DeliveryTotals, EnqueueOutcome, NewMessage, OutboxStore, SubscriptionInfo,
    MAX_LIST_PAGE,
};

use crate::database::{validate_schema, Database};

/// Messages per transaction when publishing NDJSON.
pub const PUBLISH_BATCH: usize = 500;

/// Courier over whichever database a URL names, without migrating it.
pub enum Store {
    /// PostgreSQL.
    Postgres(Courier<PgStore>),
    /// SQLite.
    Sqlite(Courier<SqliteStore>),
}

macro_rules! with_store {
    ($store:expr, $courier:ident => $body:expr) => {
        match $store {
            Store::Postgres($courier) => $body,
            Store::Sqlite($courier) => $body,
        }
    };
}

impl Store {
    /// Opens the database; refuses one that `courier migrate` (or `serve`) never set up.
    pub async fn open(database: &Database, schema: &str) -> anyhow::Result<Self> {
        let store = match database {
            Database::Postgres { url } => {
                validate_schema(schema)?;
                let pool = courier::postgres::connect(url, 4)
                    .await
                    .context("connecting to PostgreSQL")?;
                Store::Postgres(Courier::postgres_with_schema(pool, schema)?)
            }
            Database::Sqlite { path } => {
                if !std::path::Path::new(path).exists() {
                    bail!("no Courier database at {path} (run `courier serve` or `courier migrate` first, or pass --database-url)");
                }
                Store::Sqlite(
                    Courier::connect_sqlite(path)
                        .await
                        .with_context(|| format!("opening {path}"))?,
                )
            }
        };
        let ready = with_store!(&store, courier => courier.store().ready().await)?;
        if !ready {
            bail!("the database's Courier schema is missing or not current; run `courier migrate`");
        }
        Ok(store)
    }

    /// The database's native streams.
    pub fn streams(&self) -> std::sync::Arc<dyn courier_server::ApiStreams> {
        with_store!(self, courier => std::sync::Arc::new(courier.store().clone()))
    }

    /// Publishes messages in one transaction.
    pub async fn publish(&self, messages: &[NewMessage]) -> anyhow::Result<Vec<EnqueueOutcome>> {
        Ok(with_store!(self, courier => courier.publish(messages).await)?)
    }

    /// Open deliveries in total and per subscription and topic (every page).
    pub async fn status(&self) -> anyhow::Result<(DeliveryTotals, Vec<DeliveryStats>)> {
        let totals =
            with_store!(self, courier => courier.store().delivery_totals(None, None).await)?;
        let mut rows = Vec::new();
        let mut after = None;
        loop {
            let page = with_store!(self, courier => courier.store().delivery_stats(None, after.as_ref(), MAX_LIST_PAGE).await)?;
            rows.extend(page.items);
            match page.next_cursor {
                Some(key) => after = Some(key),
                None => return Ok((totals, rows)),
            }
        }
    }

    /// Registered subscriptions, by name (every page).
    pub async fn subscriptions(&self) -> anyhow::Result<Vec<SubscriptionInfo>> {
        let mut subscriptions = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = with_store!(self, courier => courier.store().list_subscriptions(after.as_deref(), MAX_LIST_PAGE).await)?;
            subscriptions.extend(page.items);
            match page.next_cursor {
                Some(name) => after = Some(name),
                None => return Ok(subscriptions),
            }
        }
    }

    /// Pauses or resumes a subscription; fails if it does not exist.
    pub async fn set_paused(&self, name: &str, paused: bool) -> anyhow::Result<()> {
        let found = with_store!(self, courier => courier.store().set_subscription_paused(name, paused).await)?;
        if !found {
            bail!("no subscription named {name:?}");
        }
        Ok(())
    }

    /// Creates a subscription or adds topics to it (see
    /// [`OutboxStore::register_subscription`](courier::OutboxStore::register_subscription)).
    pub async fn register(
        &self,
        spec: &courier::SubscriptionSpec,
    ) -> anyhow::Result<courier::Registration> {
        Ok(with_store!(self, courier => courier.store().register_subscription(spec).await)?)
    }

    /// Removes topic patterns from a subscription; fails if it does not exist.
    pub async fn remove_topics(&self, name: &str, patterns: &[String]) -> anyhow::Result<u64> {
        let known = with_store!(self, courier => courier.store().get_subscription(name).await)?;
        if known.is_none() {
            bail!("no subscription named {name:?}");
        }
        Ok(
            with_store!(self, courier => courier.store().remove_subscription_topics(name, patterns).await)?,
        )
    }

    /// One page of dead letters.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> anyhow::Result<courier::DeadLetterPage> {
        Ok(with_store!(self, courier => courier.dead_letters(filter, after, limit).await)?)
    }

    /// Dead letters grouped by the fingerprint of their last failure,
    /// largest first, at most `limit` groups.
    pub async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> anyhow::Result<Vec<courier::DeadLetterGroup>> {
        Ok(with_store!(self, courier => courier.dead_letter_groups(filter, limit).await)?)
    }

    /// Cancels a message no subscription has started on.
    pub async fn cancel(&self, id: uuid::Uuid) -> anyhow::Result<courier::CancelOutcome> {
        Ok(with_store!(self, courier => courier.store().cancel_message(id).await)?)
    }

    /// One dead letter.
    pub async fn dead_letter(&self, id: i64) -> anyhow::Result<Option<DeadLetter>> {
        Ok(with_store!(self, courier => courier.store().get_dead_letter(id).await)?)
    }

    /// Retries dead letters by id, or every one matching `filter` when `ids` is empty.
    pub async fn retry(&self, ids: &[i64], filter: &DeadLetterFilter) -> anyhow::Result<u64> {
        Ok(if ids.is_empty() {
            with_store!(self, courier => courier.retry_dead_letters_matching(filter).await)?
        } else {
            with_store!(self, courier => courier.retry_dead_letters(ids).await)?
        })
    }

    /// Discards dead letters by id, or every one matching `filter` when `ids` is empty.
    pub async fn discard(&self, ids: &[i64], filter: &DeadLetterFilter) -> anyhow::Result<u64> {
        Ok(if ids.is_empty() {
            with_store!(self, courier => courier.discard_dead_letters_matching(filter).await)?
        } else {
            with_store!(self, courier => courier.discard_dead_letters(ids).await)?
        })
    }
}

/// Parses one NDJSON line (the `POST /v1/messages` body) into a message.
pub fn parse_line(
    line: &str,
    number: usize,
    max_payload_bytes: usize,
) -> anyhow::Result<NewMessage> {
    let request: courier_api::PublishRequest = serde_json::from_str(line)
        .with_context(|| format!("line {number}: not a valid message object"))?;
    request.into_message(max_payload_bytes).map_err(|error| {
        anyhow::anyhow!("line {number}: invalid {}: {}", error.field, error.message)
    })
}

/// What an NDJSON publish did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PublishSummary {
    /// Messages stored.
    pub published: u64,
    /// Lines whose idempotency key was already stored.
    pub duplicates: u64,
}

/// Publishes NDJSON from `input` in transactions of [`PUBLISH_BATCH`]; blank
/// lines are skipped. A bad line stops the run with its line number; the
/// batches before it stay published (the summary says how many).
pub async fn publish_ndjson(
    store: &Store,
    input: impl BufRead,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<PublishSummary> {
    let mut summary = PublishSummary::default();
    let mut batch = Vec::with_capacity(PUBLISH_BATCH);
    for (index, line) in input.lines().enumerate() {
        let line = line.context("reading standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(&line, index + 1, courier::MAX_PAYLOAD_BYTES) {
            Ok(message) => batch.push(message),
            Err(error) => {
                flush(store, &mut batch, &mut summary, progress).await?;
                return Err(error.context(format!(
                    "stopped; {} message(s) before it were published",
                    summary.published
                )));
            }
        }
        if batch.len() == PUBLISH_BATCH {
            flush(store, &mut batch, &mut summary, progress).await?;
        }
    }
    flush(store, &mut batch, &mut summary, progress).await?;
    Ok(summary)
}

async fn flush(
    store: &Store,
    batch: &mut Vec<NewMessage>,
    summary: &mut PublishSummary,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let outcomes = store.publish(batch).await?;
    let duplicates = outcomes.iter().filter(|o| o.duplicate).count() as u64;
    summary.duplicates += duplicates;
    summary.published += outcomes.len() as u64 - duplicates;
    progress.inc(outcomes.len() as u64);
    batch.clear();
    Ok(())
}

/// How a verb reaches a running daemon instead of the database or Redis:
/// `--url`, `--token` and `--timeout-ms`, the same for every verb.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// Talk to a running daemon at this URL instead.
    #[arg(long, env = "COURIER_URL")]
    pub url: Option<String>,
    /// Bearer token for --url. Prefer COURIER_TOKEN: a --token argument
    /// shows in `ps` to every user of the machine.
    #[arg(long, env = "COURIER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long a call to the daemon given by --url may take, in
    /// milliseconds (1 to 3,600,000).
    #[arg(long, env = "COURIER_TIMEOUT_MS", default_value_t = REQUEST_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub timeout_ms: u64,
}

impl RemoteArgs {
    /// The daemon `--url` names, if it names one.
    pub fn remote(&self) -> anyhow::Result<Option<Remote>> {
        self.url
            .as_deref()
            .map(|url| {
                Remote::new(
                    url,
                    self.token.as_deref(),
                    std::time::Duration::from_millis(self.timeout_ms),
                )
            })
            .transpose()
    }
}

/// A running daemon's API, for the verbs given `--url`.
pub struct Remote {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// How long a call to the daemon may take to connect.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a whole call to the daemon may take unless `--timeout-ms` says
/// otherwise (more than the longest blocking stream read, 30 s).
pub const REQUEST_TIMEOUT_MS: u64 = 60_000;

impl Remote {
    /// The daemon at `url` (e.g. `http://127.0.0.1:7070`), with an optional
    /// bearer token; a call fails after [`CONNECT_TIMEOUT`] (or `timeout`,
    /// if shorter) without a connection and after `timeout` in all.
    pub fn new(
        url: &str,
        token: Option<&str>,
        timeout: std::time::Duration,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .timeout(timeout)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            client,
            base: url.trim_end_matches('/').to_owned(),
            token: token.map(str::to_owned),
        })
    }

    /// `GET path`; the JSON answer, or an error carrying the daemon's message.
    pub async fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.send(self.client.get(format!("{}{path}", self.base)), path)
            .await
    }

    /// `GET path` for every page of a list: follows `next_cursor` until the
    /// last page and answers the first page's document with every page's
    /// `items` and `next_cursor: null`.
    pub async fn get_all(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut document = self.get(path).await?;
        let mut items = document["items"].as_array().cloned().unwrap_or_default();
        let mut cursor = document["next_cursor"].as_str().map(str::to_owned);
        while let Some(next) = cursor {
            let page = self
                .get(&format!("{path}{separator}cursor={}", encode(&next)))
                .await?;
            items.extend(page["items"].as_array().cloned().unwrap_or_default());
            cursor = page["next_cursor"].as_str().map(str::to_owned);
        }
        document["items"] = serde_json::Value::Array(items);
        document["next_cursor"] = serde_json::Value::Null;
        Ok(document)
    }

    /// `POST path` with a JSON body.
    pub async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let text = self.post_text(path, body.to_string()).await?;
        parse_answer(&text)
    }

    /// `POST path` with `body`, JSON text sent as it is (a payload's bytes
    /// reach the daemon unchanged); the answer's text.
    pub async fn post_text(&self, path: &str, body: String) -> anyhow::Result<String> {
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        self.send_text(request, path).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let request = self
            .client
            .put(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(request, path).await
    }

    /// `DELETE path`, declared as JSON like every state change (the daemon
    /// refuses state changes without `Content-Type: application/json`).
    pub async fn delete(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let request = self
            .client
            .delete(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        self.send(request, path).await
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        path: &str,
    ) -> anyhow::Result<serde_json::Value> {
        parse_answer(&self.send_text(request, path).await?)
    }

    /// Sends `request` with the token; the answer's text, or an error
    /// carrying the daemon's message.
    async fn send_text(
        &self,
        mut request: reqwest::RequestBuilder,
        path: &str,
    ) -> anyhow::Result<String> {
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("calling {}{path}", self.base))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("the daemon answered {status}: {text}");
        }
        Ok(text)
    }
}

/// A daemon's answer as JSON (`null` for an empty one).
fn parse_answer(text: &str) -> anyhow::Result<serde_json::Value> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(text).with_context(|| format!("the daemon's answer is not JSON: {text}"))
}

/// Prints a JSON value, pretty.
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Percent-encodes a query value or a path segment.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Renders rows as an aligned text table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let rendered: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(rendered.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_is_refused_with_its_number_and_field() {
        let error = parse_line(r#"{"tenant":"a:b","topic":"t","payload":{}}"#, 7, 1024)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 7") && error.contains("tenant"),
            "{error}"
        );
        let error = parse_line("{nope", 3, 1024).unwrap_err().to_string();
        assert!(error.contains("line 3"), "{error}");
        assert!(parse_line(r#"{"tenant":"a","topic":"t","payload":{"n":1}}"#, 1, 1024).is_ok());
    }

    #[test]
    fn tables_align_columns() {
        let text = table(&["a", "bb"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(text, "a    bb\nxxx  y\n");
    }
}
