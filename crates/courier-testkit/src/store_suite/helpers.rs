//! What the cases share: subscriptions, messages, claim parameters and
//! transactional work.

use std::time::Duration;

use courier::{
    ClaimParams, ClaimedDelivery, Failure, HandlerError, NewMessage, OutboxStore, RescueParams,
    Route, SubscriptionSpec, TxWork,
};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use uuid::Uuid;

use super::{StoreFixture, SuiteConnection};

pub(super) async fn subscribe<S: OutboxStore>(
    store: &S,
    name: &str,
    topics: &[&str],
) -> anyhow::Result<()> {
    store
        .register_subscription(&SubscriptionSpec {
            name: name.to_owned(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            replay: None,
        })
        .await?;
    Ok(())
}

pub(super) fn message(tenant: &str, topic: &str) -> anyhow::Result<NewMessage> {
    Ok(NewMessage::new(
        tenant,
        topic,
        &serde_json::json!({"n": 1}),
    )?)
}

/// A payload as the JSON value it denotes: the suite compares values, and
/// `the_payload_comes_back_as_the_producer_wrote_it` the text.
pub(super) fn json(text: &str) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(text)?)
}

pub(super) fn route(topic: &str, schema_version: i32, max_attempts: i32) -> Route {
    Route {
        topic: topic.to_owned(),
        schema_version,
        max_attempts,
    }
}

pub(super) fn params(subscription: &str, routes: Vec<Route>, limit: usize) -> ClaimParams {
    ClaimParams {
        subscription: subscription.to_owned(),
        routes,
        limit,
        lease: Duration::from_secs(30),
        worker_id: "w1".to_owned(),
        tenant_cursor: String::new(),
        tenant_in_flight_limit: None,
    }
}

pub(super) fn failure(
    delivery: &ClaimedDelivery,
    error: &str,
    retry_in: Option<Duration>,
) -> Failure {
    Failure {
        lease: delivery.lease(),
        error: error.to_owned(),
        kind: courier::ErrorKind::Retry,
        retry_in,
    }
}

pub(super) fn ids(deliveries: &[ClaimedDelivery]) -> Vec<i64> {
    deliveries.iter().map(|d| d.delivery_id).collect()
}

pub(super) fn message_ids(deliveries: &[ClaimedDelivery]) -> Vec<Uuid> {
    deliveries.iter().map(|d| d.message_id).collect()
}

pub(super) async fn claim<S: OutboxStore>(
    store: &S,
    params: &ClaimParams,
) -> anyhow::Result<Vec<ClaimedDelivery>> {
    Ok(store.claim(params).await?.deliveries)
}

pub(super) fn at_once() -> RescueParams {
    RescueParams::at_once(100)
}

pub(super) fn tx_work<C, F>(work: F) -> TxWork<C>
where
    F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, Result<(), HandlerError>> + Send + 'static,
{
    Box::new(work)
}

/// Work that records its delivery in the `effects` table
/// ([`Backend::create_effects_table`]'s shape): a second commit would show `calls = 2`.
pub(super) fn record_effect<C: SuiteConnection>(delivery: &ClaimedDelivery) -> TxWork<C> {
    let (subscription, message_id) = (delivery.subscription.clone(), delivery.message_id);
    tx_work(move |conn: &mut C| {
        async move {
            conn.record_effect(&subscription, message_id.to_string())
                .await?;
            Ok(())
        }
        .boxed()
    })
}

pub(super) async fn create_effects_table<F: StoreFixture>(fixture: &F) -> anyhow::Result<()> {
    fixture
        .execute(
            "CREATE TABLE effects (
               subscription text NOT NULL,
               message_id text NOT NULL,
               calls integer NOT NULL,
               PRIMARY KEY (subscription, message_id))",
        )
        .await?;
    Ok(())
}

/// Quotes `text` as an SQL string literal (both dialects).
pub(super) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
