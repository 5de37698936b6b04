//! Errors at Courier's crate boundaries.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// Input that Courier refuses, with the field it concerns and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ValidationError {
    /// The field that was refused (`tenant`, `topic`, `payload`, ...).
    pub field: &'static str,
    /// Why it was refused, in words a user can act on.
    pub reason: String,
}

impl ValidationError {
    /// A refusal of `field` for `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// An error from a storage backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The input was refused before anything was stored.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The claim's lease expired or was taken over: the write was refused and
    /// its transaction rolled back.
    #[error("lease lost: the claim on delivery {delivery_id} expired or was taken over")]
    LeaseLost {
        /// The delivery whose lease is gone.
        delivery_id: i64,
    },
    /// The database reported an error. `transient` errors (lost connection,
    /// deadlock, serialization failure, lock timeout, busy database) are worth
    /// retrying; the others are not.
    #[error("database error: {source}")]
    Database {
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
        /// Whether retrying the same operation may succeed.
        transient: bool,
    },
    /// The schema in the database is newer than this build of Courier knows.
    #[error("the database schema is at version {found}, newer than this build's {known}")]
    SchemaTooNew {
        /// The version found in the database.
        found: i64,
        /// The newest version this build ships.
        known: i64,
    },
    /// A migration applied to the database differs from the one this build
    /// ships (its recorded checksum is not the binary's): someone edited
    /// history. The migration run that found it applied nothing.
    #[error(
        "migration {version:04} {name} was changed after it was applied: \
         recorded checksum {recorded}, this binary has {expected}"
    )]
    MigrationChanged {
        /// The migration's version.
        version: i64,
        /// The migration's name, as this build ships it.
        name: String,
        /// The checksum the database recorded when it was applied.
        recorded: String,
        /// This build's checksum of it.
        expected: String,
    },
    /// A stored row could not be decoded (a corrupt or foreign row).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The named object (a stream's consumer group, ...) does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, e.g. `group billing of stream acme/orders`.
        what: String,
    },
}

impl StoreError {
    /// Whether the same operation may succeed if tried again later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Database {
                transient: true,
                ..
            }
        )
    }
}

/// How a handler reports that it did not apply a message.
///
/// Any error type converts into a retryable `HandlerError` with `?`; use
/// [`HandlerError::permanent`] to dead-letter at once and
/// [`HandlerError::retry_after`] to ask for a specific delay.
pub enum HandlerError {
    /// Try again after the retry policy's backoff (spends an attempt).
    Retry(Box<dyn StdError + Send + Sync>),
    /// Try again after exactly this delay (spends an attempt).
    RetryAfter {
        /// How long to wait before the next attempt.
        delay: Duration,
        /// Why.
        reason: String,
    },
    /// Never try again: dead-letter the message now.
    Permanent(String),
    /// Not now: offer the message again after `delay` without spending an
    /// attempt (a tenant over its quota, a dependency not ready yet). Snoozes
    /// are counted apart from attempts and bounded (see `MAX_SNOOZES`).
    Snooze {
        /// How long to wait before offering the message again.
        delay: Duration,
        /// Why, for the error history once snoozes are exhausted.
        reason: String,
    },
}

impl HandlerError {
    /// A failure that must not be retried; the message is dead-lettered at once.
    pub fn permanent(reason: impl fmt::Display) -> Self {
        HandlerError::Permanent(reason.to_string())
    }

    /// A failure to retry after `delay` rather than the policy's backoff.
    pub fn retry_after(delay: Duration, reason: impl fmt::Display) -> Self {
        HandlerError::RetryAfter {
            delay,
            reason: reason.to_string(),
        }
    }

    /// Offer the message again after `delay` without spending an attempt.
    pub fn snooze(delay: Duration, reason: impl fmt::Display) -> Self {
        HandlerError::Snooze {
            delay,
            reason: reason.to_string(),
        }
    }

    /// A retryable failure described by `reason`.
    pub fn retry(reason: impl fmt::Display) -> Self {
        HandlerError::Retry(reason.to_string().into())
    }

    /// Whether this failure dead-letters at once.
    pub fn is_permanent(&self) -> bool {
        matches!(self, HandlerError::Permanent(_))
    }
}

impl<E> From<E> for HandlerError
where
    E: StdError + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        HandlerError::Retry(Box::new(error))
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retry(source) => {
                write!(f, "{source}")?;
                let mut next = source.source();
                while let Some(cause) = next {
                    write!(f, ": {cause}")?;
                    next = cause.source();
                }
                Ok(())
            }
            HandlerError::RetryAfter { delay, reason } => {
                write!(f, "{reason} (retry after {} ms)", delay.as_millis())
            }
            HandlerError::Permanent(reason) => write!(f, "permanent failure: {reason}"),
            HandlerError::Snooze { delay, reason } => {
                write!(f, "snoozed for {} ms: {reason}", delay.as_millis())
            }
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
