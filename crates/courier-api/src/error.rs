//! The refusal of a request field.

use courier_core::ValidationError;

/// What kind of refusal a [`RequestError`] is; the daemon answers 422 for
/// [`Invalid`](RequestErrorKind::Invalid) and 413 for
/// [`TooLarge`](RequestErrorKind::TooLarge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestErrorKind {
    /// The field is refused: a bad name, header, time or key.
    Invalid,
    /// The field (a payload) is over its size limit.
    TooLarge,
}

/// A request field refused, with the field named as the daemon's error
/// response names it (`tenant`, `messages[2].headers.x`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
#[non_exhaustive]
pub struct RequestError {
    /// The kind of refusal.
    pub kind: RequestErrorKind,
    /// The field concerned.
    pub field: String,
    /// Why, in words a user can act on.
    pub message: String,
}

impl RequestError {
    /// `field` is refused for `message`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: RequestErrorKind::Invalid,
            field: field.into(),
            message: message.into(),
        }
    }

    /// `field` is over its size limit, as `message` says.
    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: RequestErrorKind::TooLarge,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A validation error, with `prefix` (`messages[2].`) before its field.
    pub fn from_validation(prefix: &str, error: ValidationError) -> Self {
        Self::invalid(format!("{prefix}{}", error.field), error.reason)
    }
}
