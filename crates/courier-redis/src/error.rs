//! One place where Redis errors become [`StoreError`]s.

use courier_core::{group_not_found, StoreError, StreamKey};
use redis::RedisError;

/// Server error codes worth retrying: a server loading its data set, busy
/// running a script, a cluster resharding or failing over.
const TRANSIENT_CODES: &[&str] = &["LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN"];

/// Whether retrying the same command later may succeed: I/O errors (refused,
/// reset or dropped connections), timeouts, and the server states above.
pub(crate) fn is_transient(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error
            .code()
            .is_some_and(|code| TRANSIENT_CODES.contains(&code))
}

/// Translates a driver error, classifying it as transient or not.
pub(crate) fn map(error: RedisError) -> StoreError {
    let transient = is_transient(&error);
    StoreError::Database {
        source: Box::new(error),
        transient,
    }
}

/// Whether `error` says the stream or its group does not exist: `NOGROUP`,
/// a blocked read whose stream was deleted (`UNBLOCKED ... no longer
/// exists`), or XINFO's `ERR no such key`.
fn is_missing_group(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default();
    match error.code() {
        Some("NOGROUP") => true,
        Some("UNBLOCKED") => detail.contains("no longer exists"),
        Some("ERR") => detail.starts_with("no such key"),
        _ => false,
    }
}

/// Like [`map`], but a missing stream or group of an operation on `group`
/// becomes [`StoreError::NotFound`].
pub(crate) fn map_group(error: RedisError, key: &StreamKey, group: &str) -> StoreError {
    if is_missing_group(&error) {
        group_not_found(key, group)
    } else {
        map(error)
    }
}

/// A reply of a shape the store did not expect.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("unexpected Redis reply: {what}"))
}
