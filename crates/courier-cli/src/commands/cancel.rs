//! `courier cancel`: cancel a message no subscription has started on.

use courier::CancelOutcome;

use super::{post_empty, Target};
use crate::ops;

/// Cancels message `id` and prints the outcome as JSON: the daemon's answer,
/// or locally the same shape (`id`, `cancelled`, `deliveries`). A message
/// that is unknown, or that a subscription has started on, is an error.
pub async fn cancel(target: &Target, id: uuid::Uuid) -> anyhow::Result<()> {
    let store = match target {
        Target::Remote(remote) => {
            return post_empty(remote, &format!("/v1/messages/{id}/cancel")).await
        }
        Target::Local(local) => local.open().await?,
    };
    match store.cancel(id).await? {
        CancelOutcome::Cancelled { deliveries } => ops::print_json(
            &serde_json::json!({"id": id, "cancelled": true, "deliveries": deliveries}),
        ),
        CancelOutcome::NotFound => anyhow::bail!("no message {id}"),
        CancelOutcome::Started {
            subscription,
            state,
        } => anyhow::bail!(
            "message {id} cannot be cancelled: subscription {subscription} has started on it ({state})"
        ),
    }
}
