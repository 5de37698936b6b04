//! `courier subscriptions …`: list, show, ping, pause, resume, create (with
//! replay), remove topics.

use clap::Subcommand;

use super::{post_empty, DbArgs, LocalStore, Target};
use crate::ops;

/// `courier subscriptions …`.
#[derive(Subcommand)]
pub enum SubscriptionsCommand {
    /// List subscriptions with their topics and whether they are paused.
    List {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
    },
    /// Show one subscription: topics, state, backlog and recent outcomes
    /// (through the daemon's API: needs --url).
    Show {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Send a signed test request to a webhook subscription's endpoint and
    /// show its answer; nothing is stored (through the daemon's API: needs --url).
    Ping {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Stop claiming for a subscription; its messages wait.
    Pause {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Resume a paused subscription.
    Resume {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
    },
    /// Create a subscription (or add topics to one). Messages committed after
    /// this are owed to it; `--replay` also owes it retained older ones.
    Create {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
        /// Topic patterns: exact names, `prefix.*`, or `*` (repeatable).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// When this creates the subscription, also deliver retained messages:
        /// `all`, an RFC 3339 time (messages enqueued then or later), or a
        /// message id (that message and every later one).
        #[arg(long, value_parser = parse_replay)]
        replay: Option<courier::Replay>,
    },
    /// Stop a subscription receiving topic patterns (exactly as listed);
    /// deliveries it is already owed stay.
    RemoveTopics {
        /// Where the verb goes.
        #[command(flatten)]
        db: DbArgs,
        /// The subscription.
        name: String,
        /// The patterns to remove.
        #[arg(required = true)]
        topics: Vec<String>,
    },
}

/// `all`, an RFC 3339 instant, or a message id.
fn parse_replay(text: &str) -> Result<courier::Replay, String> {
    text.parse().map_err(|e: courier::ValidationError| e.reason)
}

/// Runs one `courier subscriptions` verb.
pub async fn run(command: SubscriptionsCommand) -> anyhow::Result<()> {
    match command {
        SubscriptionsCommand::List { db } => list(&Target::open(&db)?).await,
        SubscriptionsCommand::Show { db, name } => show(&Target::open(&db)?, &name).await,
        SubscriptionsCommand::Ping { db, name } => ping(&Target::open(&db)?, &name).await,
        SubscriptionsCommand::Pause { db, name } => {
            set_paused(&Target::open(&db)?, &name, true).await
        }
        SubscriptionsCommand::Resume { db, name } => {
            set_paused(&Target::open(&db)?, &name, false).await
        }
        SubscriptionsCommand::Create {
            db,
            name,
            topics,
            replay,
        } => create(&Target::open(&db)?, name, topics, replay).await,
        SubscriptionsCommand::RemoveTopics { db, name, topics } => {
            remove_topics(&Target::open(&db)?, &name, &topics).await
        }
    }
}

/// The path of subscription `name` under `/v1/subscriptions`, with `rest` after it.
fn path(name: &str, rest: &str) -> String {
    format!("/v1/subscriptions/{}{rest}", ops::encode(name))
}

/// Prints every subscription: the API's list (every page), or locally a
/// table of names, topics and states.
pub async fn list(target: &Target) -> anyhow::Result<()> {
    let store = match target {
        Target::Remote(remote) => {
            return ops::print_json(&remote.get_all("/v1/subscriptions?limit=500").await?)
        }
        Target::Local(local) => local.open().await?,
    };
    let rows: Vec<Vec<String>> = store
        .subscriptions()
        .await?
        .into_iter()
        .map(|s| {
            vec![
                s.name,
                s.topics.join(","),
                if s.paused { "paused" } else { "active" }.to_owned(),
            ]
        })
        .collect();
    print!("{}", ops::table(&["NAME", "TOPICS", "STATE"], &rows));
    Ok(())
}

/// Prints the daemon's document of subscription `name`; only the API has
/// it, so without `--url` this is an error.
pub async fn show(target: &Target, name: &str) -> anyhow::Result<()> {
    ops::print_json(&target.remote()?.get(&path(name, "")).await?)
}

/// Has the daemon send a signed test request to webhook subscription
/// `name`'s endpoint and prints its answer; without `--url` an error.
pub async fn ping(target: &Target, name: &str) -> anyhow::Result<()> {
    post_empty(target.remote()?, &path(name, "/ping")).await
}

/// Pauses (`paused`) or resumes subscription `name`, an error if there is
/// none; prints the API's answer, or locally `paused NAME` / `resumed NAME`.
pub async fn set_paused(target: &Target, name: &str, paused: bool) -> anyhow::Result<()> {
    let (verb, done) = if paused {
        ("pause", "paused")
    } else {
        ("resume", "resumed")
    };
    match target {
        Target::Remote(remote) => post_empty(remote, &path(name, &format!("/{verb}"))).await,
        Target::Local(local) => {
            local.open().await?.set_paused(name, paused).await?;
            println!("{done} {name}");
            Ok(())
        }
    }
}

/// The database `target` names; topics change only there (the API cannot).
fn topics_store(target: &Target) -> anyhow::Result<&LocalStore> {
    match target {
        Target::Local(local) => Ok(local),
        Target::Remote(_) => anyhow::bail!(
            "changing a subscription's topics is not in the HTTP API; \
             run it without --url, against the daemon's database (--database-url)"
        ),
    }
}

/// Creates subscription `name` for `topics` (replaying retained messages
/// as `replay` says), or adds `topics` to it if it exists; prints what was
/// done. Refused with `--url`.
pub async fn create(
    target: &Target,
    name: String,
    topics: Vec<String>,
    replay: Option<courier::Replay>,
) -> anyhow::Result<()> {
    let store = topics_store(target)?.open().await?;
    let spec = courier::SubscriptionSpec {
        name: name.clone(),
        topics,
        replay,
    };
    let done = store.register(&spec).await?;
    match (done.created, replay.is_some()) {
        (true, true) => println!("created {name}, replaying {} retained messages", done.replayed),
        (true, false) => println!("created {name}"),
        (false, true) => println!(
            "{name} exists: added {} topics, replayed nothing (a replay applies only when the subscription is created)",
            done.topics_added
        ),
        (false, false) => println!("{name} exists: added {} topics", done.topics_added),
    }
    Ok(())
}

/// Removes `topics` (exactly as listed) from subscription `name`, an error
/// if there is none; prints how many it had. Refused with `--url`.
pub async fn remove_topics(target: &Target, name: &str, topics: &[String]) -> anyhow::Result<()> {
    let removed = topics_store(target)?
        .open()
        .await?
        .remove_topics(name, topics)
        .await?;
    println!("removed {removed} of {} topics from {name}", topics.len());
    Ok(())
}
