//! How failed deliveries are spaced out and when they give up.

use std::time::Duration;

use crate::ValidationError;

/// Capped exponential backoff with jitter, and the attempt budget.
///
/// The delay before attempt `n + 1` after attempt `n` failed is drawn
/// uniformly from `[d / 2, d]` where `d = min(cap, base · 2^(n-1))`; the jitter
/// keeps a burst of failures from retrying in lockstep. After `max_attempts`
/// failed attempts the delivery is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts before a delivery is dead-lettered (≥ 1).
    pub max_attempts: i32,
    /// The first retry's (un-jittered) delay.
    pub base: Duration,
    /// The longest delay between two attempts.
    pub cap: Duration,
}

impl RetryPolicy {
    /// Attempts before dead letter by default, as in the seed outbox processor.
    pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
    /// The default first delay.
    pub const DEFAULT_BASE: Duration = Duration::from_secs(2);
    /// The default longest delay.
    pub const DEFAULT_CAP: Duration = Duration::from_secs(300);

    /// A policy with `max_attempts` attempts and the default delays.
    pub fn with_max_attempts(max_attempts: i32) -> Self {
        Self {
            max_attempts,
            ..Self::default()
        }
    }

    /// Checks that the policy can be followed.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.max_attempts < 1 {
            return Err(ValidationError::new(
                "retry.max_attempts",
                format!("must be at least 1, got {}", self.max_attempts),
            ));
        }
        if self.base.is_zero() {
            return Err(ValidationError::new("retry.base", "must be above zero"));
        }
        if self.cap < self.base {
            return Err(ValidationError::new(
                "retry.cap",
                format!(
                    "must be at least retry.base ({} ms), got {} ms",
                    self.base.as_millis(),
                    self.cap.as_millis()
                ),
            ));
        }
        Ok(())
    }

    /// The un-jittered delay after failed attempt `attempt` (1-based).
    pub fn ceiling(&self, attempt: i32) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
        self.base
            .checked_mul(1u32 << exponent)
            .map_or(self.cap, |delay| delay.min(self.cap))
    }

    /// The jittered delay after failed attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: i32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let spread = u64::try_from((ceiling - half).as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(fastrand::u64(0..=spread))
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            base: Self::DEFAULT_BASE,
            cap: Self::DEFAULT_CAP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_until_the_cap_and_stays_within_jitter() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.ceiling(1), Duration::from_secs(2));
        assert_eq!(policy.ceiling(2), Duration::from_secs(4));
        assert_eq!(policy.ceiling(8), Duration::from_secs(256));
        assert_eq!(policy.ceiling(9), Duration::from_secs(300));
        assert_eq!(policy.ceiling(1000), Duration::from_secs(300));
        for attempt in 1..20 {
            let delay = policy.backoff(attempt);
            let ceiling = policy.ceiling(attempt);
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{attempt}: {delay:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let policy = RetryPolicy::default();
        let delays: std::collections::HashSet<_> = (0..50).map(|_| policy.backoff(5)).collect();
        assert!(delays.len() > 10);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let zero = RetryPolicy::with_max_attempts(0).validate();
        assert_eq!(zero.map_err(|e| e.field), Err("retry.max_attempts"));
        let inverted = RetryPolicy {
            cap: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        assert_eq!(inverted.validate().map_err(|e| e.field), Err("retry.cap"));
    }
}
