//! `courier status`: open deliveries per subscription and topic.

use super::Target;
use crate::ops;

/// Prints open deliveries per subscription and topic: through the daemon,
/// `GET /v1/stats` with every page's rows; locally a table (a line saying
/// so when nothing waits), or with `json` the API's shape, every row on one
/// page.
pub async fn status(target: &Target, json: bool) -> anyhow::Result<()> {
    let store = match target {
        Target::Remote(remote) => {
            return ops::print_json(&remote.get_all("/v1/stats?limit=500").await?)
        }
        Target::Local(local) => local.open().await?,
    };
    let (totals, stats) = store.status().await?;
    if json {
        // The shape of `GET /v1/stats`, every row on one page.
        let mut document = serde_json::to_value(&totals)?;
        document["items"] = serde_json::to_value(&stats)?;
        document["next_cursor"] = serde_json::Value::Null;
        return ops::print_json(&document);
    }
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            vec![
                s.subscription.clone(),
                s.topic.clone(),
                s.available.to_string(),
                s.running.to_string(),
                s.dead.to_string(),
                s.oldest_pending_age_seconds
                    .map_or_else(|| "-".to_owned(), |age| format!("{age:.1}s")),
            ]
        })
        .collect();
    print!(
        "{}",
        ops::table(
            &[
                "SUBSCRIPTION",
                "TOPIC",
                "WAITING",
                "RUNNING",
                "DEAD",
                "OLDEST"
            ],
            &rows
        )
    );
    if rows.is_empty() {
        println!("(nothing waiting: every delivery is done)");
    }
    Ok(())
}
