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
/// exists`), XINFO's `ERR no such key`, or XGROUP CREATECONSUMER's `ERR ...
/// requires the key to exist`.
fn is_missing_group(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default();
    match error.code() {
        Some("NOGROUP") => true,
        Some("UNBLOCKED") => detail.contains("no longer exists"),
        // XGROUP CREATECONSUMER on a stream deleted since the read that
        // came before it in the same pipeline.
        Some("ERR") => {
            detail.starts_with("no such key") || detail.contains("requires the key to exist")
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the shared Redis answers when a stream is gone by the time a
    /// pipelined XGROUP CREATECONSUMER runs (as after a read that came before
    /// it): the group's stream is not found, not a database error.
    #[tokio::test]
    async fn createconsumer_on_a_deleted_stream_is_not_found(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let client = redis::Client::open(url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let missing = format!("t_{}:gone", uuid::Uuid::new_v4().simple());
        let Err(error) = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&missing)
            .arg("g")
            .arg("c")
            .query_async::<redis::Value>(&mut connection)
            .await
        else {
            return Err("CREATECONSUMER on a missing stream succeeded".into());
        };
        let key = StreamKey::new("acme", "gone")?;
        let mapped = map_group(error, &key, "g");
        assert!(matches!(mapped, StoreError::NotFound { .. }), "{mapped:?}");
        Ok(())
    }
}
