//! The serve loop: connect, migrate, start one worker per subscription, serve
//! the API, and shut down gracefully.
//!
//! [`bind`] does everything that can fail at start — validating the config,
//! opening the database (PostgreSQL for `postgres://` URLs, SQLite otherwise),
//! running migrations, opening the stream backend (see
//! [`crate::stream_subscriptions`]), connecting to the servers relays
//! write to (Redis, NATS; a NATS relay also checks its JetStream stream),
//! registering every subscription, creating every stream subscription's
//! group and binding the listener — and returns a [`Running`] daemon with its bound address (so
//! tests can listen on port 0). [`run`] is `bind` then wait.
//!
//! Shutdown, when the `shutdown` future completes: the listener stops
//! accepting, blocking stream reads end at once and other open HTTP requests
//! finish; every stream subscription stops reading; every worker stops claiming, lets
//! its in-flight deliveries finish for up to `shutdown_timeout_ms` (those still
//! running then are recorded as failed attempts, retried at once by the next
//! daemon) and hands back claimed-but-unstarted ones without spending an
//! attempt; then maintenance stops and `run` returns `Ok`. A crash instead
//! leaves leases to expire, after which any daemon's rescuer returns them.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use courier::{
    AdminStore, Courier, DeadLetterStore, EngineError, MaintenanceConfig, OutboxStore, StoreError,
    StreamReceipts, StreamStore, WorkerHandle,
};
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{metrics_router, router, ApiState};
use crate::config::{
    Config, ConfigError, DatabaseKind, LogFormat, SubscriptionConfig, TargetConfig,
};
use crate::guard::RequestGuard;
use crate::http_server;
use crate::metrics::prometheus;
use crate::relay::{NativeRelay, NativeStreamStore, RelayConnections, RelayError};
use crate::stream_subscriptions::{stop_subscriptions, StreamBackend};
use crate::throughput::Observed;
use crate::webhook::{WebhookError, WebhookHandler};

/// How often histogram data is folded for `/metrics`.
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Why the daemon could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened.
    #[error("cannot open the database: {0}")]
    Connect(#[source] StoreError),
    /// Migrations failed.
    #[error("cannot migrate the database: {0}")]
    Migrate(#[source] StoreError),
    /// A subscription's webhook could not be set up.
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    /// A subscription's relay could not start (its server unreachable, its
    /// JetStream stream missing or forgetting message ids too soon).
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// A subscription's worker could not be built.
    #[error("subscription {subscription}: {source}")]
    Worker {
        /// The subscription.
        subscription: String,
        /// The engine's error.
        #[source]
        source: EngineError,
    },
    /// The stream backend could not be reached at start.
    #[error("cannot open the stream backend ({backend}) at {address}: {source}")]
    Streams {
        /// `redis`, `postgres` or `sqlite`.
        backend: &'static str,
        /// Where (`host:port`, never credentials) or what (a stream).
        address: String,
        /// The backend's error.
        #[source]
        source: StoreError,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP server failed while running.
    #[error("the HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// A started daemon: listening, its workers running.
pub struct Running {
    address: SocketAddr,
    metrics_address: Option<SocketAddr>,
    task: BoxFuture<'static, Result<(), ServeError>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("address", &self.address)
            .field("metrics_address", &self.metrics_address)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The address the API listens on (the bound port when `listen` used port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The address of the token-less `/metrics` listener
    /// (`server.metrics_listen`), if one is configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_address
    }

    /// Runs until the shutdown future completes and shutdown has finished.
    pub async fn finished(self) -> Result<(), ServeError> {
        self.task.await
    }
}

/// Starts the daemon and runs it until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    bind(config, shutdown).await?.finished().await
}

/// Validates `config`, opens and migrates the database, registers and starts
/// every subscription's worker and binds the listener; the returned daemon
/// serves until `shutdown` completes.
pub async fn bind(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, ServeError> {
    config.validate()?;
    match config.database()? {
        DatabaseKind::Postgres(url) => {
            let courier = Courier::connect_postgres_with_schema(&url, &config.schema)
                .await
                .map_err(|error| match error {
                    StoreError::Invalid(invalid) => ServeError::Config(ConfigError::Invalid {
                        key: "schema".into(),
                        value: Some(format!("{:?}", config.schema)),
                        reason: invalid.reason,
                    }),
                    other => ServeError::Connect(other),
                })?;
            tracing::info!(schema = %config.schema, "using PostgreSQL");
            start(courier, config, shutdown).await
        }
        DatabaseKind::Sqlite(path) => {
            let courier = Courier::connect_sqlite(&path)
                .await
                .map_err(ServeError::Connect)?;
            tracing::info!(database = %path, "using SQLite");
            start(courier, config, shutdown).await
        }
    }
}

async fn start<S>(
    courier: Courier<S>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Running, ServeError>
where
    S: OutboxStore
        + DeadLetterStore
        + AdminStore
        + StreamStore
        + StreamReceipts
        + NativeStreamStore,
{
    courier.migrate().await.map_err(ServeError::Migrate)?;
    let streams = StreamBackend::open(courier.store(), &config).await?;
    let state = streams.serve_api(ApiState::new(courier.store().clone(), &config)?);
    let stop_requests = state.shutdown_token();
    let open = state.is_open();
    let relays = RelayConnections::connect(&config).await?;

    let mut workers: Vec<(String, WorkerHandle)> = Vec::with_capacity(config.subscriptions.len());
    for subscription in &config.subscriptions {
        let builder = match with_target(&courier, &relays, subscription).await {
            Ok(builder) => builder,
            Err(error) => {
                stop_workers(workers).await;
                return Err(error);
            }
        };
        let mut builder = builder
            .retry_policy(subscription.retry.policy())
            .concurrency(subscription.concurrency)
            .batch_size(subscription.concurrency)
            .shutdown_timeout(config.shutdown_timeout())
            .maintenance(None);
        // Checked when the configuration was loaded.
        if let Some(Ok(replay)) = subscription.replay.as_deref().map(str::parse) {
            builder = builder.replay(replay);
        }
        let built = builder.build().await;
        let worker = match built {
            Ok(worker) => worker,
            Err(source) => {
                stop_workers(workers).await;
                return Err(ServeError::Worker {
                    subscription: subscription.name.clone(),
                    source,
                });
            }
        };
        tracing::info!(
            subscription = %subscription.name,
            topics = ?subscription.topics,
            target = subscription.target.kind(),
            "subscription registered"
        );
        workers.push((subscription.name.clone(), worker.start()));
    }

    let services = CancellationToken::new();
    let mut demo_publisher = None;
    if config.demo {
        match start_demo(&courier, services.clone()).await {
            Ok((worker, publisher)) => {
                workers.push((DEMO_SUBSCRIPTION.to_owned(), worker));
                demo_publisher = Some(publisher);
            }
            Err(source) => {
                stop_workers(workers).await;
                return Err(ServeError::Worker {
                    subscription: DEMO_SUBSCRIPTION.to_owned(),
                    source,
                });
            }
        }
    }

    let stream_subscriptions = match streams.start_subscriptions(courier.store(), &config).await {
        Ok(running) => running,
        Err(error) => {
            stop_workers(workers).await;
            return Err(error);
        }
    };

    let listener = match TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(source) => {
            futures_util::future::join(
                stop_workers(workers),
                stop_subscriptions(stream_subscriptions),
            )
            .await;
            return Err(ServeError::Bind {
                address: config.listen,
                source,
            });
        }
    };
    let address = listener.local_addr().map_err(|source| ServeError::Bind {
        address: config.listen,
        source,
    })?;
    let metrics_listener = match config.server.metrics_listen {
        Some(metrics_listen) => match bind_listener(metrics_listen).await {
            Ok(bound) => Some(bound),
            Err(error) => {
                futures_util::future::join(
                    stop_workers(workers),
                    stop_subscriptions(stream_subscriptions),
                )
                .await;
                return Err(error);
            }
        },
        None => None,
    };
    let metrics_address = metrics_listener.as_ref().map(|(_, address)| *address);
    // Each listener answers to its own address (and the configured names).
    let metrics_app = metrics_address.map(|metrics_address| {
        metrics_router(
            state
                .clone()
                .with_guard(RequestGuard::for_listener(metrics_address, &config.server)),
        )
    });
    let app = router(state.with_guard(RequestGuard::for_listener(address, &config.server)));
    // The timeout wraps everything a request does, its guard and body included.
    let with_timeout = |app: axum::Router| {
        app.layer(axum::middleware::from_fn_with_state(
            config.server.request_timeout(),
            http_server::request_timeout,
        ))
    };
    let app = with_timeout(app);
    let metrics_app = metrics_app.map(with_timeout);
    let limits = config.server.limits();
    if address.ip().is_unspecified() && config.server.allowed_hosts.is_empty() {
        tracing::warn!(
            %address,
            "listening on every interface without server.allowed_hosts: requests must carry              `Host: {address}`, any other host gets 421; list the names clients use"
        );
    }
    if let Some(metrics_address) = metrics_address {
        if !metrics_address.ip().is_loopback() {
            tracing::warn!(
                %metrics_address,
                "server.metrics_listen is not a loopback address: anyone who reaches it reads every subscription's metrics without a token"
            );
        }
        tracing::info!(%metrics_address, "serving /metrics without tokens");
    }
    if open {
        tracing::warn!(
            %address,
            "no [[tokens]] configured: the API is open to anyone who can reach this loopback address"
        );
    }
    tracing::info!(
        %address,
        subscriptions = workers.len(),
        stream_subscriptions = stream_subscriptions.len(),
        "courier is serving"
    );

    let maintenance = match courier.maintenance(MaintenanceConfig::default()) {
        Ok(maintenance) => Some(tokio::spawn(maintenance.run(services.clone()))),
        Err(error) => {
            tracing::error!(%error, "maintenance refused its configuration; rescuer and pruner not running");
            None
        }
    };
    let upkeep = tokio::spawn(metrics_upkeep(services.clone()));

    let shutdown_timeout = config.shutdown_timeout();
    let task = async move {
        let stop_accepting = CancellationToken::new();
        let metrics_server = metrics_listener
            .zip(metrics_app)
            .map(|((listener, _), app)| {
                tokio::spawn(http_server::serve(
                    listener,
                    app,
                    limits,
                    stop_accepting.clone(),
                ))
            });
        let server = http_server::serve(listener, app, limits, stop_accepting.clone());
        let mut server = tokio::spawn(server);
        let mut server_result = None;
        tokio::select! {
            () = shutdown => tracing::info!("shutting down: no new requests; finishing deliveries in flight"),
            finished = &mut server => server_result = Some(finished),
        }
        stop_accepting.cancel();
        stop_requests.cancel();
        let server_result = match server_result {
            Some(result) => result,
            None => match tokio::time::timeout(shutdown_timeout, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(
                        "open HTTP requests did not finish before the shutdown deadline"
                    );
                    server.abort();
                    Ok(Ok(()))
                }
            },
        };
        if let Some(metrics_server) = metrics_server {
            // Scrapes are short; one still running at the deadline is cut.
            if tokio::time::timeout(shutdown_timeout, metrics_server)
                .await
                .is_err()
            {
                tracing::warn!("a /metrics request did not finish before the shutdown deadline");
            }
        }
        services.cancel();
        if let Some(publisher) = demo_publisher {
            let _ = publisher.await;
        }
        futures_util::future::join(
            stop_workers(workers),
            stop_subscriptions(stream_subscriptions),
        )
        .await;
        if let Some(maintenance) = maintenance {
            let _ = maintenance.await;
        }
        let _ = upkeep.await;
        tracing::info!("courier stopped");
        match server_result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(ServeError::Serve(error)),
            Err(join) => Err(ServeError::Serve(std::io::Error::other(join.to_string()))),
        }
    };
    Ok(Running {
        address,
        metrics_address,
        task: Box::pin(task),
    })
}

/// Binds `address`, returning the listener and the address it got.
async fn bind_listener(address: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let bind_error = |source| ServeError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// A worker for `subscription` with the handler its target calls for: a
/// webhook, a Redis or NATS relay (plain handlers), or a native stream relay
/// (transactional: the append commits with the completion).
async fn with_target<S>(
    courier: &Courier<S>,
    relays: &RelayConnections,
    subscription: &SubscriptionConfig,
) -> Result<courier::WorkerBuilder<S>, ServeError>
where
    S: OutboxStore + DeadLetterStore + AdminStore + NativeStreamStore,
{
    let mut builder = courier.worker(subscription.name.clone());
    if let Some(versions) = &subscription.versions {
        builder = builder.catch_all_versions(versions.clone());
    }
    for (topic, own) in &subscription.topic_retry {
        builder = builder.topic_retry_policy(topic.clone(), own.over(subscription.retry).policy());
    }
    let topics = subscription.topics.clone();
    // Every outcome also feeds the dashboard's throughput (crate::throughput).
    let name = subscription.name.clone();
    Ok(match &subscription.target {
        TargetConfig::Webhook(_) => builder.handle_all(
            topics,
            Observed::new(name, WebhookHandler::from_config(subscription)?),
        ),
        TargetConfig::RedisStream(_) => builder.handle_all(
            topics,
            Observed::new(name, relays.redis_relay(subscription)?),
        ),
        TargetConfig::Nats(_) => builder.handle_all(
            topics,
            Observed::new(name, relays.nats_relay(subscription).await?),
        ),
        TargetConfig::Stream(_) => builder.handle_all_transactional(
            topics,
            Observed::new(
                name,
                NativeRelay::new(subscription, courier.store().clone())?,
            ),
        ),
    })
}

/// The built-in subscription `--demo` delivers to.
pub const DEMO_SUBSCRIPTION: &str = "demo";
const DEMO_INTERVAL: Duration = Duration::from_secs(2);
/// Every this many demo orders fail once, then succeed.
const DEMO_RETRIED_EVERY: u64 = 10;
/// Every this many demo orders fail for good.
const DEMO_DECLINED_EVERY: u64 = 25;
const DEMO_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Starts the demo subscription (it logs every message it receives) and a
/// publisher of one sample `demo.order_placed` event every two seconds.
///
/// So that the dashboard has each state to show, the demo handler fails the
/// way real ones do: every 10th order once ("the warehouse did not answer",
/// retried 5 s later, then delivered) and every 25th for good ("the card was
/// declined", a dead letter to retry or discard).
async fn start_demo<S>(
    courier: &Courier<S>,
    stop: CancellationToken,
) -> Result<(WorkerHandle, tokio::task::JoinHandle<()>), courier::EngineError>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let worker = courier
        .worker(DEMO_SUBSCRIPTION)
        .handle_all(
            vec!["demo.*".to_owned()],
            Observed::new(
                DEMO_SUBSCRIPTION,
                courier::handler_fn(|message: courier::Message<serde_json::Value>| async move {
                    let order = message
                        .payload
                        .get("order")
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0);
                    if order > 0 && order.is_multiple_of(DEMO_DECLINED_EVERY) {
                        return Err(courier::HandlerError::permanent(format!(
                            "order {order}: the card was declined"
                        )));
                    }
                    if order > 0 && order.is_multiple_of(DEMO_RETRIED_EVERY) && message.attempt == 1
                    {
                        return Err(courier::HandlerError::retry_after(
                            DEMO_RETRY_AFTER,
                            format!("order {order}: the warehouse did not answer"),
                        ));
                    }
                    tracing::info!(
                        message_id = %message.id,
                        tenant = %message.tenant,
                        topic = %message.topic,
                        payload = %message.payload,
                        "demo subscription delivered a message"
                    );
                    Ok::<(), courier::HandlerError>(())
                }),
            ),
        )
        .maintenance(None)
        .build()
        .await?
        .start();
    tracing::info!("demo: publishing a sample event every 2 s to the `demo` subscription");
    let courier = courier.clone();
    let publisher = tokio::spawn(async move {
        let mut order: u64 = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(DEMO_INTERVAL) => {}
            }
            order += 1;
            let payload = serde_json::json!({
                "order": order,
                "amount_cents": 1000 + (order * 250) % 9000,
                "customer": format!("customer-{}", order % 7),
            });
            match courier::NewMessage::new("demo", "demo.order_placed", &payload) {
                Ok(message) => {
                    if let Err(error) = courier.publish(&[message]).await {
                        tracing::warn!(%error, "demo: publishing failed");
                    }
                }
                Err(error) => tracing::warn!(%error, "demo: building the event failed"),
            }
        }
    });
    Ok((worker, publisher))
}

async fn stop_workers(workers: Vec<(String, WorkerHandle)>) {
    let stops = workers.into_iter().map(|(name, worker)| async move {
        worker.shutdown().await;
        tracing::info!(subscription = %name, "subscription stopped");
    });
    futures_util::future::join_all(stops).await;
}

async fn metrics_upkeep(stop: CancellationToken) {
    let handle = prometheus();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(METRICS_UPKEEP_INTERVAL) => handle.run_upkeep(),
        }
    }
}

/// Installs a global `tracing` subscriber writing `format` to stderr, filtered
/// by `RUST_LOG` (default `info`). Does nothing if one is installed already.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or a collector
    // gets no escape codes.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
