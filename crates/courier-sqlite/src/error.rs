//! One place where SQLite errors become [`StoreError`]s.

use courier_core::StoreError;

/// `SQLITE_BUSY`: another connection holds the lock and the busy timeout ran out.
const SQLITE_BUSY: i32 = 5;
/// `SQLITE_LOCKED`: a conflict inside one connection or a shared cache.
const SQLITE_LOCKED: i32 = 6;
/// `SQLITE_PROTOCOL`: a WAL lock race that SQLite gave up retrying.
const SQLITE_PROTOCOL: i32 = 15;

/// Whether a (primary or extended) result code is worth retrying: the
/// database was busy or locked. Extended codes keep the primary code in their
/// low byte (`SQLITE_BUSY_SNAPSHOT` is `5 | 2 << 8`).
fn is_transient_code(code: i32) -> bool {
    matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED | SQLITE_PROTOCOL)
}

/// Translates a driver error, classifying it as transient or not.
pub(crate) fn map(error: sqlx::Error) -> StoreError {
    let transient = match &error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(is_transient_code),
        _ => false,
    };
    StoreError::Database {
        source: Box::new(error),
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_locked_are_transient_with_their_extended_codes() {
        for code in [
            5,
            5 | (1 << 8),
            5 | (2 << 8),
            5 | (3 << 8),
            6,
            6 | (1 << 8),
            15,
        ] {
            assert!(is_transient_code(code), "{code}");
        }
        // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_READONLY.
        for code in [2067, 11, 13, 8] {
            assert!(!is_transient_code(code), "{code}");
        }
    }

    #[test]
    fn pool_timeouts_are_transient_and_decoding_errors_are_not() {
        assert!(map(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!map(sqlx::Error::RowNotFound).is_transient());
    }
}
