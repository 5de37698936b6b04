//! One place where PostgreSQL errors become [`StoreError`]s.

use courier_core::StoreError;

/// SQLSTATEs worth retrying: connection exceptions (class 08), serialization
/// failure, deadlock, lock not available, server shutting down or starting,
/// too many connections, out of resources.
fn is_transient_code(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03" | "53300" | "53400" | "53200"
        )
}

/// Translates a driver error, classifying it as transient or not.
pub(crate) fn map(error: sqlx::Error) -> StoreError {
    let transient = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| is_transient_code(&code)),
        _ => false,
    };
    StoreError::Database {
        source: Box::new(error),
        transient,
    }
}
