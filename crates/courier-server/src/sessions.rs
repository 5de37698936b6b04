//! The dashboard's sign-in sessions, kept in this daemon's memory.
//!
//! Signing in with a token ([`Sessions::start`]) makes a session: a random
//! 256-bit id, which the browser keeps in the `courier_session` cookie, bound
//! to the token's digest. The cookie never holds the token: browsers send a
//! host's cookies to every port of that host, so another program listening
//! there could read it, and a session id is worth far less than a token — it
//! works only as a cookie on this daemon, ends on sign-out, after
//! [`SESSION_IDLE`] unused or [`SESSION_LIFETIME`] in all, and with the daemon
//! (a restart signs everyone out). A session acts with its token's tenants
//! and roles as the configuration has them, and not at all once the token is
//! gone from it.
//!
//! The store keeps only the ids' SHA-256 digests, at most [`MAX_SESSIONS`]
//! of them (the oldest is dropped to make room); with several daemons behind
//! one address, the dashboard needs a sticky route to one of them (it shows
//! that daemon's own throughput anyway).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long a session lasts without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(8 * 3600);
/// How long a session lasts at most.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The most sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;

/// Live sessions by the digest of their id.
#[derive(Debug, Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<[u8; 32], Session>>,
}

#[derive(Debug, Clone, Copy)]
struct Session {
    /// The SHA-256 of the token it was started with.
    token_digest: [u8; 32],
    started: Instant,
    last_used: Instant,
}

impl Session {
    fn live(&self, now: Instant) -> bool {
        now.duration_since(self.started) < SESSION_LIFETIME
            && now.duration_since(self.last_used) < SESSION_IDLE
    }
}

/// A session id as the cookie carries it: 64 hex digits.
fn id_digest(cookie_value: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(cookie_value).ok()?;
    (bytes.len() == 32).then(|| Sha256::digest(&bytes).into())
}

impl Sessions {
    /// Starts a session for the token whose SHA-256 is `token_digest`, and
    /// returns its id for the cookie.
    pub fn start(&self, token_digest: [u8; 32]) -> String {
        self.start_at(token_digest, Instant::now())
    }

    fn start_at(&self, token_digest: [u8; 32], now: Instant) -> String {
        let mut id = [0_u8; 32];
        // Two version-4 UUIDs: 244 bits from the operating system's generator.
        id[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        id[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        let mut sessions = self.lock();
        sessions.retain(|_, session| session.live(now));
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, session)| session.started)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            Sha256::digest(id).into(),
            Session {
                token_digest,
                started: now,
                last_used: now,
            },
        );
        hex::encode(id)
    }

    /// The digest of the token behind the session `cookie_value`, if that
    /// session is live; using it keeps it alive.
    pub fn token_digest(&self, cookie_value: &str) -> Option<[u8; 32]> {
        self.token_digest_at(cookie_value, Instant::now())
    }

    fn token_digest_at(&self, cookie_value: &str, now: Instant) -> Option<[u8; 32]> {
        let key = id_digest(cookie_value)?;
        let mut sessions = self.lock();
        let session = sessions.get_mut(&key)?;
        if !session.live(now) {
            sessions.remove(&key);
            return None;
        }
        session.last_used = now;
        Some(session.token_digest)
    }

    /// Ends the session `cookie_value` (nothing if there is none).
    pub fn end(&self, cookie_value: &str) {
        if let Some(key) = id_digest(cookie_value) {
            self.lock().remove(&key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_random_maps_to_its_token_and_ends_on_sign_out() {
        let sessions = Sessions::default();
        let a = sessions.start([1; 32]);
        let b = sessions.start([2; 32]);
        assert_eq!((a.len(), b.len()), (64, 64));
        assert_ne!(a, b);
        assert_eq!(sessions.token_digest(&a), Some([1; 32]));
        assert_eq!(sessions.token_digest(&b), Some([2; 32]));
        for unknown in [
            hex::encode([7_u8; 32]),
            "zz".into(),
            String::new(),
            a[..62].to_owned(),
        ] {
            assert_eq!(sessions.token_digest(&unknown), None, "{unknown}");
        }
        sessions.end(&a);
        assert_eq!(sessions.token_digest(&a), None);
        assert_eq!(sessions.token_digest(&b), Some([2; 32]));
    }

    #[test]
    fn an_idle_or_old_session_has_ended() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let id = sessions.start_at([1; 32], start);
        let idle = start + SESSION_IDLE + Duration::from_secs(1);
        assert_eq!(sessions.token_digest_at(&id, idle), None);
        let id = sessions.start_at([1; 32], start);
        // Used every hour, it still ends at its lifetime.
        for hour in 1..24 {
            let now = start + Duration::from_secs(3600 * hour);
            assert_eq!(sessions.token_digest_at(&id, now), Some([1; 32]), "{hour}");
        }
        let end = start + SESSION_LIFETIME + Duration::from_secs(1);
        assert_eq!(sessions.token_digest_at(&id, end), None);
    }
}
