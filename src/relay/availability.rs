//! Whether a consumer's destination answers, and the pause while it does
//! not: the workers hand a paused consumer one event at a time (the probe),
//! on a back-off that doubles with each probe found unavailable, and hold
//! the rest without running the consumer; one probe that gets an answer
//! resumes it, and the writer then makes the held events due again.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::consumer::Outcome;
use crate::relay::RetryPolicy;

/// The most held rows remembered per consumer for an early release on
/// resumption; rows beyond it come back at their own time (after the
/// policy's `max_delay`, docs/relay.md).
const MAX_HELD: usize = 1 << 20;

/// One consumer's destination, shared by the workers (which run the
/// probes) and the writer (which holds and releases rows).
#[derive(Debug, Default)]
pub(crate) struct Availability {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Probes in a row found unavailable; 0 while it answers.
    rounds: u32,
    /// When the pause began.
    since: Option<Instant>,
    /// When the next probe may go.
    next_probe: Option<Instant>,
    /// A probe is out.
    probing: bool,
    /// Why it is paused, for the deliveries it holds.
    reason: String,
    /// The one held row due at the next probe (the others wait longer):
    /// there is always one while it is paused, and never a crowd.
    probe_row: Option<i64>,
    /// Rows held while paused, to be made due when it resumes.
    held: VecDeque<i64>,
    /// It resumed and `held` is to be released.
    resumed: bool,
}

/// What an outcome changed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    /// The destination just became unavailable: the consumer is paused.
    Paused,
    /// It answered again after being unavailable this long.
    Resumed(Duration),
}

impl Availability {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// Whether a worker runs the consumer for a delivery now: None while it
    /// is available, or for the one probe due; otherwise why it is held.
    pub(crate) fn admit(&self, now: Instant) -> Option<String> {
        self.with(|s| {
            if s.rounds == 0 || (!s.probing && s.next_probe.is_none_or(|at| at <= now)) {
                if s.rounds > 0 {
                    s.probing = true;
                    s.probe_row = None;
                }
                return None;
            }
            Some(format!("paused, waiting for the next probe: {}", s.reason))
        })
    }

    /// Takes the outcome of a delivery the consumer ran. An unavailable
    /// outcome pauses it (or backs its probes off); any other, an answer,
    /// resumes it.
    pub(crate) fn observe(&self, outcome: &Outcome, policy: &RetryPolicy, now: Instant) -> Change {
        self.with(|s| match outcome {
            Outcome::Unavailable { reason, after } => {
                s.rounds = s.rounds.saturating_add(1);
                let wait = policy
                    .probe_after(s.rounds)
                    .max(after.unwrap_or_default().min(policy.retry_after_cap()));
                s.next_probe = Some(now + wait);
                s.probing = false;
                s.reason.clone_from(reason);
                match s.since {
                    Some(_) => Change::None,
                    None => {
                        s.since = Some(now);
                        Change::Paused
                    }
                }
            }
            _ => match s.since.take() {
                Some(since) => {
                    let held = std::mem::take(&mut s.held);
                    *s = State {
                        held,
                        resumed: true,
                        ..State::default()
                    };
                    Change::Resumed(now.saturating_duration_since(since))
                }
                None => Change::None,
            },
        })
    }

    /// How long it has been paused; None while it answers.
    pub(crate) fn unavailable_for(&self, now: Instant) -> Option<Duration> {
        self.with(|s| s.since.map(|t| now.saturating_duration_since(t)))
    }

    /// Probes in a row found unavailable (0 while it answers).
    pub(crate) fn rounds(&self) -> u32 {
        self.with(|s| s.rounds)
    }

    /// The row whose delivery found the destination unavailable: it is
    /// due at the next probe.
    pub(crate) fn probe_with(&self, row_id: i64) {
        self.with(|s| s.probe_row = Some(row_id))
    }

    /// Holds a row the consumer was not run for: Some(the wait until the
    /// next probe) if it is to be the probe (none is due, or it is the one
    /// that is), otherwise None, and it is remembered for the resumption.
    pub(crate) fn hold(&self, row_id: i64, now: Instant) -> Option<Duration> {
        self.with(|s| {
            if s.probe_row.is_none_or(|r| r == row_id) {
                s.probe_row = Some(row_id);
                let at = s.next_probe.unwrap_or(now);
                return Some(at.saturating_duration_since(now));
            }
            push(&mut s.held, row_id);
            None
        })
    }

    /// The row held longest, taken out of the held rows: the next probe
    /// instead of the one that just failed, so that one event that always
    /// fails cannot keep the consumer paused.
    pub(crate) fn oldest_held(&self) -> Option<i64> {
        self.with(|s| s.held.pop_front())
    }

    /// Holds a row until the resumption (a probe that failed, replaced).
    pub(crate) fn hold_later(&self, row_id: i64) {
        self.with(|s| push(&mut s.held, row_id))
    }

    /// Up to `n` held rows to make due now that it has resumed.
    pub(crate) fn release(&self, n: usize) -> Vec<i64> {
        self.with(|s| {
            if !s.resumed {
                return Vec::new();
            }
            let out: Vec<i64> = s.held.drain(..n.min(s.held.len())).collect();
            s.resumed = !s.held.is_empty();
            out
        })
    }
}

fn push(held: &mut VecDeque<i64>, row_id: i64) {
    if held.len() < MAX_HELD {
        held.push_back(row_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_consumer_gets_one_probe_at_a_time_and_an_answer_resumes_it() {
        let a = Availability::default();
        let p = RetryPolicy::default();
        let t = Instant::now();
        assert_eq!(a.admit(t), None);
        let down = Outcome::unavailable("refused");
        assert_eq!(a.observe(&down, &p, t), Change::Paused);
        // Held until the probe is due; then one probe, not two.
        assert!(a.admit(t).is_some_and(|r| r.contains("refused")));
        let due = t + Duration::from_millis(500);
        assert_eq!(a.admit(due), None);
        assert!(a.admit(due).is_some());
        assert_eq!(a.observe(&down, &p, due), Change::None);
        assert_eq!(a.rounds(), 2);
        // The back-off doubled: 1 s after the second probe.
        assert!(a.admit(due + Duration::from_millis(999)).is_some());
        // The first row held is the next probe; the others wait.
        assert_eq!(a.hold(6, due), Some(Duration::from_secs(1)));
        assert_eq!((a.hold(7, due), a.hold(8, due)), (None, None));
        assert_eq!(a.hold(6, due), Some(Duration::from_secs(1)));
        assert_eq!(
            a.release(10),
            Vec::<i64>::new(),
            "nothing released while paused"
        );
        let up = due + Duration::from_secs(1);
        assert_eq!(a.admit(up), None);
        assert_eq!(
            a.observe(&Outcome::Delivered, &p, up),
            Change::Resumed(up - t)
        );
        assert_eq!((a.rounds(), a.admit(up)), (0, None));
        assert_eq!(a.release(1), vec![7]);
        assert_eq!(a.release(1), vec![8]);
        assert_eq!(a.release(1), Vec::<i64>::new());
    }
}
