//! The native stream relay: appends each message to a stream of its tenant
//! in the outbox database, inside the delivery's transaction (see the
//! `relay` module).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use courier::postgres::PgStore;
use courier::sqlite::SqliteStore;
use courier::{
    HandlerError, Message, NewStreamEntry, OutboxStore, StoreError, StreamEntryId, StreamKey,
    TransactionalHandler,
};
use uuid::Uuid;

use super::template::{stream_template, Template};
use super::{entry_for, RelayCommon, RelayError, Relayed};
use crate::config::{SubscriptionConfig, TargetConfig};

/// An outbox store that is also a native stream store, whose appends and
/// lookups can run in a delivery's transaction.
pub trait NativeStreamStore: OutboxStore {
    /// The lowest entry of `key` relaying outbox message `message_id`, as
    /// seen by the transaction on `conn`.
    fn find_relayed_entry<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        key: &'c StreamKey,
        message_id: Uuid,
    ) -> impl Future<Output = Result<Option<StreamEntryId>, StoreError>> + Send + 'c;

    /// Appends `entries` to `key` in the transaction on `conn`.
    fn append_entries<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> impl Future<Output = Result<Vec<StreamEntryId>, StoreError>> + Send + 'c;
}

impl NativeStreamStore for PgStore {
    fn find_relayed_entry<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        key: &'c StreamKey,
        message_id: Uuid,
    ) -> impl Future<Output = Result<Option<StreamEntryId>, StoreError>> + Send + 'c {
        self.relayed_entry_on(conn, key, message_id)
    }

    fn append_entries<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> impl Future<Output = Result<Vec<StreamEntryId>, StoreError>> + Send + 'c {
        self.append_on(conn, key, entries)
    }
}

impl NativeStreamStore for SqliteStore {
    fn find_relayed_entry<'c>(
        &'c self,
        conn: &'c mut sqlx::SqliteConnection,
        key: &'c StreamKey,
        message_id: Uuid,
    ) -> impl Future<Output = Result<Option<StreamEntryId>, StoreError>> + Send + 'c {
        self.relayed_entry_on(conn, key, message_id)
    }

    fn append_entries<'c>(
        &'c self,
        conn: &'c mut sqlx::SqliteConnection,
        key: &'c StreamKey,
        entries: &'c [NewStreamEntry],
    ) -> impl Future<Output = Result<Vec<StreamEntryId>, StoreError>> + Send + 'c {
        self.append_on(conn, key, entries)
    }
}

/// Appends a subscription's messages to native streams of the outbox
/// database, in each delivery's transaction.
pub struct NativeRelay<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for NativeRelay<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<S> {
    common: RelayCommon,
    store: S,
    template: Template,
}

impl<S> std::fmt::Debug for NativeRelay<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeRelay")
            .field("subscription", &self.inner.common.subscription)
            .field("stream", &self.inner.template.source())
            .finish_non_exhaustive()
    }
}

impl<S: NativeStreamStore> NativeRelay<S> {
    /// The relay of `subscription` (a `stream` target) into `store`.
    pub fn new(subscription: &SubscriptionConfig, store: S) -> Result<Self, RelayError> {
        let invalid = |reason: String| RelayError::Invalid {
            subscription: subscription.name.clone(),
            reason,
        };
        let TargetConfig::Stream(target) = &subscription.target else {
            return Err(invalid(format!(
                "the target is a {}, not a stream",
                subscription.target.kind()
            )));
        };
        Ok(Self {
            inner: Arc::new(Inner {
                common: RelayCommon::of(subscription),
                store,
                template: stream_template(&target.stream).map_err(invalid)?,
            }),
        })
    }

    /// Appends `message` in the transaction on `conn` unless the stream
    /// already holds an entry of it.
    pub async fn publish(
        &self,
        message: &Message<crate::RawPayload>,
        conn: &mut S::Connection,
    ) -> Result<Relayed, HandlerError> {
        let inner = &self.inner;
        if !inner.common.relays(&message.tenant) {
            return Ok(Relayed::Skipped);
        }
        let name = inner
            .template
            .stream_name(&message.tenant, &message.topic)
            .map_err(HandlerError::permanent)?;
        let key = StreamKey::new(message.tenant.clone(), name).map_err(HandlerError::permanent)?;
        let found = inner
            .store
            .find_relayed_entry(conn, &key, message.id)
            .await
            .map_err(|e| classify(&key, e))?;
        if let Some(id) = found {
            return Ok(Relayed::Duplicate(id.to_string()));
        }
        let ids = inner
            .store
            .append_entries(conn, &key, &[entry_for(message)?])
            .await
            .map_err(|e| classify(&key, e))?;
        let id = ids.first().map(ToString::to_string).unwrap_or_default();
        Ok(Relayed::Stored(id))
    }
}

/// Refused input (an oversized payload) is permanent; any database error
/// rolls the delivery's transaction back and is retried.
fn classify(key: &StreamKey, error: StoreError) -> HandlerError {
    match error {
        StoreError::Invalid(invalid) => HandlerError::permanent(format!(
            "the message cannot be an entry of stream {key}: {invalid}"
        )),
        other => HandlerError::retry(format!("appending to stream {key} failed: {other}")),
    }
}

impl<S: NativeStreamStore> TransactionalHandler<S::Connection> for NativeRelay<S> {
    type Payload = crate::RawPayload;

    async fn handle(
        &self,
        message: &Message<crate::RawPayload>,
        conn: &mut S::Connection,
    ) -> Result<(), HandlerError> {
        let started = Instant::now();
        let outcome = self.publish(message, conn).await;
        self.inner.common.record(&outcome, started);
        outcome.map(|_| ())
    }
}
