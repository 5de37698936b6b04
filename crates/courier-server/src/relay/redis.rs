//! The Redis stream relay: one script per message appends it at most once
//! (see the `relay` module and `scripts/relay_append.lua`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::redis::redis::{RedisError, Script};
use courier::redis::{entry_fields, map_error, RedisStreamStore};
use courier::{Handler, HandlerError, Message, StreamKey};

use super::template::{stream_template, Template};
use super::{entry_for, RedeliveryHorizon, RelayCommon, RelayError, Relayed};
use crate::config::{SubscriptionConfig, TargetConfig};

/// What joins a stream's Redis key and a message id into that message's
/// dedupe key (`{stream key}:dedupe:{message id}`).
pub const DEDUPE_KEY_INFIX: &str = ":dedupe:";

/// Appends a subscription's messages to Redis streams, once each.
#[derive(Clone)]
pub struct RedisRelay {
    inner: Arc<Inner>,
}

struct Inner {
    common: RelayCommon,
    store: RedisStreamStore,
    template: Template,
    maxlen: Option<u64>,
    dedupe_ttl: Duration,
    script: Script,
}

impl std::fmt::Debug for RedisRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRelay")
            .field("subscription", &self.inner.common.subscription)
            .field("stream", &self.inner.template.source())
            .field("maxlen", &self.inner.maxlen)
            .field("dedupe_ttl", &self.inner.dedupe_ttl)
            .finish_non_exhaustive()
    }
}

impl RedisRelay {
    /// The relay of `subscription` (a `redis_stream` target) over `store`,
    /// whose key prefix is `[redis] key_prefix`.
    pub fn new(
        subscription: &SubscriptionConfig,
        store: RedisStreamStore,
    ) -> Result<Self, RelayError> {
        let invalid = |reason: String| RelayError::Invalid {
            subscription: subscription.name.clone(),
            reason,
        };
        let TargetConfig::RedisStream(target) = &subscription.target else {
            return Err(invalid(format!(
                "the target is a {}, not a redis_stream",
                subscription.target.kind()
            )));
        };
        let template = stream_template(&target.stream).map_err(invalid)?;
        let horizon = RedeliveryHorizon::of(subscription).total();
        let dedupe_ttl = match target.dedupe_ttl_ms {
            Some(ms) if Duration::from_millis(ms) < horizon => {
                return Err(invalid(format!(
                    "dedupe_ttl_ms {ms} is below the redelivery horizon of {} ms",
                    horizon.as_millis()
                )))
            }
            Some(ms) => Duration::from_millis(ms),
            None => horizon * 2,
        };
        if target.maxlen == Some(0) {
            return Err(invalid("maxlen must be at least 1".into()));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                common: RelayCommon::of(subscription),
                store,
                template,
                maxlen: target.maxlen,
                dedupe_ttl,
                script: Script::new(include_str!("../../scripts/relay_append.lua")),
            }),
        })
    }

    /// How long a relayed message's dedupe key lives.
    pub fn dedupe_ttl(&self) -> Duration {
        self.inner.dedupe_ttl
    }

    /// The stream `message` goes to: `{tenant}` / the rendered name.
    pub fn stream_key(&self, message: &Message<crate::RawPayload>) -> Result<StreamKey, String> {
        let name = self
            .inner
            .template
            .stream_name(&message.tenant, &message.topic)?;
        StreamKey::new(message.tenant.clone(), name).map_err(|e| e.to_string())
    }

    /// The dedupe key of `message` in the stream at Redis key `stream_key`.
    pub fn dedupe_key(stream_key: &str, message: &Message<crate::RawPayload>) -> String {
        format!("{stream_key}{DEDUPE_KEY_INFIX}{}", message.id)
    }

    /// Appends `message` unless its dedupe key shows an earlier append; the
    /// downstream write a delivery waits for before it completes.
    pub async fn publish(
        &self,
        message: &Message<crate::RawPayload>,
    ) -> Result<Relayed, HandlerError> {
        let inner = &self.inner;
        if !inner.common.relays(&message.tenant) {
            return Ok(Relayed::Skipped);
        }
        let key = self.stream_key(message).map_err(HandlerError::permanent)?;
        let fields = entry_fields(&entry_for(message)?).map_err(|e| {
            HandlerError::permanent(format!("the message cannot be a Redis stream entry: {e}"))
        })?;
        let redis_key = inner.store.redis_key(&key);
        let mut invocation = inner.script.key(&redis_key);
        invocation
            .key(Self::dedupe_key(&redis_key, message))
            .arg(u64::try_from(inner.dedupe_ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(inner.maxlen.unwrap_or(0))
            .arg(fields);
        let reply: Result<(i64, String), RedisError> =
            invocation.invoke_async(&mut inner.store.connection()).await;
        match reply {
            Ok((1, id)) => Ok(Relayed::Stored(id)),
            Ok((_, id)) => Ok(Relayed::Duplicate(id)),
            Err(error) => Err(classify(&redis_key, error)),
        }
    }
}

/// A key of another type is permanent (every retry would meet it); every
/// other error (unreachable, timeout, a server loading or out of memory) is
/// retried.
fn classify(redis_key: &str, error: RedisError) -> HandlerError {
    if error.code() == Some("WRONGTYPE") {
        return HandlerError::permanent(format!(
            "Redis key {redis_key} holds a value that is not a stream"
        ));
    }
    let transient = error.is_timeout() || error.is_io_error();
    let reason = map_error(error);
    if transient {
        HandlerError::retry(format!("Redis unreachable: {reason}"))
    } else {
        HandlerError::retry(format!("Redis refused the append: {reason}"))
    }
}

impl Handler for RedisRelay {
    type Payload = crate::RawPayload;

    async fn handle(&self, message: Message<crate::RawPayload>) -> Result<(), HandlerError> {
        let started = Instant::now();
        let outcome = self.publish(&message).await;
        self.inner.common.record(&outcome, started);
        outcome.map(|_| ())
    }
}
