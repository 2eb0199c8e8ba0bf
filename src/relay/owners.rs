//! The relay's part in [liveness](crate::liveness): its own lock file, its
//! view of the other members, and taking over the leases of those that
//! ended or stopped. A relay without a lock directory (an in-memory
//! database, a directory it cannot create) leases by the time rule alone,
//! as relays before it did.

use crate::relay::fenced;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::claim::Standing;
use crate::clock::Timestamp;
use crate::liveness::{lock_dir, Member, Peers, Verdict};

/// One relay's member and peers.
#[derive(Debug)]
pub(crate) struct Owners {
    member: Member,
    peers: Peers,
    lease: Duration,
}

impl Owners {
    /// Joins the lock directory of the database at `db`; None (said at
    /// WARN) when there is none to join.
    pub(crate) fn join(db: &Path, lease: Duration) -> Option<Owners> {
        let joined = lock_dir(db).and_then(|dir| match dir {
            Some(dir) => Member::join(&dir, lease).map(Some),
            None => Ok(None),
        });
        match joined {
            Ok(Some(member)) => Some(Owners {
                peers: Peers::new(member.dir().to_owned(), member.name()),
                member,
                lease,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot hold a lock file beside the database; this relay's leases end by \
                     the clock alone, as an older relay's do (docs/liveness.md)"
                );
                None
            }
        }
    }

    /// A new claim token that names this relay.
    pub(crate) fn token(&self) -> String {
        self.member.token()
    }

    /// Looks at the lock directory when a look is due: true when leases
    /// are to be taken over (the next write transaction does it).
    pub(crate) fn scan(&mut self, now: Instant) -> bool {
        self.peers.scan(self.lease, now)
    }

    /// How long from `at` until the next look at the lock directory.
    pub(crate) fn next_scan(&self, at: Instant) -> Duration {
        self.peers
            .next_scan()
            .map_or(Duration::ZERO, |n| n.saturating_duration_since(at))
    }

    /// Releases, in the caller's transaction, the rows of every member that
    /// ended or stopped beating. What was done is noted with [`taken`]
    /// once the transaction committed.
    ///
    /// [`taken`]: Owners::taken
    pub(crate) fn take_over(
        &mut self,
        conn: &Connection,
        now: Timestamp,
    ) -> rusqlite::Result<Vec<(String, bool)>> {
        let mut done = Vec::new();
        for owner in self.peers.to_take() {
            let rows = fenced::release_owner(conn, &owner, now)?;
            let verdict = self.peers.judge(&owner, self.lease, Instant::now());
            if rows > 0 {
                match verdict {
                    Verdict::Hung => tracing::warn!(
                        rows,
                        owner = %owner,
                        "taking over the leases of a relay or sender that holds its lock but has \
                         not beaten for ten leases (stopped or hung): its deliveries in flight \
                         may be made again"
                    ),
                    _ => tracing::info!(
                        rows,
                        owner = %owner,
                        "taking over the leases of a relay or sender that ended"
                    ),
                }
            }
            let named = crate::intents::claimed_by(conn, &owner)?;
            done.push((owner, !named));
        }
        Ok(done)
    }

    /// Notes the takeovers of a committed transaction; the lock files of
    /// members that ended and that nothing names any more are removed.
    pub(crate) fn taken(&mut self, done: &[(String, bool)]) {
        for (owner, removable) in done {
            self.peers.taken(owner, *removable);
        }
    }

    /// Ends this relay's membership; `clean` when no row names it (every
    /// claim was finished or released), which removes its lock file.
    pub(crate) fn leave(self, clean: bool) {
        if clean {
            self.member.leave();
        }
    }
}

impl Standing for Owners {
    fn live(&self) -> Vec<String> {
        self.peers.live()
    }

    fn may_take(&mut self, token: &str) -> bool {
        self.peers.judge_token(token, self.lease, Instant::now()) != Verdict::Live
    }
}
