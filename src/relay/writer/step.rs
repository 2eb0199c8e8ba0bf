//! What one write transaction did ([`Step`]), and its application to the
//! writer's state once it has committed: the rows in flight, the wish to
//! claim again, the jobs handed to the workers, the counters.

use std::time::Instant;

use crossbeam_channel::Sender;

use super::in_flight::InFlight;
use super::note::Note;
use super::{Writer, MAX_GRACE};
use crate::clock::Timestamp;
use crate::relay::job::Job;
use crate::relay::metrics::{ConsumerResult, Metrics};

/// What one write transaction did, applied to the writer's state only after
/// it committed.
#[derive(Default)]
pub(super) struct Step {
    pub(super) claimed: Vec<(Job, InFlight)>,
    pub(super) finished_rows: Vec<i64>,
    pub(super) extended: Vec<(i64, Timestamp)>,
    pub(super) released: Vec<i64>,
    /// Claim again at once: the claim took all it asked for, or finished
    /// rows itself (a dead letter, a row whose consumers all had it), which
    /// may release rows it passed over: the next event of an ordering key,
    /// a later row of the same event id.
    pub(super) claim_again: bool,
    pub(super) next_due: Option<Timestamp>,
    pub(super) counts: Counts,
    /// Log lines about what the transaction decided, written once it committed.
    pub(super) notes: Vec<Note>,
}

#[derive(Default)]
pub(super) struct Counts {
    pub(super) delivered: u64,
    pub(super) retried: u64,
    pub(super) dead: u64,
    pub(super) fenced: u64,
    pub(super) claimed: u64,
    pub(super) claim_micros: u64,
    pub(super) per_consumer: Vec<(usize, ConsumerResult)>,
}

impl Writer {
    /// Applies a committed step to the in-memory state and hands out jobs.
    pub(super) fn apply(&mut self, step: Step, jobs: Option<&Sender<Job>>, claim_limit: usize) {
        for note in &step.notes {
            note.log();
        }
        for id in step.finished_rows.iter().chain(&step.released) {
            if let Some(f) = self.in_flight.remove(id) {
                self.bytes_in_flight = self.bytes_in_flight.saturating_sub(f.bytes);
            }
        }
        let renew_at = Instant::now() + self.settings.lease / 2;
        for (id, until) in step.extended {
            if let Some(f) = self.in_flight.get_mut(&id) {
                f.lease_until = until;
                // A lost lease is not renewed again.
                f.renew_at = if until == Timestamp::MAX {
                    Instant::now() + MAX_GRACE
                } else {
                    renew_at
                };
            }
        }
        if !step.finished_rows.is_empty() || !step.released.is_empty() {
            // A finished row may unblock the next event of its ordering key.
            self.want_claim = true;
        }
        if claim_limit > 0 {
            self.want_claim = step.claim_again;
            self.next_due = step.next_due;
        } else if let Some(t) = step.next_due {
            self.next_due = Some(self.next_due.map_or(t, |d| d.min(t)));
        }
        for (job, flight) in step.claimed {
            let id = job.row_id;
            let token = flight.token.clone();
            self.bytes_in_flight += flight.bytes;
            self.in_flight.insert(id, flight);
            let sent = jobs.is_some_and(|tx| tx.try_send(job).is_ok());
            if !sent {
                // Cannot happen while claims stay within capacity; give the
                // row back rather than lose track of it.
                self.to_release.push((id, token));
            }
        }
        self.earliest_lease = self.in_flight.values().map(|f| f.lease_until).min();
        self.earliest_renewal = self.in_flight.values().map(|f| f.renew_at).min();
        let c = step.counts;
        let m = &self.metrics;
        Metrics::add(&m.delivered, c.delivered);
        Metrics::add(&m.retried, c.retried);
        Metrics::add(&m.dead_lettered, c.dead);
        Metrics::add(&m.fenced_out, c.fenced);
        Metrics::add(&m.claimed, c.claimed);
        Metrics::add(&m.claim_micros_total, c.claim_micros);
        for (consumer, result) in c.per_consumer {
            m.count_result(consumer, result);
        }
    }
}
