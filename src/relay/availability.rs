//! Whether a consumer's destination answers, as its outcomes say: a run of
//! rounds in which it was unavailable and delivered nothing backs its
//! probes off; one delivery ends the run.

use std::sync::Mutex;

use crate::clock::Timestamp;

/// One consumer's destination, shared by the writer (which records its
/// outcomes) and whoever reports on it.
#[derive(Debug, Default)]
pub(crate) struct Availability {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    /// Rounds in a row found unavailable; 0 while it answers.
    rounds: u32,
    /// When the current run began.
    since: Option<Timestamp>,
}

impl Availability {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// A delivery went through: the destination is up. True if it was
    /// unavailable until now.
    pub(crate) fn delivered(&self) -> bool {
        self.with(|s| std::mem::take(s).rounds > 0)
    }

    /// One more round found it unavailable; returns the rounds in a row,
    /// this one included.
    pub(crate) fn unavailable(&self, now: Timestamp) -> u32 {
        self.with(|s| {
            s.since.get_or_insert(now);
            s.rounds = s.rounds.saturating_add(1);
            s.rounds
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_ends_the_run_of_unavailable_rounds() {
        let a = Availability::default();
        let t = Timestamp::from_millis(5);
        assert_eq!(
            (a.unavailable(t), a.unavailable(Timestamp::from_millis(9))),
            (1, 2)
        );
        assert!(a.delivered());
        assert!(!a.delivered());
        assert_eq!(a.unavailable(t), 1);
    }
}
