//! Wakes idle workers when producers commit messages.
//!
//! The fan-out trigger sends a NOTIFY on the store's channel once per insert
//! statement; it is delivered at commit. The notifier holds one dedicated
//! connection that LISTENs and bumps a `watch` counter that workers wait on.
//!
//! Failure: when the listening connection drops (server restart,
//! `pg_terminate_backend`), notifications sent meanwhile are lost, so the
//! notifier wakes every worker once (they claim and find what was missed) and
//! reconnects with capped backoff. A connection that stays up but stops
//! delivering (its server process frozen, a half-open TCP connection) is
//! found by a probe: every [`LISTEN_CHECK`] the notifier sends a notification
//! of its own through the pool, and when one has not come back by the next
//! check it drops the connection and listens on a new one. Workers also poll,
//! so a notifier that cannot reconnect degrades latency, never correctness.

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::PgStore;

const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often the listening connection is probed; one that has not delivered
/// its probe by the next check is replaced.
pub const LISTEN_CHECK: Duration = Duration::from_secs(5);

/// The payload prefix of probes: they wake no worker.
const CHECK_PREFIX: &str = "courier-listener-check:";

/// Listens for the store's NOTIFY wake-ups.
pub struct PgNotifier;

impl PgNotifier {
    /// Spawns the listener task; each notification (and each reconnect) bumps
    /// `wake`. The task ends when `cancel` fires. It first warns, once, when
    /// the store's pool JIT-compiles (see [`connect_options`](crate::connect_options)):
    /// the notifier is what every worker on PostgreSQL starts.
    pub fn spawn(
        store: &PgStore,
        wake: watch::Sender<u64>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let pool = store.pool().clone();
        let channel = store.notify_channel();
        let store = store.clone();
        tokio::spawn(async move {
            warn_if_jit(&store).await;
            let mut backoff = RECONNECT_MIN;
            while !cancel.is_cancelled() {
                match listen_until_lost(&store, &pool, &channel, &wake, &cancel).await {
                    Ok(()) => backoff = RECONNECT_MIN,
                    Err(error) => {
                        tracing::warn!(%error, channel, "LISTEN connection failed; reconnecting");
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                    }
                }
                // Anything sent while we were not listening is lost: let workers look.
                wake.send_modify(|n| *n = n.wrapping_add(1));
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        })
    }
}

/// Warns when the store's pool JIT-compiles (a pool the application built
/// without [`connect_options`](crate::connect_options)).
async fn warn_if_jit(store: &PgStore) {
    match store.jit_enabled().await {
        Ok(true) => tracing::warn!(
            schema = store.schema(),
            "JIT is on for Courier's PostgreSQL pool: once its tables have statistics, \
             every claim may spend longer compiling than running; build the pool from \
             courier_postgres::connect_options(url) or set jit = off for its connections"
        ),
        Ok(false) => {}
        Err(error) => tracing::debug!(%error, "could not read the pool's jit setting"),
    }
}

async fn listen_until_lost(
    store: &PgStore,
    pool: &sqlx::PgPool,
    channel: &str,
    wake: &watch::Sender<u64>,
    cancel: &CancellationToken,
) -> Result<(), sqlx::Error> {
    // A connection of its own, outside the store's pool: a listener dropped
    // because it stopped delivering sends `UNLISTEN *` before its connection
    // goes back to its pool, and on a frozen or half-open connection that
    // never returns. It must not hold one of the store's connections then.
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with((*pool.connect_options()).clone());
    let mut listener = PgListener::connect_with(&own).await?;
    listener.listen(channel).await?;
    tracing::debug!(channel, "listening for wake-ups");
    wake.send_modify(|n| *n = n.wrapping_add(1));
    let token = format!("{CHECK_PREFIX}{}", uuid::Uuid::now_v7());
    let mut checks = tokio::time::interval(LISTEN_CHECK);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the oldest probe not yet received was sent.
    let mut awaiting: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            _ = checks.tick() => {
                if awaiting.is_some_and(|sent| sent.elapsed() >= LISTEN_CHECK / 2) {
                    tracing::warn!(
                        channel,
                        "LISTEN connection stopped delivering (its probe did not come back); \
                         listening on a new one"
                    );
                    return Ok(());
                }
                // A failed probe proves nothing about the listener: the pool
                // may be down too, and the next check tries again.
                let sent = sqlx::query(&store.q().listener_check)
                    .bind(channel)
                    .bind(&token)
                    .execute(pool)
                    .await;
                if sent.is_ok() && awaiting.is_none() {
                    awaiting = Some(tokio::time::Instant::now());
                }
            }
            received = listener.try_recv() => match received? {
                Some(notification) if notification.payload() == token => awaiting = None,
                // Another process's probe.
                Some(notification) if notification.payload().starts_with(CHECK_PREFIX) => {}
                Some(_) => wake.send_modify(|n| *n = n.wrapping_add(1)),
                None => {
                    tracing::warn!(channel, "LISTEN connection lost; reconnecting");
                    return Ok(());
                }
            }
        }
    }
}
