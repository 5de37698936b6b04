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

use super::template::{stream_template, Template};
use super::{entry_for, RelayCommon, RelayError, Relayed};
use crate::config::{SubscriptionConfig, TargetConfig};

/// An outbox store that is also a native stream store, whose appends can
/// run in a delivery's transaction.
pub trait NativeStreamStore: OutboxStore {
    /// Appends `entry`, which relays an outbox message (its origin), to `key`
    /// in the transaction on `conn`, unless `key` already holds an entry of
    /// that message as that transaction sees it. Returns the new entry's id
    /// and `false`, or the lowest existing entry's id and `true`. An entry
    /// without an origin is refused as invalid, and nothing is stored.
    fn append_unless_relayed<'c>(
        &'c self,
        conn: &'c mut Self::Connection,
        key: &'c StreamKey,
        entry: &'c NewStreamEntry,
    ) -> impl Future<Output = Result<(StreamEntryId, bool), StoreError>> + Send + 'c;
}

impl NativeStreamStore for PgStore {
    fn append_unless_relayed<'c>(
        &'c self,
        conn: &'c mut sqlx::PgConnection,
        key: &'c StreamKey,
        entry: &'c NewStreamEntry,
    ) -> impl Future<Output = Result<(StreamEntryId, bool), StoreError>> + Send + 'c {
        // One statement: the look and the append in one round trip.
        self.relay_append_on(conn, key, entry)
    }
}

impl NativeStreamStore for SqliteStore {
    async fn append_unless_relayed<'c>(
        &'c self,
        conn: &'c mut sqlx::SqliteConnection,
        key: &'c StreamKey,
        entry: &'c NewStreamEntry,
    ) -> Result<(StreamEntryId, bool), StoreError> {
        // In-process calls: two statements cost no round trip.
        let Some(origin) = entry.origin.as_ref() else {
            return Err(StoreError::Invalid(courier::ValidationError::new(
                "origin",
                "a relayed entry names the message it relays",
            )));
        };
        if let Some(id) = self.relayed_entry_on(conn, key, origin.message_id).await? {
            return Ok((id, true));
        }
        let ids = self
            .append_on(conn, key, std::slice::from_ref(entry))
            .await?;
        let id = ids.first().copied().ok_or_else(|| {
            StoreError::Corrupt(format!("an append to stream {key} returned no id"))
        })?;
        Ok((id, false))
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
        // The entry is built (and on PostgreSQL checked) before the look for
        // an earlier one: a message the stream would refuse is a permanent
        // failure even when it is a replay.
        let (id, duplicate) = inner
            .store
            .append_unless_relayed(conn, &key, &entry_for(message)?)
            .await
            .map_err(|e| classify(&key, e))?;
        Ok(if duplicate {
            Relayed::Duplicate(id.to_string())
        } else {
            Relayed::Stored(id.to_string())
        })
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
