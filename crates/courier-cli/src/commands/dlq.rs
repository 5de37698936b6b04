//! `courier dlq …`: dead letters — list, group by failure, show, retry,
//! discard.

use clap::{Args, Subcommand};
use courier_api::{DeadLetterFilterBody, DeadLetterSelection};

use super::{DbArgs, Target};
use crate::ops;

/// Which dead letters a verb looks at: each given field narrows them.
#[derive(Args)]
pub struct DlqFilterArgs {
    /// Only this tenant's.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this topic's.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this subscription's.
    #[arg(long)]
    pub subscription: Option<String>,
    /// Only this message's.
    #[arg(long)]
    pub message_id: Option<uuid::Uuid>,
    /// Only those dead-lettered at or after this RFC 3339 time (2026-12-01T10:00:00Z).
    #[arg(long)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only those dead-lettered before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Only those whose last failure has this fingerprint (as `dlq groups`
    /// shows it; `unknown`: dead letters from before fingerprints).
    #[arg(long, value_parser = parse_fingerprint)]
    pub fingerprint: Option<String>,
}

/// A `--limit` from 1 to the HTTP API's page limit, so that a command means
/// the same against a database and through `--url`; refused here with the rule.
fn parse_limit(text: &str) -> Result<usize, String> {
    use courier_server::api::MAX_PAGE;
    match text.parse::<usize>() {
        Ok(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
        _ => Err(format!(
            "must be a number from 1 to {MAX_PAGE}, got {text:?}"
        )),
    }
}

/// A `--fingerprint` as `dlq groups` prints it, refused here with the rule.
fn parse_fingerprint(text: &str) -> Result<String, String> {
    courier::validate_fingerprint("fingerprint", text)
        .map(|()| text.to_owned())
        .map_err(|e| e.reason)
}

impl DlqFilterArgs {
    /// The filter as the store takes it.
    fn filter(&self) -> courier::DeadLetterFilter {
        self.body().into()
    }

    /// The filter as the API's query parameters (given ones only).
    fn fields(&self) -> Vec<(&'static str, String)> {
        let time = |at: &chrono::DateTime<chrono::Utc>| {
            at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        };
        [
            ("tenant", self.tenant.clone()),
            ("topic", self.topic.clone()),
            ("subscription", self.subscription.clone()),
            ("message_id", self.message_id.map(|id| id.to_string())),
            ("dead_after", self.since.as_ref().map(time)),
            ("dead_before", self.until.as_ref().map(time)),
            ("fingerprint", self.fingerprint.clone()),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| (key, value)))
        .collect()
    }

    /// The filter as the API's request body fields.
    fn body(&self) -> DeadLetterFilterBody {
        DeadLetterFilterBody {
            tenant: self.tenant.clone(),
            topic: self.topic.clone(),
            subscription: self.subscription.clone(),
            message_id: self.message_id,
            dead_after: self.since,
            dead_before: self.until,
            fingerprint: self.fingerprint.clone(),
        }
    }
}

/// The dead letters a retry or discard acts on: ids, a filter, or `--all`.
#[derive(Args)]
pub struct SelectionArgs {
    /// Only those the filter matches (without ids).
    #[command(flatten)]
    pub filter: DlqFilterArgs,
    /// Every dead letter (the token may see): needed without ids and filter.
    #[arg(long, conflicts_with_all = ["ids", "tenant", "topic", "subscription", "message_id", "since", "until", "fingerprint"])]
    pub all: bool,
    /// Delivery ids; without ids, every dead letter matching the filter.
    pub ids: Vec<i64>,
}

impl SelectionArgs {
    /// Refuses a selection of every dead letter that does not say `--all`.
    fn check(&self, verb: &str) -> anyhow::Result<()> {
        if self.ids.is_empty() && self.filter.filter().is_empty() && !self.all {
            anyhow::bail!(
                "invalid arguments: without ids or a filter (--tenant, --topic, --subscription, \
                 --message-id, --since, --until, --fingerprint) this would {verb} \
                 every dead letter; pass --all to mean that"
            );
        }
        Ok(())
    }

    /// The body of `POST /v1/dead-letters/{retry,discard}`: the ids, or else
    /// every dead letter (`--all`), or else the filter.
    fn body(&self) -> anyhow::Result<serde_json::Value> {
        let (ids, filter, all) = if !self.ids.is_empty() {
            (Some(self.ids.clone()), None, None)
        } else if self.all {
            (None, Some(DeadLetterFilterBody::default()), Some(true))
        } else {
            (None, Some(self.filter.body()), None)
        };
        Ok(serde_json::to_value(DeadLetterSelection {
            ids,
            filter,
            all,
            dry_run: None,
        })?)
    }
}

/// `courier dlq …`.
#[derive(Subcommand)]
pub enum DlqCommand {
    /// List dead letters, oldest first.
    List {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// Which dead letters.
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Page size, 1 to 500 (as the HTTP API takes it).
        #[arg(long, default_value_t = 50, value_parser = parse_limit)]
        limit: usize,
        /// Where the page starts: the cursor the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Group dead letters by what broke (the fingerprint of their last
    /// failure), largest group first, with a sample error, the count, first
    /// and last seen, and the subscriptions and topics affected.
    Groups {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// Which dead letters.
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// The most groups to show, 1 to 500 (as the HTTP API takes it).
        #[arg(long, default_value_t = 50, value_parser = parse_limit)]
        limit: usize,
    },
    /// Show one dead letter with its payload and error history.
    Show {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The delivery id (from `dlq list`).
        id: i64,
    },
    /// Make dead letters deliverable again (attempts reset), by id or by filter.
    Retry {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// Which dead letters.
        #[command(flatten)]
        selection: SelectionArgs,
    },
    /// Discard dead letters for good, by id or by filter.
    Discard {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// Which dead letters.
        #[command(flatten)]
        selection: SelectionArgs,
    },
}

/// Runs one `courier dlq` verb.
pub async fn run(command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::List {
            db,
            filter,
            limit,
            cursor,
        } => list(&Target::open(&db)?, &filter, limit, cursor).await,
        DlqCommand::Groups { db, filter, limit } => {
            groups(&Target::open(&db)?, &filter, limit).await
        }
        DlqCommand::Show { db, id } => show(&Target::open(&db)?, id).await,
        DlqCommand::Retry { db, selection } => {
            settle(&Target::open(&db)?, Settle::Retry, &selection).await
        }
        DlqCommand::Discard { db, selection } => {
            settle(&Target::open(&db)?, Settle::Discard, &selection).await
        }
    }
}

/// Prints one page of dead letters, oldest first, from `cursor` on: the
/// API's page, or locally a table and the next page's `--cursor`. A cursor
/// that does not decode is refused before the database is opened.
pub async fn list(
    target: &Target,
    filter: &DlqFilterArgs,
    limit: usize,
    cursor: Option<String>,
) -> anyhow::Result<()> {
    let local = match target {
        Target::Remote(remote) => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(filter.fields());
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor));
            }
            let query: Vec<String> = query
                .iter()
                .map(|(k, v)| format!("{k}={}", ops::encode(v)))
                .collect();
            let path = format!("/v1/dead-letters?{}", query.join("&"));
            return ops::print_json(&remote.get(&path).await?);
        }
        Target::Local(local) => local,
    };
    let after = cursor
        .as_deref()
        .map(courier_server::cursor::decode::<courier::DeadLetterKey>)
        .transpose()
        .map_err(|e| anyhow::anyhow!("invalid arguments: --cursor: {}", e.message))?;
    let page = local
        .open()
        .await?
        .dead_letters(&filter.filter(), after, limit)
        .await?;
    let rows: Vec<Vec<String>> = page
        .items
        .iter()
        .map(|d| {
            vec![
                d.delivery_id.to_string(),
                d.subscription.clone(),
                d.tenant.clone(),
                d.topic.clone(),
                d.attempts.to_string(),
                d.errors
                    .last()
                    .map(|e| courier::truncate_chars(&e.message, 60).to_owned())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    print!(
        "{}",
        ops::table(
            &[
                "ID",
                "SUBSCRIPTION",
                "TENANT",
                "TOPIC",
                "ATTEMPTS",
                "LAST ERROR"
            ],
            &rows
        )
    );
    if let Some(key) = page.next_cursor {
        println!("more: --cursor {}", courier_server::cursor::encode(&key));
    }
    Ok(())
}

/// Prints the dead letters `filter` matches grouped by the fingerprint of
/// their last failure, largest first: the API's document, or locally a
/// table and how to retry a group.
pub async fn groups(target: &Target, filter: &DlqFilterArgs, limit: usize) -> anyhow::Result<()> {
    let store = match target {
        Target::Remote(remote) => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(filter.fields());
            let query: Vec<String> = query
                .iter()
                .map(|(k, v)| format!("{k}={}", ops::encode(v)))
                .collect();
            let path = format!("/v1/dead-letters/groups?{}", query.join("&"));
            return ops::print_json(&remote.get(&path).await?);
        }
        Target::Local(local) => local.open().await?,
    };
    let groups = store.dead_letter_groups(&filter.filter(), limit).await?;
    let time = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    };
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                g.fingerprint.clone(),
                g.count.to_string(),
                time(g.first_seen),
                time(g.last_seen),
                g.subscriptions.join(","),
                g.topics.join(","),
                courier::truncate_chars(&g.sample_error, 60).to_owned(),
            ]
        })
        .collect();
    print!(
        "{}",
        ops::table(
            &[
                "FINGERPRINT",
                "COUNT",
                "FIRST SEEN",
                "LAST SEEN",
                "SUBSCRIPTIONS",
                "TOPICS",
                "SAMPLE ERROR"
            ],
            &rows
        )
    );
    if let Some(first) = groups.first() {
        println!(
            "retry one: courier dlq retry --fingerprint {}",
            first.fingerprint
        );
    }
    Ok(())
}

/// Prints dead letter `id` with its payload and error history: the API's
/// document, or locally one field per line; an error if there is none.
pub async fn show(target: &Target, id: i64) -> anyhow::Result<()> {
    let store = match target {
        Target::Remote(remote) => {
            return ops::print_json(&remote.get(&format!("/v1/dead-letters/{id}")).await?)
        }
        Target::Local(local) => local.open().await?,
    };
    let Some(letter) = store.dead_letter(id).await? else {
        anyhow::bail!("no dead letter with id {id}");
    };
    println!("delivery      {}", letter.delivery_id);
    println!("message       {}", letter.message_id);
    println!("subscription  {}", letter.subscription);
    println!("tenant        {}", letter.tenant);
    println!("topic         {} v{}", letter.topic, letter.schema_version);
    println!("attempts      {}", letter.attempts);
    println!("payload       {}", letter.payload);
    println!("errors:");
    for error in &letter.errors {
        println!(
            "  #{} {}  {}",
            error.attempt,
            error.at.to_rfc3339(),
            error.message
        );
    }
    Ok(())
}

/// What [`settle`] does to the dead letters it selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Make them deliverable again, attempts reset.
    Retry,
    /// Delete them for good.
    Discard,
}

impl Settle {
    /// The verb, as the command line and the API's path name it.
    fn verb(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Discard => "discard",
        }
    }
}

/// Retries or discards the dead letters `selection` names (refused for
/// every dead letter without `--all`) and prints the API's answer, or
/// locally how many there were.
pub async fn settle(
    target: &Target,
    settle: Settle,
    selection: &SelectionArgs,
) -> anyhow::Result<()> {
    selection.check(settle.verb())?;
    let store = match target {
        Target::Remote(remote) => {
            let path = format!("/v1/dead-letters/{}", settle.verb());
            return ops::print_json(&remote.post(&path, selection.body()?).await?);
        }
        Target::Local(local) => local.open().await?,
    };
    let (ids, filter) = (&selection.ids, &selection.filter.filter());
    match settle {
        Settle::Retry => {
            let affected = store.retry(ids, filter).await?;
            println!("retried {affected} dead letter(s)");
        }
        Settle::Discard => {
            let affected = store.discard(ids, filter).await?;
            println!("discarded {affected} dead letter(s)");
        }
    }
    Ok(())
}
