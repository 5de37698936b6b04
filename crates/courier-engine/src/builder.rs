//! Configuring a worker: [`WorkerBuilder`] registers handlers by topic and
//! schema version, per-topic retry policies and timeouts, and settings.
//!
//! [`WorkerBuilder::build`] checks everything before anything is written:
//! the subscription and topic names, the settings, that each (topic,
//! version) has one handler, and that every per-topic policy or timeout names
//! a topic with a handler. Only then does it register the subscription with
//! its topics in the store (topics are added, never removed), so a refused
//! configuration leaves the store untouched; a store error is returned and
//! nothing runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{OutboxStore, Replay, RetryPolicy, Route, SubscriptionSpec, ValidationError};
use tokio::sync::watch;

use crate::config::{WorkerConfig, CATCH_ALL_TOPIC, CATCH_ALL_VERSION};
use crate::executor::{RouteTable, Routes};
use crate::handler::{ErasedHandler, PlainRoute, TransactionalRoute, UpcastRoute, UpcastStep};
use crate::maintenance::MaintenanceConfig;
use crate::worker::Worker;
use crate::{EngineError, Handler, TransactionalHandler};

/// Configures a worker: its subscription, handlers and settings.
pub struct WorkerBuilder<S: OutboxStore> {
    store: S,
    subscription: String,
    routes: RouteTable<S::Connection>,
    duplicate_route: Option<(String, i32)>,
    /// Upcasters by (topic, the version they start from).
    upcasters: HashMap<(String, i32), UpcastStep>,
    duplicate_upcaster: Option<(String, i32)>,
    catch_all_topics: Vec<String>,
    /// The schema versions the catch-all handler takes; `None`: all.
    catch_all_versions: Option<Vec<i32>>,
    policies: HashMap<String, RetryPolicy>,
    timeouts: HashMap<String, Option<Duration>>,
    config: WorkerConfig,
    wake: Option<watch::Receiver<u64>>,
    replay: Option<Replay>,
}

impl<S: OutboxStore> WorkerBuilder<S> {
    /// A worker for `subscription` over `store`, with default settings.
    pub fn new(store: S, subscription: impl Into<String>) -> Self {
        Self {
            store,
            subscription: subscription.into(),
            routes: HashMap::new(),
            duplicate_route: None,
            upcasters: HashMap::new(),
            duplicate_upcaster: None,
            catch_all_topics: Vec::new(),
            catch_all_versions: None,
            policies: HashMap::new(),
            timeouts: HashMap::new(),
            config: WorkerConfig::default(),
            wake: None,
            replay: None,
        }
    }

    fn route(
        mut self,
        topic: String,
        version: i32,
        handler: Arc<dyn ErasedHandler<S::Connection>>,
    ) -> Self {
        match self.routes.entry((topic, version)) {
            std::collections::hash_map::Entry::Occupied(taken) => {
                self.duplicate_route = Some(taken.key().clone());
            }
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(handler);
            }
        }
        self
    }

    /// Handles `topic` at `schema_version` with `handler` (effects outside the database).
    pub fn handle<H: Handler>(
        self,
        topic: impl Into<String>,
        schema_version: i32,
        handler: H,
    ) -> Self {
        self.route(
            topic.into(),
            schema_version,
            Arc::new(PlainRoute(Arc::new(handler))),
        )
    }

    /// Handles every message the subscription receives, whatever its topic or
    /// schema version, with one handler (a relay to a webhook or a stream).
    /// `topics` are the subscription's patterns: exact topics, `prefix.*`, or `*`.
    pub fn handle_all<H: Handler>(mut self, topics: Vec<String>, handler: H) -> Self {
        self.catch_all_topics.extend(topics);
        self.route(
            CATCH_ALL_TOPIC.to_owned(),
            CATCH_ALL_VERSION,
            Arc::new(PlainRoute(Arc::new(handler))),
        )
    }

    /// Handles `topic` at `schema_version` inside the delivery's transaction,
    /// so the effect, the receipt and the completion commit together.
    pub fn handle_transactional<H: TransactionalHandler<S::Connection>>(
        self,
        topic: impl Into<String>,
        schema_version: i32,
        handler: H,
    ) -> Self {
        self.route(
            topic.into(),
            schema_version,
            Arc::new(TransactionalRoute(Arc::new(handler))),
        )
    }

    /// Handles every message the subscription receives, whatever its topic or
    /// schema version, with one handler inside the delivery's transaction (a
    /// relay to a native stream in the same database: the append commits with
    /// the receipt and the completion). `topics` as for [`Self::handle_all`].
    pub fn handle_all_transactional<H: TransactionalHandler<S::Connection>>(
        mut self,
        topics: Vec<String>,
        handler: H,
    ) -> Self {
        self.catch_all_topics.extend(topics);
        self.route(
            CATCH_ALL_TOPIC.to_owned(),
            CATCH_ALL_VERSION,
            Arc::new(TransactionalRoute(Arc::new(handler))),
        )
    }

    /// Limits the handler of [`Self::handle_all`] or
    /// [`Self::handle_all_transactional`] to messages of these schema
    /// versions (each ≥ 1): messages of other versions are not claimed by
    /// this worker and wait, spending no attempt, for one that takes them.
    /// Without it the handler takes every version.
    pub fn catch_all_versions(mut self, versions: Vec<i32>) -> Self {
        self.catch_all_versions = Some(versions);
        self
    }

    /// Upcasts `topic`'s payloads of schema version `from` to version `to`
    /// (later than `from`) with `upcaster`, a function from the old JSON
    /// payload to the new one. A handler of a later version then also
    /// receives the older messages, upcast before they are decoded: a
    /// message of version `v` without its own handler follows the upcasters
    /// from `v` until a version with a handler. Upcasters chain (`v1 → v2`,
    /// `v2 → v3` bring v1 messages to a v3 handler); a version with neither
    /// a handler nor a path of upcasters to one is not claimed by this
    /// worker. An upcaster that fails (or panics) is a permanent failure of
    /// the delivery, whose error names the upcaster. The handler sees the
    /// message's `schema_version` as the version it was upcast to.
    pub fn upcast<F, E>(mut self, topic: impl Into<String>, from: i32, to: i32, upcaster: F) -> Self
    where
        F: Fn(serde_json::Value) -> Result<serde_json::Value, E> + Send + Sync + 'static,
        E: std::fmt::Display,
    {
        let step = UpcastStep {
            from,
            to,
            upcast: Arc::new(move |payload| upcaster(payload).map_err(|e| e.to_string())),
        };
        match self.upcasters.entry((topic.into(), from)) {
            std::collections::hash_map::Entry::Occupied(taken) => {
                self.duplicate_upcaster = Some(taken.key().clone());
            }
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(step);
            }
        }
        self
    }

    /// Adds a route for every version an upcaster starts from that has no
    /// handler of its own, to the handler its chain of upcasters ends at.
    fn upcast_routes(&mut self) -> Result<(), EngineError> {
        if let Some((topic, from)) = self.duplicate_upcaster.take() {
            return Err(ValidationError::new(
                "upcasters",
                format!("two upcasters from version {from} of topic {topic:?}"),
            )
            .into());
        }
        // In (topic, version) order, so a refusal names the same upcaster
        // every time.
        let mut upcasters: Vec<(&(String, i32), &UpcastStep)> = self.upcasters.iter().collect();
        upcasters.sort_by(|a, b| a.0.cmp(b.0));
        for ((topic, from), step) in upcasters.iter().copied() {
            courier_core::validate_name("topic", topic)?;
            if *from < 1 || step.to <= *from {
                return Err(ValidationError::new(
                    "upcasters",
                    format!(
                        "an upcaster of topic {topic:?} must go from a version ≥ 1 to a later one, not v{from} → v{}",
                        step.to
                    ),
                )
                .into());
            }
        }
        let mut added = Vec::new();
        for ((topic, from), step) in upcasters {
            let mut steps = vec![step.clone()];
            let mut version = step.to;
            // Every upcaster goes to a later version, so a chain ends.
            let target = loop {
                if let Some(handler) = self.routes.get(&(topic.clone(), version)) {
                    break Arc::clone(handler);
                }
                let Some(next) = self.upcasters.get(&(topic.clone(), version)) else {
                    return Err(ValidationError::new(
                        "upcasters",
                        format!(
                            "the upcasters of topic {topic:?} from v{from} end at v{version}, which has no handler"
                        ),
                    )
                    .into());
                };
                steps.push(next.clone());
                version = next.to;
            };
            if !self.routes.contains_key(&(topic.clone(), *from)) {
                added.push((
                    (topic.clone(), *from),
                    Arc::new(UpcastRoute {
                        topic: topic.clone(),
                        steps,
                        target,
                    }) as Arc<dyn ErasedHandler<S::Connection>>,
                ));
            }
        }
        self.routes.extend(added);
        Ok(())
    }

    /// Replaces every setting at once.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Handlers running at once.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.config.concurrency = concurrency;
        self
    }

    /// The most deliveries claimed in one round trip.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.config.batch_size = batch_size;
        self
    }

    /// The most transactional deliveries run in one database transaction
    /// (see [`WorkerConfig::transaction_batch_size`]).
    pub fn transaction_batch_size(mut self, size: usize) -> Self {
        self.config.transaction_batch_size = size;
        self
    }

    /// How long a claim lasts without a heartbeat.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Time between heartbeats (a third of the lease by default).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = Some(interval);
        self
    }

    /// Time between claims when idle and no wake-up arrives.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// The most deliveries of one tenant running at once.
    pub fn tenant_in_flight_limit(mut self, limit: u32) -> Self {
        self.config.tenant_in_flight_limit = Some(limit);
        self
    }

    /// How long shutdown waits for running handlers.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// How long one handler may run before it is cancelled and its attempt
    /// fails (`None`: no limit; 60 s by default).
    pub fn handler_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.handler_timeout = timeout;
        self
    }

    /// The handler timeout for one topic (`None`: no limit).
    pub fn topic_handler_timeout(
        mut self,
        topic: impl Into<String>,
        timeout: Option<Duration>,
    ) -> Self {
        self.timeouts.insert(topic.into(), timeout);
        self
    }

    /// The retry policy for topics without one of their own.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// The retry policy for one topic.
    pub fn topic_retry_policy(mut self, topic: impl Into<String>, policy: RetryPolicy) -> Self {
        self.policies.insert(topic.into(), policy);
        self
    }

    /// Who this worker is, in leases and logs.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.config.worker_id = id.into();
        self
    }

    /// Maintenance run by this worker (`None`: none).
    pub fn maintenance(mut self, maintenance: Option<MaintenanceConfig>) -> Self {
        self.config.maintenance = maintenance;
        self
    }

    /// When this worker's registration creates its subscription, the
    /// subscription also receives these retained messages (see [`Replay`]);
    /// an existing subscription replays nothing.
    pub fn replay(mut self, replay: Replay) -> Self {
        self.replay = Some(replay);
        self
    }

    /// Wakes the idle worker whenever this counter changes.
    pub fn wake_on(mut self, wake: watch::Receiver<u64>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Validates the configuration and registers the subscription with the
    /// topics of its handlers (topics are added, never removed).
    pub async fn build(mut self) -> Result<Worker<S>, EngineError> {
        courier_core::validate_name("subscription", &self.subscription)?;
        self.config.validate()?;
        if let Some((topic, version)) = self.duplicate_route {
            return Err(ValidationError::new(
                "handlers",
                format!("two handlers for topic {topic:?} version {version}"),
            )
            .into());
        }
        if self.routes.is_empty() {
            return Err(
                ValidationError::new("handlers", "a worker needs at least one handler").into(),
            );
        }
        self.upcast_routes()?;
        if let Some(versions) = &self.catch_all_versions {
            if versions.is_empty() || versions.iter().any(|v| *v < 1) {
                return Err(ValidationError::new(
                    "catch_all_versions",
                    format!("must list schema versions ≥ 1, got {versions:?}"),
                )
                .into());
            }
            if !self
                .routes
                .contains_key(&(CATCH_ALL_TOPIC.to_owned(), CATCH_ALL_VERSION))
            {
                return Err(ValidationError::new(
                    "catch_all_versions",
                    "applies to a handler of every topic (handle_all), and there is none",
                )
                .into());
            }
        }
        let mut claim_routes = Vec::with_capacity(self.routes.len());
        for (topic, version) in self.routes.keys() {
            if topic == CATCH_ALL_TOPIC && *version == CATCH_ALL_VERSION {
                let versions = match &self.catch_all_versions {
                    Some(versions) => versions.clone(),
                    None => vec![CATCH_ALL_VERSION],
                };
                for version in versions {
                    claim_routes.push(Route {
                        topic: topic.clone(),
                        schema_version: version,
                        max_attempts: self.config.retry.max_attempts,
                    });
                }
                continue;
            }
            courier_core::validate_name("topic", topic)?;
            if *version < 1 {
                return Err(ValidationError::new(
                    "schema_version",
                    format!("must be at least 1, got {version} for topic {topic:?}"),
                )
                .into());
            }
            let policy = self
                .policies
                .get(topic)
                .copied()
                .unwrap_or(self.config.retry);
            claim_routes.push(Route {
                topic: topic.clone(),
                schema_version: *version,
                max_attempts: policy.max_attempts,
            });
        }
        let catch_all = self
            .routes
            .contains_key(&(CATCH_ALL_TOPIC.to_owned(), CATCH_ALL_VERSION));
        let mut topic_policies: Vec<(&String, &RetryPolicy)> = self.policies.iter().collect();
        topic_policies.sort_by_key(|(topic, _)| *topic);
        // Routes that only give a topic its own attempts under the handler of
        // every topic: not topics of the subscription (its patterns are).
        let mut policy_routes = Vec::new();
        for (topic, policy) in topic_policies {
            policy.validate()?;
            let handled = claim_routes.iter().any(|r| &r.topic == topic);
            let taken = catch_all
                && self
                    .catch_all_topics
                    .iter()
                    .any(|pattern| courier_core::topic_matches(pattern, topic));
            if !taken {
                if handled {
                    continue;
                }
                return Err(ValidationError::new(
                    "retry",
                    format!("a policy names topic {topic:?}, which has no handler"),
                )
                .into());
            }
            // The handler of every topic takes it (its versions without a
            // handler of their own): claims of this topic carry its own
            // attempt budget (an exact topic's route comes before the
            // catch-all's in the claim, an exact version's before any).
            courier_core::validate_name("topic", topic)?;
            let versions = match &self.catch_all_versions {
                Some(versions) => versions.clone(),
                None => vec![CATCH_ALL_VERSION],
            };
            for version in versions {
                policy_routes.push(Route {
                    topic: topic.clone(),
                    schema_version: version,
                    max_attempts: policy.max_attempts,
                });
            }
        }
        for (topic, timeout) in &self.timeouts {
            if timeout.is_some_and(|t| t.is_zero()) {
                return Err(ValidationError::new(
                    "handler_timeout",
                    format!(
                        "the timeout of topic {topic:?} must be above zero (None for no limit)"
                    ),
                )
                .into());
            }
            let taken = catch_all
                && self
                    .catch_all_topics
                    .iter()
                    .any(|pattern| courier_core::topic_matches(pattern, topic));
            if !taken && !claim_routes.iter().any(|r| &r.topic == topic) {
                return Err(ValidationError::new(
                    "handler_timeout",
                    format!("a timeout names topic {topic:?}, which has no handler"),
                )
                .into());
            }
        }
        let mut topics: Vec<String> = claim_routes
            .iter()
            .filter(|r| r.topic != CATCH_ALL_TOPIC)
            .map(|r| r.topic.clone())
            .collect();
        topics.extend(self.catch_all_topics.iter().cloned());
        topics.sort();
        topics.dedup();
        claim_routes.extend(policy_routes);
        claim_routes
            .sort_by(|a, b| (&a.topic, a.schema_version).cmp(&(&b.topic, b.schema_version)));
        self.store
            .register_subscription(&SubscriptionSpec {
                name: self.subscription.clone(),
                topics,
                replay: self.replay,
            })
            .await?;
        Ok(Worker::assemble(
            self.store,
            self.subscription,
            self.config,
            claim_routes,
            Routes {
                handlers: self.routes,
                policies: self.policies,
                timeouts: self.timeouts,
            },
            self.wake,
        ))
    }
}
