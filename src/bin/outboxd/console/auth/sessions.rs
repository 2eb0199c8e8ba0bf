//! The console's sessions, kept in memory: a login gets a random id (the
//! cookie) and a CSRF token of its own. Logging out ends the session at
//! once, whatever the browser kept; a restart ends them all, and so does a
//! change of the token, which takes one. Ids are looked up by their
//! SHA-256, so the table's timing says nothing about them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::Digest;

use super::seal::hex;

/// How long a login lasts: the cookie's Max-Age, and how long the session
/// is kept (measured on the monotonic clock: a step of the wall clock
/// neither ends nor lengthens it).
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Sessions kept at most; a login beyond ends the oldest.
const MAX_SESSIONS: usize = 1024;

/// One logged-in browser.
#[derive(Debug)]
pub(crate) struct Session {
    /// The CSRF token its forms carry.
    pub(crate) csrf: String,
    /// The SHA-256 of its id.
    key: [u8; 32],
    started: Instant,
}

/// The table of sessions.
#[derive(Default)]
pub(super) struct Sessions {
    by_key: Mutex<HashMap<[u8; 32], Arc<Session>>>,
}

fn key_of(id: &str) -> [u8; 32] {
    sha2::Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Arc<Session>>> {
        // Nothing panics under the lock; a poisoned one is whole.
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new session started at `now`, and its id for the cookie.
    pub(super) fn start(&self, now: Instant) -> (String, Arc<Session>) {
        let id = hex(&rand::random::<[u8; 32]>());
        let session = Arc::new(Session {
            csrf: hex(&rand::random::<[u8; 32]>()),
            key: key_of(&id),
            started: now,
        });
        let mut table = self.lock();
        table.retain(|_, s| now.duration_since(s.started) <= SESSION_LIFETIME);
        if table.len() >= MAX_SESSIONS {
            if let Some(oldest) = table.values().min_by_key(|s| s.started).map(|s| s.key) {
                table.remove(&oldest);
            }
        }
        table.insert(session.key, session.clone());
        (id, session)
    }

    /// The session of cookie value `id`, if it is open and younger than
    /// [`SESSION_LIFETIME`] at `now`.
    pub(super) fn find(&self, id: &str, now: Instant) -> Option<Arc<Session>> {
        let key = key_of(id);
        let mut table = self.lock();
        let session = table.get(&key)?;
        if now.duration_since(session.started) > SESSION_LIFETIME {
            table.remove(&key);
            return None;
        }
        Some(session.clone())
    }

    /// Ends `session`: its cookie opens nothing from now on.
    pub(super) fn end(&self, session: &Session) {
        self.lock().remove(&session.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_on_logout_and_after_its_lifetime() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, session) = sessions.start(t0);
        assert_eq!(id.len(), 64);
        let found = sessions.find(&id, t0 + SESSION_LIFETIME).unwrap();
        assert_eq!(found.csrf, session.csrf);
        let second = Duration::from_secs(1);
        assert!(sessions.find(&id, t0 + SESSION_LIFETIME + second).is_none());
        let (id, session) = sessions.start(t0);
        let (other, _) = sessions.start(t0);
        sessions.end(&session);
        assert!(sessions.find(&id, t0).is_none(), "logged out");
        assert!(sessions.find(&other, t0).is_some(), "another goes on");
        for unknown in ["", "00", &"0".repeat(64)] {
            assert!(sessions.find(unknown, t0).is_none(), "{unknown}");
        }
    }

    #[test]
    fn each_session_has_its_own_csrf_token_and_the_table_is_bounded() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (first, a) = sessions.start(t0);
        let (_, b) = sessions.start(t0);
        assert_ne!(a.csrf, b.csrf);
        for i in 0..MAX_SESSIONS {
            sessions.start(t0 + Duration::from_millis(1 + i as u64));
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(sessions.find(&first, t0).is_none(), "the oldest ended");
    }
}
