//! The senders' part in [liveness](crate::liveness): each [`Intents`]
//! value (with its clones) is one member for each database it sends on,
//! made on its first claim there and held until the last clone is
//! dropped. A claim names its sender; another sender takes it only when
//! that sender ended (at once) or stopped beating for ten leases, never by
//! the clock. A claim that names no lock file (an older sender's) ends at
//! its end time, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::liveness::{lock_dir, Member, Peers, Verdict};

/// One sender's members, by database path (None where it has no lock
/// directory: it then claims by the time rule alone).
#[derive(Debug, Clone, Default)]
pub(super) struct Senders(Arc<Mutex<HashMap<String, Option<Site>>>>);

#[derive(Debug)]
struct Site {
    member: Member,
    peers: Peers,
}

impl Drop for Site {
    /// The last clone of the sender is dropped, so none of its sends runs:
    /// its file goes with it, so files do not gather where no relay sweeps
    /// them. A claim it left standing (a failed release) then ends at its
    /// end time, as an older sender's does.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.member.path());
    }
}

impl Senders {
    /// A claim token for `conn`'s database, and the verdict on the claim
    /// `held` (its token) that stands on the intent, if any.
    pub(super) fn token_and_verdict(
        &self,
        conn: &Connection,
        lease: Duration,
        held: Option<&str>,
    ) -> (String, Verdict) {
        let path = conn.path().unwrap_or_default().to_owned();
        let mut sites = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let site = sites
            .entry(path)
            .or_insert_with_key(|path| join(path, lease));
        match site {
            Some(s) => {
                let verdict = held.map_or(Verdict::Unknown, |t| {
                    s.peers.judge_token(t, lease, Instant::now())
                });
                (s.member.token(), verdict)
            }
            None => (ulid::Ulid::generate().to_string(), Verdict::Unknown),
        }
    }
}

fn join(path: &str, lease: Duration) -> Option<Site> {
    let joined = lock_dir(std::path::Path::new(path)).and_then(|dir| match dir {
        Some(dir) => Member::join(&dir, lease).map(Some),
        None => Ok(None),
    });
    match joined {
        Ok(Some(member)) => Some(Site {
            peers: Peers::new(member.dir().to_owned(), member.name()),
            member,
        }),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot hold a lock file beside the database; this sender's claims end by the \
                 clock alone, as an older sender's do (docs/liveness.md)"
            );
            None
        }
    }
}
