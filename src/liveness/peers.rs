//! Judging the owners of leases: the claimer's side of the protocol.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::member::{beat_interval, RECORD_LEN};
use super::{lock_file, owner_of};

/// What a lease's owner is, as far as a claimer can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It holds its lock and beats: its leases stand, whatever the clocks say.
    Live,
    /// Its lock is free: it has ended, and its leases may be taken at once.
    Gone,
    /// It holds its lock but its heartbeat has not moved for ten leases of
    /// the claimer's monotonic clock (a stopped or hung process): its
    /// leases may be taken, the one repeat without a crash.
    Hung,
    /// No lock file names it (an older relay's token, a file removed): its
    /// leases end at their end time, as they always did.
    Unknown,
}

impl Verdict {
    /// True when the owner's leases may be taken now, whatever their end.
    pub(crate) fn takeable(self) -> bool {
        matches!(self, Verdict::Gone | Verdict::Hung)
    }
}

/// One owner as last seen.
#[derive(Debug)]
struct Seen {
    verdict: Verdict,
    judged: Instant,
    /// The heartbeat count and since when it has read so.
    beat: u64,
    since: Instant,
    /// True once this owner's leases were taken over (for its verdict).
    taken: bool,
}

/// A claimer's view of its peers in one lock directory.
#[derive(Debug)]
pub(crate) struct Peers {
    dir: PathBuf,
    me: String,
    seen: HashMap<String, Seen>,
    next_scan: Option<Instant>,
}

impl Peers {
    /// The peers of member `me` in `dir`.
    pub(crate) fn new(dir: PathBuf, me: &str) -> Peers {
        Peers {
            dir,
            me: me.to_owned(),
            seen: HashMap::new(),
            next_scan: None,
        }
    }

    /// The verdict on the owner of `token` for a claimer with lease
    /// `lease`: [`Verdict::Unknown`] for a token that names no member.
    pub(crate) fn judge_token(&mut self, token: &str, lease: Duration, now: Instant) -> Verdict {
        match owner_of(token) {
            Some(owner) => self.judge(owner, lease, now),
            None => Verdict::Unknown,
        }
    }

    /// The verdict on member `owner`, looked at again when the last look
    /// is older than a beat of `lease`. Gone and Unknown are for good: a
    /// name is never used twice.
    pub(crate) fn judge(&mut self, owner: &str, lease: Duration, now: Instant) -> Verdict {
        if owner == self.me {
            return Verdict::Live;
        }
        if let Some(s) = self.seen.get(owner) {
            let fresh = now.saturating_duration_since(s.judged) < beat_interval(lease);
            if fresh || matches!(s.verdict, Verdict::Gone | Verdict::Unknown) {
                return s.verdict;
            }
        }
        let look = look(&self.dir.join(lock_file(owner)));
        let s = self.seen.entry(owner.to_owned()).or_insert(Seen {
            verdict: Verdict::Live,
            judged: now,
            beat: 0,
            since: now,
            taken: false,
        });
        let verdict = match look {
            Look::Missing => Verdict::Unknown,
            Look::Free => Verdict::Gone,
            Look::Held {
                beat,
                lease: theirs,
            } => {
                if beat != s.beat {
                    (s.beat, s.since) = (beat, now);
                }
                let window = lease.max(theirs).saturating_mul(10);
                if now.saturating_duration_since(s.since) >= window {
                    Verdict::Hung
                } else {
                    Verdict::Live
                }
            }
            // Cannot tell (no permission, an I/O error): keep the owner's
            // leases, the safe side.
            Look::Unreadable => Verdict::Live,
        };
        if verdict != s.verdict {
            s.taken = false;
        }
        (s.verdict, s.judged) = (verdict, now);
        verdict
    }

    /// The members whose leases stand: this one and every peer last judged
    /// live. A claim passes over rows leased by these whatever their end.
    pub(crate) fn live(&self) -> Vec<String> {
        let others = self
            .seen
            .iter()
            .filter(|(_, s)| s.verdict == Verdict::Live)
            .map(|(n, _)| n.clone());
        std::iter::once(self.me.clone()).chain(others).collect()
    }

    /// Looks at every lock file in the directory, at most once a beat of
    /// `lease`; true when that found owners whose leases are to be taken
    /// over ([`to_take`](Self::to_take)).
    pub(crate) fn scan(&mut self, lease: Duration, now: Instant) -> bool {
        if self.next_scan.is_some_and(|at| now < at) {
            return false;
        }
        self.next_scan = Some(now + beat_interval(lease));
        let names: Vec<String> = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, dir = %self.dir.display(), "cannot list the lock directory");
                return false;
            }
        };
        // Live ones whose file went (removed by hand): judged again, so
        // their rows fall back to the time rule.
        let gone_files: Vec<String> = self
            .seen
            .iter()
            .filter(|(n, s)| s.verdict == Verdict::Live && !names.contains(&lock_file(n)))
            .map(|(n, _)| n.clone())
            .collect();
        for owner in gone_files {
            self.judge(&owner, lease, now);
        }
        for name in names {
            if let Some(owner) = name.strip_suffix(".lock") {
                if owner_of(&format!("{owner}:")).is_some() {
                    self.judge(owner, lease, now);
                }
            } else if let Some(owner) = name.strip_suffix(".new") {
                // Left by a process that died while it joined: no token
                // names it. A joining one holds it, or starts over.
                if matches!(look(&self.dir.join(&name)), Look::Free) && owner.len() == 26 {
                    let _ = std::fs::remove_file(self.dir.join(&name));
                }
            }
        }
        !self.to_take().is_empty()
    }

    /// When the next [`scan`](Self::scan) looks (None: at once).
    pub(crate) fn next_scan(&self) -> Option<Instant> {
        self.next_scan
    }

    /// The owners whose leases are to be taken over and were not yet.
    pub(crate) fn to_take(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|(_, s)| s.verdict.takeable() && !s.taken)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Notes that `owner`'s leases were taken over (committed). A gone
    /// owner's file is removed when `remove` (nothing names it any more).
    pub(crate) fn taken(&mut self, owner: &str, remove: bool) {
        if let Some(s) = self.seen.get_mut(owner) {
            s.taken = true;
            if remove && s.verdict == Verdict::Gone {
                let _ = std::fs::remove_file(self.dir.join(lock_file(owner)));
            }
        }
    }
}

/// What one look at a lock file found.
enum Look {
    Missing,
    Free,
    Held { beat: u64, lease: Duration },
    Unreadable,
}

/// Opens (read-only, close-on-exec) and tries the lock without waiting; the
/// lock, when it was free, goes with the file when this returns.
fn look(path: &std::path::Path) -> Look {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Look::Missing,
        Err(_) => return Look::Unreadable,
    };
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => return Look::Free,
        Err(rustix::io::Errno::WOULDBLOCK) => {}
        Err(_) => return Look::Unreadable,
    }
    let mut r = [0u8; RECORD_LEN];
    match file.read_exact_at(&mut r, 0) {
        Ok(()) => {
            let word = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
            Look::Held {
                beat: word(0),
                lease: Duration::from_millis(word(1)),
            }
        }
        Err(_) => Look::Unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Member;
    use super::*;

    #[test]
    fn a_live_member_is_live_until_it_ends_then_gone_at_once() {
        let d = tempfile::tempdir().unwrap();
        let lease = Duration::from_secs(30);
        let (a, b) = (
            Member::join(d.path(), lease).unwrap(),
            Member::join(d.path(), lease).unwrap(),
        );
        let mut peers = Peers::new(d.path().to_owned(), b.name());
        let t = Instant::now();
        assert_eq!(peers.judge(a.name(), lease, t), Verdict::Live);
        assert_eq!(peers.judge(b.name(), lease, t), Verdict::Live);
        assert!(!peers.scan(lease, t));
        assert_eq!(peers.live().len(), 2);
        let name = a.name().to_owned();
        drop(a);
        // Gone on the next look, however little time passed.
        assert_eq!(
            peers.judge(&name, lease, t + Duration::from_secs(1)),
            Verdict::Gone
        );
        assert_eq!(peers.to_take(), vec![name.clone()]);
        peers.taken(&name, true);
        assert!(peers.to_take().is_empty());
        assert!(!d.path().join(lock_file(&name)).exists());
        assert_eq!(
            peers.judge_token("01ARZ3NDEKTSV4RRFFQ69G5FAV", lease, t),
            Verdict::Unknown
        );
    }

    /// A live member's file removed by hand: its leases fall back to the
    /// time rule at the next look, rather than standing for good.
    #[test]
    fn a_live_member_whose_file_is_removed_is_judged_by_time() {
        let d = tempfile::tempdir().unwrap();
        let lease = Duration::from_secs(30);
        let a = Member::join(d.path(), lease).unwrap();
        let mut peers = Peers::new(d.path().to_owned(), "me");
        let t = Instant::now();
        assert!(!peers.scan(lease, t));
        assert_eq!(peers.live().len(), 2);
        std::fs::remove_file(d.path().join(lock_file(a.name()))).unwrap();
        assert!(!peers.scan(lease, t + Duration::from_secs(2)));
        assert_eq!(peers.live(), vec!["me".to_owned()]);
        assert_eq!(peers.judge(a.name(), lease, t), Verdict::Unknown);
    }

    #[test]
    fn a_held_lock_without_a_beat_is_hung_only_after_ten_leases() {
        let d = tempfile::tempdir().unwrap();
        let lease = Duration::from_secs(30);
        // A held lock file whose count never moves: a stopped process.
        let name = ulid::Ulid::generate().to_string();
        let file = std::fs::File::create(d.path().join(lock_file(&name))).unwrap();
        flock(&file, FlockOperation::NonBlockingLockExclusive).unwrap();
        file.write_all_at(&[0u8; RECORD_LEN], 0).unwrap();
        let mut peers = Peers::new(d.path().to_owned(), "me");
        let t = Instant::now();
        assert_eq!(peers.judge(&name, lease, t), Verdict::Live);
        let almost = t + lease * 10 - Duration::from_secs(1);
        assert_eq!(peers.judge(&name, lease, almost), Verdict::Live);
        assert_eq!(peers.judge(&name, lease, t + lease * 10), Verdict::Hung);
        // It beats again: live.
        file.write_all_at(&[1u8; RECORD_LEN], 0).unwrap();
        let later = t + lease * 11;
        assert_eq!(peers.judge(&name, lease, later), Verdict::Live);
    }
}
