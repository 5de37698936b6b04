//! What this daemon delivered, per tenant, for the dashboard: deliveries
//! that succeeded and failed in each second of the last 15 minutes
//! (`GET /v1/throughput`), and completions per (subscription, topic) in the
//! last hour (the `completed_last_hour` of `GET /v1/stats`).
//!
//! Completed work leaves no row behind (a plain handler's delivery is
//! deleted when it succeeds), so the database cannot say how much went
//! through a minute ago; the daemon counts it as it happens instead. Every
//! outbox handler the daemon runs — webhooks, relays, the demo — is wrapped
//! in [`Observed`], which records each outcome here with the message's
//! tenant, so a reader sees only its own tenants' traffic. A handler stopped
//! before it returns (its timeout, a lost lease, a panic) counts as failed.
//! Stream subscriptions (`[[stream_subscriptions]]`) are not counted here.
//!
//! How it fails: the counts live in this process's memory. With several
//! daemons on one database each shows what it delivered; a restart starts
//! empty; a library worker elsewhere is not counted. A snooze (a deferral
//! that spends no attempt) is neither a success nor a failure and is not
//! counted. A transactional handler's success is counted when its handler
//! returns, before its transaction commits, so a commit that then fails is
//! counted as delivered (and, when retried, once more).
//!
//! Memory is bounded: per tenant one bucket per second of the window, per
//! (tenant, subscription, topic) one per minute of the hour; keys whose
//! window is empty are swept out once a minute.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier::{HandlerError, Message, TransactionalHandler};

/// How far back the per-second series reaches.
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(900);
/// How far back completions per (subscription, topic) are counted.
pub const COMPLETED_WINDOW: Duration = Duration::from_secs(3600);
/// How often keys whose window is empty are dropped.
const SWEEP_EVERY_SECONDS: u64 = 60;

/// One tenant's deliveries per second: (unix second, succeeded, failed),
/// oldest first.
type Seconds = VecDeque<(u64, u64, u64)>;
/// Completions per minute: (unix minute, completed), oldest first.
type Minutes = VecDeque<(u64, u64)>;

/// Per-second delivery counts and per-hour completion counts of every
/// tenant this process delivers for.
#[derive(Debug, Default)]
pub struct Throughput {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_tenant: HashMap<String, Seconds>,
    /// (subscription, topic) → tenant → minutes.
    completed: BTreeMap<(String, String), HashMap<String, Minutes>>,
    last_sweep: u64,
}

/// Deliveries per second over [`THROUGHPUT_WINDOW`], oldest first: the
/// last entry is the second `until` ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// The unix second the last bucket covers.
    pub until: u64,
    /// Deliveries that succeeded in each second.
    pub delivered: Vec<u64>,
    /// Deliveries that failed (to be retried or dead-lettered) in each second.
    pub failed: Vec<u64>,
}

/// The process's counts, shared by every observed handler and the API.
pub fn global() -> &'static Throughput {
    static THROUGHPUT: OnceLock<Throughput> = OnceLock::new();
    THROUGHPUT.get_or_init(Throughput::default)
}

/// The wall clock's unix second.
fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn visible(tenants: Option<&[String]>, tenant: &str) -> bool {
    tenants.is_none_or(|tenants| tenants.iter().any(|t| t == tenant))
}

impl Throughput {
    /// Records one delivery of `tenant`'s message on `topic` to
    /// `subscription`: succeeded or failed.
    pub fn record(&self, tenant: &str, subscription: &str, topic: &str, succeeded: bool) {
        self.record_at(now_second(), tenant, subscription, topic, succeeded);
    }

    fn record_at(&self, second: u64, tenant: &str, subscription: &str, topic: &str, ok: bool) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seconds = inner.by_tenant.entry(tenant.to_owned()).or_default();
        match seconds.back_mut() {
            Some((at, delivered, failed)) if *at == second => {
                if ok {
                    *delivered += 1;
                } else {
                    *failed += 1;
                }
            }
            _ => seconds.push_back((second, u64::from(ok), u64::from(!ok))),
        }
        prune_seconds(seconds, second);
        if ok {
            let minute = second / 60;
            let minutes = inner
                .completed
                .entry((subscription.to_owned(), topic.to_owned()))
                .or_default()
                .entry(tenant.to_owned())
                .or_default();
            match minutes.back_mut() {
                Some((at, completed)) if *at == minute => *completed += 1,
                _ => minutes.push_back((minute, 1)),
            }
            prune_minutes(minutes, second);
        }
        if second >= inner.last_sweep + SWEEP_EVERY_SECONDS {
            inner.sweep(second);
        }
    }

    /// The per-second series of `tenants` (`None`: every tenant), summed.
    pub fn series(&self, tenants: Option<&[String]>) -> Series {
        self.series_at(now_second(), tenants)
    }

    fn series_at(&self, now: u64, tenants: Option<&[String]>) -> Series {
        let window = THROUGHPUT_WINDOW.as_secs();
        let len = usize::try_from(window).unwrap_or(usize::MAX);
        let mut series = Series {
            until: now,
            delivered: vec![0; len],
            failed: vec![0; len],
        };
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (tenant, seconds) in &inner.by_tenant {
            if !visible(tenants, tenant) {
                continue;
            }
            for &(at, delivered, failed) in seconds {
                // A second ahead of `now` (the clock stepped back) is left out.
                let Some(age) = now.checked_sub(at) else {
                    continue;
                };
                if age >= window {
                    continue;
                }
                let index = usize::try_from(window - 1 - age).unwrap_or(0);
                series.delivered[index] += delivered;
                series.failed[index] += failed;
            }
        }
        series
    }

    /// Completions in the last hour per (subscription, topic) of `tenants`
    /// (`None`: every tenant); pairs with none are left out.
    pub fn completed_last_hour(
        &self,
        tenants: Option<&[String]>,
    ) -> BTreeMap<(String, String), u64> {
        self.completed_at(now_second(), tenants)
    }

    fn completed_at(
        &self,
        now: u64,
        tenants: Option<&[String]>,
    ) -> BTreeMap<(String, String), u64> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let oldest = (now / 60).saturating_sub(COMPLETED_WINDOW.as_secs() / 60) + 1;
        inner
            .completed
            .iter()
            .filter_map(|(pair, by_tenant)| {
                let total: u64 = by_tenant
                    .iter()
                    .filter(|(tenant, _)| visible(tenants, tenant))
                    .flat_map(|(_, minutes)| minutes.iter())
                    .filter(|(minute, _)| *minute >= oldest)
                    .map(|(_, completed)| completed)
                    .sum();
                (total > 0).then(|| (pair.clone(), total))
            })
            .collect()
    }
}

impl Inner {
    /// Drops what has left every window, and keys left empty.
    fn sweep(&mut self, second: u64) {
        self.last_sweep = second;
        self.by_tenant.retain(|_, seconds| {
            prune_seconds(seconds, second);
            !seconds.is_empty()
        });
        self.completed.retain(|_, by_tenant| {
            by_tenant.retain(|_, minutes| {
                prune_minutes(minutes, second);
                !minutes.is_empty()
            });
            !by_tenant.is_empty()
        });
    }
}

fn prune_seconds(seconds: &mut Seconds, now: u64) {
    let window = THROUGHPUT_WINDOW.as_secs();
    while seconds.front().is_some_and(|(at, _, _)| at + window <= now) {
        seconds.pop_front();
    }
}

fn prune_minutes(minutes: &mut Minutes, now: u64) {
    let window = COMPLETED_WINDOW.as_secs() / 60;
    let minute = now / 60;
    while minutes.front().is_some_and(|(at, _)| at + window <= minute) {
        minutes.pop_front();
    }
}

/// What a handler's result counts as: `Some(true)` delivered, `Some(false)`
/// failed, `None` (a snooze) neither.
fn outcome(result: &Result<(), HandlerError>) -> Option<bool> {
    match result {
        Ok(()) => Some(true),
        Err(HandlerError::Snooze { .. }) => None,
        Err(_) => Some(false),
    }
}

/// A handler whose every outcome is recorded in [`global`] under the
/// message's tenant and topic and this subscription.
#[derive(Debug, Clone)]
pub struct Observed<H> {
    inner: H,
    subscription: String,
}

impl<H> Observed<H> {
    /// `inner`, observed as a handler of `subscription`.
    pub fn new(subscription: impl Into<String>, inner: H) -> Self {
        Self {
            inner,
            subscription: subscription.into(),
        }
    }
}

/// Records one delivery's outcome once: what the handler returned, or a
/// failure if it is dropped first (the engine stops a handler at its timeout
/// or when its lease is lost by dropping it; a panic unwinds through it).
struct Pending<'a> {
    tenant: &'a str,
    subscription: &'a str,
    topic: &'a str,
    settled: bool,
}

impl Pending<'_> {
    fn settle(mut self, result: &Result<(), HandlerError>) {
        self.settled = true;
        if let Some(succeeded) = outcome(result) {
            global().record(self.tenant, self.subscription, self.topic, succeeded);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.settled {
            global().record(self.tenant, self.subscription, self.topic, false);
        }
    }
}

impl<H: courier::Handler> courier::Handler for Observed<H> {
    type Payload = H::Payload;

    async fn handle(&self, message: Message<Self::Payload>) -> Result<(), HandlerError> {
        let tenant = message.tenant.clone();
        let topic = message.topic.clone();
        let pending = Pending {
            tenant: &tenant,
            subscription: &self.subscription,
            topic: &topic,
            settled: false,
        };
        let result = self.inner.handle(message).await;
        pending.settle(&result);
        result
    }
}

impl<C: Send, H: TransactionalHandler<C>> TransactionalHandler<C> for Observed<H> {
    type Payload = H::Payload;

    async fn handle(
        &self,
        message: &Message<Self::Payload>,
        conn: &mut C,
    ) -> Result<(), HandlerError> {
        let pending = Pending {
            tenant: &message.tenant,
            subscription: &self.subscription,
            topic: &message.topic,
            settled: false,
        };
        let result = self.inner.handle(message, conn).await;
        pending.settle(&result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_sums_visible_tenants_per_second_within_the_window() {
        let throughput = Throughput::default();
        let now = 1_000_000;
        throughput.record_at(now - 1000, "acme", "s", "a", true); // outside
        throughput.record_at(now - 899, "acme", "s", "a", true); // oldest bucket
        throughput.record_at(now, "acme", "s", "a", true);
        throughput.record_at(now, "acme", "s", "a", false);
        throughput.record_at(now, "globex", "s", "a", true);
        let all = throughput.series_at(now, None);
        assert_eq!(all.delivered.len(), 900);
        assert_eq!(
            (all.delivered[0], all.delivered[899], all.failed[899]),
            (1, 2, 1)
        );
        assert_eq!(all.delivered.iter().sum::<u64>(), 3);
        let acme = throughput.series_at(now, Some(&["acme".to_owned()]));
        assert_eq!((acme.delivered[899], acme.failed[899]), (1, 1));
        let none = throughput.series_at(now, Some(&[]));
        assert_eq!(none.delivered.iter().sum::<u64>(), 0);
    }

    #[test]
    fn completions_count_per_pair_for_an_hour_and_only_visible_tenants() {
        let throughput = Throughput::default();
        let now = 6_000_000;
        throughput.record_at(now - 3600, "acme", "s", "a", true); // an hour ago: out
        throughput.record_at(now - 3000, "acme", "s", "a", true);
        throughput.record_at(now, "acme", "s", "b", true);
        throughput.record_at(now, "acme", "s", "b", false); // a failure completes nothing
        throughput.record_at(now, "globex", "t", "a", true);
        let all = throughput.completed_at(now, None);
        let pair = |s: &str, t: &str| (s.to_owned(), t.to_owned());
        assert_eq!(
            all,
            BTreeMap::from([
                (pair("s", "a"), 1),
                (pair("s", "b"), 1),
                (pair("t", "a"), 1)
            ])
        );
        let acme = throughput.completed_at(now, Some(&["acme".to_owned()]));
        assert_eq!(
            acme.keys().cloned().collect::<Vec<_>>(),
            vec![pair("s", "a"), pair("s", "b")]
        );
    }

    #[test]
    fn a_sweep_drops_tenants_and_pairs_with_nothing_left_in_their_window() {
        let throughput = Throughput::default();
        throughput.record_at(100_000, "old", "s", "a", true);
        throughput.record_at(100_000 + 3700, "new", "s", "b", true);
        let inner = throughput
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(inner.by_tenant.keys().collect::<Vec<_>>(), vec!["new"]);
        assert_eq!(inner.completed.len(), 1);
    }

    #[tokio::test]
    async fn a_handler_stopped_before_it_returns_counts_as_failed() {
        let tenant = format!("t{}", uuid::Uuid::now_v7().simple());
        let observed = Observed::new(
            "s",
            courier::handler_fn(|_message: Message<serde_json::Value>| async {
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }),
        );
        let message = Message {
            id: uuid::Uuid::now_v7(),
            tenant: tenant.clone(),
            topic: "a".into(),
            schema_version: 1,
            payload: serde_json::Value::Null,
            headers: Default::default(),
            ordering_key: None,
            priority: 0,
            subscription: "s".into(),
            attempt: 1,
            occurred_at: chrono::Utc::now(),
            enqueued_at: chrono::Utc::now(),
        };
        let stopped = tokio::time::timeout(
            Duration::from_millis(20),
            courier::Handler::handle(&observed, message),
        )
        .await;
        assert!(stopped.is_err(), "the handler never returns");
        let series = global().series(Some(&[tenant]));
        let failed: u64 = series.failed.iter().sum();
        let delivered: u64 = series.delivered.iter().sum();
        assert_eq!((delivered, failed), (0, 1));
    }

    #[test]
    fn snoozes_count_as_neither() {
        assert_eq!(outcome(&Ok(())), Some(true));
        assert_eq!(outcome(&Err(HandlerError::retry("503"))), Some(false));
        assert_eq!(outcome(&Err(HandlerError::permanent("400"))), Some(false));
        assert_eq!(
            outcome(&Err(HandlerError::snooze(Duration::from_secs(1), "quota"))),
            None
        );
    }
}
