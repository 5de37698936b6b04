//! `courier publish`: one message from the flags, or NDJSON from standard
//! input (one `POST /v1/messages` body per line).

use std::io::BufRead;

use courier_api::PublishRequest;

use super::{DbArgs, Target};
use crate::ops::{self, Remote};

/// `courier publish`'s arguments.
#[derive(clap::Args)]
pub struct PublishArgs {
    /// Where the messages go.
    #[command(flatten)]
    pub db: DbArgs,
    /// The tenant (without --tenant and --topic, NDJSON is read from stdin).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// The payload as JSON.
    #[arg(long, default_value = "{}")]
    pub payload: String,
    /// The payload's schema version.
    #[arg(long)]
    pub schema_version: Option<i32>,
    /// Ordering key.
    #[arg(long)]
    pub ordering_key: Option<String>,
    /// Idempotency key.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Priority, 0 (the default) to 9: higher is delivered first within
    /// its tenant's share of each claim.
    #[arg(long)]
    pub priority: Option<i16>,
}

impl PublishArgs {
    /// The one message `--tenant` and `--topic` give, as a `POST
    /// /v1/messages` body (the payload kept as written, byte for byte, as the
    /// API keeps it); `None` without both, when NDJSON is to be read.
    fn single(&self) -> anyhow::Result<Option<String>> {
        let (tenant, topic) = match (&self.tenant, &self.topic) {
            (Some(tenant), Some(topic)) => (tenant, topic),
            (None, None) => return Ok(None),
            _ => anyhow::bail!(
                "invalid arguments: --tenant and --topic go together (or neither, to read NDJSON)"
            ),
        };
        let payload = serde_json::value::RawValue::from_string(self.payload.clone())
            .map_err(|e| anyhow::anyhow!("invalid payload: not JSON: {e}"))?;
        let body = PublishRequest {
            tenant: tenant.clone(),
            topic: topic.clone(),
            schema_version: self.schema_version,
            payload,
            headers: None,
            ordering_key: self.ordering_key.clone(),
            idempotency_key: self.idempotency_key.clone(),
            available_at: None,
            priority: self.priority,
        };
        Ok(Some(serde_json::to_string(&body)?))
    }
}

/// Publishes the message `args` give, or else the NDJSON on standard input,
/// to `target` (whose `--database-url` or `--url` came from `args.db`).
/// Through the daemon each answer is printed as it comes; locally one line
/// per message (its id, `(duplicate)` if its idempotency key was stored
/// already), or for NDJSON a summary line.
pub async fn publish(target: &Target, args: &PublishArgs) -> anyhow::Result<()> {
    let single = args.single()?;
    let store = match target {
        Target::Remote(remote) => return publish_http(remote, single).await,
        Target::Local(local) => local.open().await?,
    };
    match single {
        Some(line) => {
            let message = ops::parse_line(&line, 1, courier::MAX_PAYLOAD_BYTES)
                .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_start_matches("line 1: ")))?;
            let outcome = store.publish(std::slice::from_ref(&message)).await?;
            for o in outcome {
                println!("{}{}", o.id, if o.duplicate { " (duplicate)" } else { "" });
            }
        }
        None => {
            let progress = indicatif::ProgressBar::new_spinner();
            progress.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {pos} published ({per_sec})")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            let stdin = std::io::stdin();
            let summary = ops::publish_ndjson(&store, stdin.lock(), &progress).await;
            progress.finish_and_clear();
            let summary = summary?;
            println!(
                "published {} message(s), {} duplicate(s) skipped",
                summary.published, summary.duplicates
            );
        }
    }
    Ok(())
}

/// Posts the one message, or else standard input's lines in batches of
/// [`ops::PUBLISH_BATCH`], printing each answer's text.
async fn publish_http(remote: &Remote, single: Option<String>) -> anyhow::Result<()> {
    let bodies: Vec<(String, String)> = match single {
        Some(body) => vec![("/v1/messages".to_owned(), body)],
        None => {
            let mut batches = Vec::new();
            let mut lines = Vec::new();
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if !line.trim().is_empty() {
                    lines.push(line);
                }
                if lines.len() == ops::PUBLISH_BATCH {
                    batches.push(std::mem::take(&mut lines));
                }
            }
            if !lines.is_empty() {
                batches.push(lines);
            }
            batches
                .into_iter()
                .map(|lines| {
                    (
                        "/v1/messages/batch".to_owned(),
                        format!("{{\"messages\":[{}]}}", lines.join(",")),
                    )
                })
                .collect()
        }
    };
    for (path, body) in bodies {
        println!("{}", remote.post_text(&path, body).await?);
    }
    Ok(())
}
