//! Request limits of the API, checked when a request's token is looked at:
//!
//! - **Per tenant** (`server.tenant_requests_per_second`, burst
//!   `server.tenant_request_burst`): a token bucket per tenant. A token
//!   scoped to one tenant spends that tenant's bucket, so several tokens of
//!   one tenant share it; a token of several tenants, or of all, has a bucket
//!   of its own. Past it: 429 `too_many_requests` with `Retry-After` (whole
//!   seconds until a request would pass).
//! - **Failed authentication per client address**
//!   (`server.auth_failures_per_minute`): once an address has sent that many
//!   requests with a missing or unknown token within a minute, every request
//!   from it is refused with 429 and `Retry-After` until the minute is over,
//!   a valid token's included (it may be the guess that finally matched).
//!   The address is the TCP peer's: behind a proxy that is the proxy's.
//!
//! An open API (no tokens) has neither: it serves loopback only. Each map
//! holds at most [`MAX_TRACKED`] keys; past that, expired ones are dropped,
//! and keys that still find no room are not limited (the process never grows
//! without bound under a flood of addresses).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most tenants, tokens or addresses each limit tracks at once.
pub const MAX_TRACKED: usize = 100_000;

/// The window failed authentications are counted in.
pub const AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The client address of a request (the TCP peer), set by the daemon's
/// server on every request it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The API's request limits; zero turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    /// Requests per second per tenant, sustained.
    pub tenant_requests_per_second: u32,
    /// Requests a tenant may send at once above the sustained rate.
    pub tenant_request_burst: u32,
    /// Failed authentications per client address per minute.
    pub auth_failures_per_minute: u32,
}

impl LimitSettings {
    /// No limits.
    pub const OFF: Self = Self {
        tenant_requests_per_second: 0,
        tenant_request_burst: 0,
        auth_failures_per_minute: 0,
    };
}

/// The limits' state.
#[derive(Debug)]
pub struct Limits {
    settings: LimitSettings,
    buckets: Mutex<HashMap<String, Bucket>>,
    failures: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl Limits {
    /// Limits with `settings`.
    pub fn new(settings: LimitSettings) -> Self {
        Self {
            settings,
            buckets: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket; `Err(wait)` when it is empty,
    /// with how long until one would pass.
    pub fn take(&self, key: &str) -> Result<(), Duration> {
        let rate = f64::from(self.settings.tenant_requests_per_second);
        if rate == 0.0 {
            return Ok(());
        }
        let burst = f64::from(self.settings.tenant_request_burst.max(1));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(key) && buckets.len() >= MAX_TRACKED {
            // Full buckets are the ones a tenant would get anew.
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
            if buckets.len() >= MAX_TRACKED {
                return Ok(());
            }
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        bucket.at = now;
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            Ok(())
        } else {
            bucket.tokens = tokens;
            Err(Duration::from_secs_f64((1.0 - tokens) / rate))
        }
    }

    /// How long `addr` is still refused for its failed authentications, if
    /// it is.
    pub fn blocked(&self, addr: IpAddr) -> Option<Duration> {
        let limit = self.settings.auth_failures_per_minute;
        if limit == 0 {
            return None;
        }
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let window = failures.get(&addr)?;
        let left = AUTH_FAILURE_WINDOW.checked_sub(window.started.elapsed())?;
        (window.failures >= limit && !left.is_zero()).then_some(left)
    }

    /// Counts a failed authentication from `addr`.
    pub fn failed(&self, addr: IpAddr) {
        if self.settings.auth_failures_per_minute == 0 {
            return;
        }
        let now = Instant::now();
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if !failures.contains_key(&addr) && failures.len() >= MAX_TRACKED {
            failures.retain(|_, w| now.duration_since(w.started) < AUTH_FAILURE_WINDOW);
            if failures.len() >= MAX_TRACKED {
                return;
            }
        }
        let window = failures.entry(addr).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now.duration_since(window.started) >= AUTH_FAILURE_WINDOW {
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures = window.failures.saturating_add(1);
    }
}

/// Whole seconds for `Retry-After`, at least 1.
pub fn retry_after_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(rate: u32, burst: u32, failures: u32) -> LimitSettings {
        LimitSettings {
            tenant_requests_per_second: rate,
            tenant_request_burst: burst,
            auth_failures_per_minute: failures,
        }
    }

    #[test]
    fn a_tenant_gets_its_burst_then_the_rate_and_others_are_not_touched() {
        let limits = Limits::new(settings(10, 5, 0));
        for _ in 0..5 {
            assert!(limits.take("acme").is_ok());
        }
        let wait = limits.take("acme").expect_err("the burst is spent");
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        assert!(limits.take("globex").is_ok());
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            limits.take("acme").is_ok(),
            "a token came back after 1/rate"
        );
        assert!(limits.take("acme").is_err());
    }

    #[test]
    fn an_address_is_refused_after_its_failures_until_the_window_ends() {
        let limits = Limits::new(settings(0, 0, 3));
        let (bad, good): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        for _ in 0..2 {
            limits.failed(bad);
        }
        assert_eq!(limits.blocked(bad), None);
        limits.failed(bad);
        let left = limits.blocked(bad).expect("refused after 3 failures");
        assert!(left > Duration::from_secs(58) && left <= AUTH_FAILURE_WINDOW);
        assert_eq!(limits.blocked(good), None);
        assert_eq!(retry_after_seconds(Duration::from_millis(59_001)), 60);
    }

    #[test]
    fn zero_turns_each_limit_off() {
        let limits = Limits::new(LimitSettings::OFF);
        for _ in 0..1_000 {
            assert!(limits.take("acme").is_ok());
            limits.failed([10, 0, 0, 1].into());
        }
        assert_eq!(limits.blocked([10, 0, 0, 1].into()), None);
    }
}
