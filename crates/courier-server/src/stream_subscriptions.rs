//! The daemon's stream backend and its `[[stream_subscriptions]]`.
//!
//! [`StreamBackend::open`] picks the backend `[streams] backend` names:
//! `native`, the outbox database's own streams, or `redis`, a
//! [`RedisStreamStore`] connected to `[redis] url` under `key_prefix` and
//! checked with a `PING` — so an unreachable Redis stops the daemon at start
//! with the reason, instead of serving 503s. Later outages are the API's 503
//! and the subscriptions' reconnect backoff.
//!
//! [`StreamBackend::start_subscriptions`] builds one
//! [`StreamSubscription`] per entry (streams on the backend, receipts in the
//! outbox database), creates each one's group before returning — so entries
//! appended once `bind` returns are never before a new group's start — and
//! starts it; [`stop_subscriptions`] stops them at shutdown, each waiting up
//! to `shutdown_timeout_ms` for deliveries in flight (the rest stay pending,
//! to be claimed once idle).

use courier::redis::{RedisConfig, RedisStreamStore};
use courier::{
    StoreError, StreamReceipts, StreamStore, StreamSubscription, StreamSubscriptionHandle,
};

use crate::api::ApiState;
use crate::config::{Config, ConfigError, StreamBackendKind};
use crate::daemon::ServeError;
use crate::stream_webhook::StreamWebhookHandler;

/// The stream backend the daemon serves and subscribes on.
pub enum StreamBackend<S> {
    /// The outbox database's native streams.
    Native(S),
    /// Redis Streams.
    Redis(RedisStreamStore),
}

/// A started stream subscription and its name.
pub type RunningStreamSubscription = (String, StreamSubscriptionHandle);

/// The server part of a Redis URL (`host:port`), without credentials.
fn redis_address(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => format!(
            "{}:{}",
            parsed.host_str().unwrap_or("?"),
            parsed.port().unwrap_or(6379)
        ),
        Err(_) => "(unparsable url)".to_owned(),
    }
}

impl<S: StreamStore + StreamReceipts> StreamBackend<S> {
    /// The backend `config` names; `store` is the outbox database's store.
    pub async fn open(store: &S, config: &Config) -> Result<Self, ServeError> {
        match config.streams.backend {
            StreamBackendKind::Native => {
                tracing::info!(backend = StreamStore::backend(store), "streams are native");
                Ok(Self::Native(store.clone()))
            }
            StreamBackendKind::Redis => {
                let Some(redis) = &config.redis else {
                    return Err(ServeError::Config(ConfigError::Invalid {
                        key: "streams.backend".into(),
                        value: Some("\"redis\"".into()),
                        reason: "needs a [redis] section with the server's url".into(),
                    }));
                };
                let address = redis_address(&redis.url);
                let failed = |source: StoreError| ServeError::Streams {
                    backend: "redis",
                    address: address.clone(),
                    source,
                };
                let streams =
                    RedisStreamStore::connect_with(&redis.url, RedisConfig::new(&redis.key_prefix))
                        .await
                        .map_err(failed)?;
                streams.ping().await.map_err(failed)?;
                tracing::info!(%address, key_prefix = %redis.key_prefix, "streams are on Redis");
                Ok(Self::Redis(streams))
            }
        }
    }

    /// `state` serving `/v1/streams` from this backend.
    pub fn serve_api(&self, state: ApiState) -> ApiState {
        match self {
            Self::Native(store) => state.with_streams(store.clone()),
            Self::Redis(streams) => {
                let ping = streams.clone();
                state.with_streams(streams.clone()).with_streams_readiness(
                    "redis",
                    std::sync::Arc::new(move || {
                        let ping = ping.clone();
                        Box::pin(async move { ping.ping().await })
                    }),
                )
            }
        }
    }

    /// Builds, creates the group of, and starts every configured stream
    /// subscription, with receipts in `receipts`; on an error the ones
    /// already started are stopped.
    pub async fn start_subscriptions(
        &self,
        receipts: &S,
        config: &Config,
    ) -> Result<Vec<RunningStreamSubscription>, ServeError> {
        match self {
            Self::Native(store) => start_all(|_| Ok(store.clone()), receipts, config).await,
            Self::Redis(streams) => {
                start_all(|settings| redis_for(streams, settings), receipts, config).await
            }
        }
    }
}

/// The Redis store a subscription reads through: `streams`, with the
/// subscription's stream at its `redis_key` when it names one.
fn redis_for(
    streams: &RedisStreamStore,
    settings: &crate::config::StreamSubscriptionSettings,
) -> Result<RedisStreamStore, courier::ValidationError> {
    match &settings.redis_key {
        None => Ok(streams.clone()),
        Some(raw) => streams.with_raw_key(&settings.key()?, raw),
    }
}

async fn start_all<T: StreamStore, R: StreamReceipts>(
    store_for: impl Fn(
        &crate::config::StreamSubscriptionSettings,
    ) -> Result<T, courier::ValidationError>,
    receipts: &R,
    config: &Config,
) -> Result<Vec<RunningStreamSubscription>, ServeError> {
    let mut running = Vec::with_capacity(config.stream_subscriptions.len());
    for (i, settings) in config.stream_subscriptions.iter().enumerate() {
        let streams = match store_for(settings) {
            Ok(streams) => streams,
            Err(e) => {
                stop_subscriptions(running).await;
                return Err(ServeError::Config(ConfigError::Invalid {
                    key: format!("stream_subscriptions[{i}].{}", e.field),
                    value: None,
                    reason: e.reason,
                }));
            }
        };
        match start_one(&streams, receipts, config, i).await {
            Ok(handle) => {
                tracing::info!(
                    subscription = %settings.name,
                    tenant = %settings.tenant,
                    stream = %settings.stream,
                    redis_key = settings.redis_key.as_deref(),
                    "stream subscription started"
                );
                running.push((settings.name.clone(), handle));
            }
            Err(error) => {
                stop_subscriptions(running).await;
                return Err(error);
            }
        }
    }
    Ok(running)
}

async fn start_one<T: StreamStore, R: StreamReceipts>(
    streams: &T,
    receipts: &R,
    config: &Config,
    index: usize,
) -> Result<StreamSubscriptionHandle, ServeError> {
    let Some(settings) = config.stream_subscriptions.get(index) else {
        return Err(ServeError::Config(ConfigError::Invalid {
            key: format!("stream_subscriptions[{index}]"),
            value: None,
            reason: "missing".into(),
        }));
    };
    let engine_config = settings
        .engine_config(config.shutdown_timeout())
        .map_err(|e| ConfigError::Invalid {
            key: format!("stream_subscriptions[{index}].{}", e.field),
            value: None,
            reason: e.reason,
        })?;
    let handler = StreamWebhookHandler::from_config(settings)?;
    let subscription =
        StreamSubscription::new(streams.clone(), receipts.clone(), engine_config, handler)
            .map_err(|source| ServeError::Worker {
                subscription: settings.name.clone(),
                source,
            })?;
    subscription
        .ensure_group()
        .await
        .map_err(|source| ServeError::Streams {
            backend: StreamStore::backend(streams),
            address: format!("stream {}/{}", settings.tenant, settings.stream),
            source,
        })?;
    Ok(subscription.start())
}

/// Stops stream subscriptions at once, each finishing its deliveries in
/// flight up to its shutdown timeout.
pub async fn stop_subscriptions(running: Vec<RunningStreamSubscription>) {
    let stops = running.into_iter().map(|(name, handle)| async move {
        handle.shutdown().await;
        tracing::info!(subscription = %name, "stream subscription stopped");
    });
    futures_util::future::join_all(stops).await;
}
