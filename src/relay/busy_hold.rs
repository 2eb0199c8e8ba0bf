//! Fewer, fuller write transactions while a host is busy writing.
//!
//! Under SQLite's deferred transactions (Django's default), a host's
//! transaction that read and then writes fails at once with "database is
//! locked" when another connection committed since its read: each relay
//! commit is one more such race. In the second after the relay waited for
//! another connection's write lock past the busy handler's quick tries (a
//! host holding the lock longer than a short commit; see
//! `connection::long_busy_waits`), or failed with SQLITE_BUSY, the
//! [planner](super::plan) holds a transaction that would only record
//! outcomes for up to `busy_batch_wait`, so that the next claim (and the
//! outcomes arriving meanwhile) go into that one transaction: one commit
//! where there were two. Claims are never held, but a claim that comes
//! during a hold carries the outcomes' writes before its commit. A
//! producer's short commits in the relay's way start no hold.

use std::time::{Duration, Instant};

/// How long after a busy lock the relay stays patient.
pub(crate) const BUSY_MEMORY: Duration = Duration::from_secs(1);

/// The hold's state: when the relay last waited long for a lock, and the end of
/// the hold running, if one is.
#[derive(Debug)]
pub(crate) struct BusyHold {
    wait: Duration,
    busy_at: Option<Instant>,
    until: Option<Instant>,
}

impl BusyHold {
    /// A hold of at most `wait` (zero: never).
    pub(crate) fn new(wait: Duration) -> BusyHold {
        BusyHold {
            wait,
            busy_at: None,
            until: None,
        }
    }

    /// The relay's write waited long for another connection's lock at `at`.
    pub(crate) fn met_busy(&mut self, at: Instant) {
        self.busy_at = Some(at);
    }

    /// Whether a transaction that could be written at `at` waits: true from
    /// the first ask after a recent busy lock until `wait` has passed.
    pub(crate) fn holds(&mut self, at: Instant) -> bool {
        let recent = self
            .busy_at
            .is_some_and(|t| at.saturating_duration_since(t) < BUSY_MEMORY);
        if self.wait.is_zero() || !recent {
            self.until = None;
            return false;
        }
        at < *self.until.get_or_insert(at + self.wait)
    }

    /// A transaction was made (or failed): the next one starts its own hold.
    pub(crate) fn ended(&mut self) {
        self.until = None;
    }

    /// Until when a hold running at `at` lasts.
    pub(crate) fn running(&self, at: Instant) -> Option<Instant> {
        self.until.filter(|u| at < *u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(3);

    #[test]
    fn holds_only_after_a_busy_lock_in_the_last_second() {
        let t0 = Instant::now();
        let mut h = BusyHold::new(WAIT);
        assert!(!h.holds(t0), "no busy lock met: no hold");
        h.met_busy(t0);
        assert!(h.holds(t0));
        assert_eq!(h.running(t0), Some(t0 + WAIT));
        assert!(h.holds(t0 + WAIT / 2), "the same hold, not a new one");
        assert!(!h.holds(t0 + WAIT), "it lasts `wait` at most");
        h.ended();
        assert!(h.holds(t0 + WAIT), "the next transaction waits too");
        h.ended();
        assert!(
            !h.holds(t0 + BUSY_MEMORY),
            "a second later: patient no more"
        );
        assert_eq!(h.running(t0 + BUSY_MEMORY), None);
        let mut off = BusyHold::new(Duration::ZERO);
        off.met_busy(t0);
        assert!(!off.holds(t0), "a zero wait turns it off");
    }
}
