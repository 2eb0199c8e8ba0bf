//! The writer's planner: whether a write transaction is worth making now,
//! and what goes into it (how many rows to claim, how many outcomes to
//! record, whether leases need a heartbeat), plus how long to wait when it
//! is not. Pure decisions over counts and times; the writer does the I/O.
//!
//! The rules, each for a reason:
//!
//! - **Claim** only while accepting work, when something may be due (a
//!   notify, another connection's commit, a known due time), and when at
//!   most half the capacity is in flight, so one transaction claims a
//!   worthwhile batch instead of a row at a time. Never more than the jobs
//!   channel holds, so handing jobs out never blocks.
//! - **Bytes.** The payloads of the deliveries in flight (claimed, not yet
//!   reported) stay within the byte budget: a claim takes rows only while
//!   their payloads fit in what the budget has left, and none while it is
//!   spent, except that a relay with nothing in flight always takes at
//!   least one row, however large (up to the payload maximum), so no row is
//!   stuck behind the budget. Memory held for payloads is thus at most
//!   the budget or one row.
//! - **Record** outcomes when they are many (half a batch), when every
//!   delivery in flight has finished, when the oldest has waited the flush
//!   interval, or at shutdown: group commit without holding results back.
//! - **Heartbeat** a lease once half of it has run out, by the wall clock or
//!   by the monotonic one (whichever comes first: a step of the wall clock
//!   back must not leave a lease ending far away).
//! - **Contention.** SQLite has one writer. While another connection writes
//!   (seen through `data_version`), transactions carry at most
//!   [`CONTENDED_GROUP`] claims or outcomes, and after a full-sized one the
//!   writer leaves the lock free for [`CONTENDED_PAUSE`], so a host's commit
//!   waits for one short transaction, not a train of them.
//! - **Errors.** After a failed transaction the writer waits: briefly after
//!   SQLITE_BUSY (never an event failure), doubling up to
//!   [`MAX_ERROR_BACKOFF`] after anything else.

use std::time::{Duration, Instant};

use crate::clock::Timestamp;

/// Longest pause after a failed write transaction.
pub(crate) const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);
/// The pause after a transaction that failed with SQLITE_BUSY.
const BUSY_BACKOFF: Duration = Duration::from_millis(10);
/// The first pause after a transaction that failed otherwise.
const MIN_ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// While other connections are writing, the relay's write transactions
/// carry at most this many claims and this many outcomes...
pub(crate) const CONTENDED_GROUP: usize = 16;
/// ...and after a full one the writer leaves the lock free this long.
pub(crate) const CONTENDED_PAUSE: Duration = Duration::from_millis(1);
/// How long after another connection's commit the writer stays polite.
const CONTENTION_WINDOW: Duration = Duration::from_millis(200);

/// The relay's settings the planner needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// The most rows in flight (the jobs channel's capacity).
    pub capacity: usize,
    /// The longest an outcome waits to be recorded.
    pub flush_interval: Duration,
    /// The lease of a claim.
    pub lease: Duration,
    /// The most payload bytes in flight.
    pub batch_bytes: u64,
}

/// The writer's state, as the planner sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    /// Outcomes received and not yet recorded.
    pub pending: usize,
    /// Rows claimed and not yet finished or released (their outcomes may be pending).
    pub in_flight: usize,
    /// Rows waiting to be released.
    pub to_release: usize,
    /// Something may be due now (a notify, another connection's commit, a
    /// full claim last time, a finished row that may unblock its ordering key).
    pub want_claim: bool,
    /// The next known time a row becomes due.
    pub next_due: Option<Timestamp>,
    /// The earliest lease among the rows in flight.
    pub earliest_lease: Option<Timestamp>,
    /// The earliest monotonic renewal among the rows in flight.
    pub earliest_renewal: Option<Instant>,
    /// The writer can hand out jobs (not shutting down).
    pub accepting: bool,
    /// The relay is shutting down: record everything at once.
    pub shutting_down: bool,
    /// Payload bytes of the deliveries claimed and not yet reported.
    pub bytes_in_flight: u64,
}

/// One write transaction's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Rows to claim (0: none).
    pub claim: usize,
    /// The payload bytes those rows may carry in all...
    pub claim_bytes: u64,
    /// ...except that the first row is taken whatever its size.
    pub claim_one_anyway: bool,
    /// Outcomes to record, the oldest first (0: none).
    pub record: usize,
    /// Extend the leases whose half has run out ([`heartbeat_due`]).
    pub heartbeat: bool,
    /// The size limit of this transaction (smaller under contention).
    pub group: usize,
    /// Another connection has written recently.
    pub contended: bool,
}

impl Plan {
    /// A transaction that records `n` outcomes (and releases what it is
    /// given) and nothing else: no claim, no heartbeat.
    pub(crate) fn record_only(n: usize) -> Plan {
        Plan {
            claim: 0,
            claim_bytes: 0,
            claim_one_anyway: false,
            record: n,
            heartbeat: false,
            group: n.max(1),
            contended: false,
        }
    }
}

/// True when a lease ending at `lease_until` needs its heartbeat: half of
/// a `lease` has run out by `now`.
pub(crate) fn heartbeat_due(lease_until: Timestamp, now: Timestamp, lease: Duration) -> bool {
    // A lease longer than a Timestamp can reach ended at Timestamp::MAX:
    // halve the lease as it was held, or a huge one would look half spent.
    let held = lease.min(Duration::from_millis(i64::MAX as u64));
    lease_until.since(now) <= held / 2
}

/// The planner's own memory: when outcomes started waiting, when the last
/// foreign write was seen, and any pause before the next transaction.
#[derive(Debug)]
pub(crate) struct Planner {
    limits: Limits,
    pending_since: Option<Instant>,
    last_foreign_write: Option<Instant>,
    not_before: Option<Instant>,
    error_backoff: Duration,
    /// A claim ran out of memory: none is planned before this, so that the
    /// transactions meanwhile record outcomes (a failed claim takes the
    /// outcomes of its transaction down with it).
    claims_after: Option<Instant>,
}

impl Planner {
    pub(crate) fn new(limits: Limits) -> Planner {
        Planner {
            limits,
            pending_since: None,
            last_foreign_write: None,
            not_before: None,
            error_backoff: Duration::ZERO,
            claims_after: None,
        }
    }

    /// Outcomes arrived while none were pending: they start the flush clock.
    pub(crate) fn outcomes_waiting(&mut self, at: Instant) {
        self.pending_since.get_or_insert(at);
    }

    /// Another connection committed (`data_version` moved).
    pub(crate) fn foreign_write(&mut self, at: Instant) {
        self.last_foreign_write = Some(at);
    }

    /// What to write now; None when nothing is worth a transaction (or a
    /// pause is still running).
    pub(crate) fn plan(&self, load: &Load, now: Timestamp, at: Instant) -> Option<Plan> {
        if self.not_before.is_some_and(|t| at < t) {
            return None;
        }
        let l = &self.limits;
        let contended = self
            .last_foreign_write
            .is_some_and(|t| at.saturating_duration_since(t) < CONTENTION_WINDOW);
        let group = if contended {
            CONTENDED_GROUP.min(l.batch_size)
        } else {
            l.batch_size
        };
        let settled = load.pending + load.to_release;
        let live = load.in_flight.saturating_sub(settled);
        let due = load.want_claim || load.next_due.is_some_and(|t| t <= now);
        let nothing_held = load.bytes_in_flight == 0;
        let bytes_left = l.batch_bytes.saturating_sub(load.bytes_in_flight);
        let claim = if load.accepting
            && due
            && self.claims_after.is_none_or(|t| at >= t)
            && live <= l.capacity / 2
            && (bytes_left > 0 || nothing_held)
        {
            (l.capacity - live).min(group)
        } else {
            0
        };
        let pending_age = self.pending_since.map(|t| at.saturating_duration_since(t));
        let flush = load.pending > 0
            && (load.shutting_down
                || load.pending >= (l.capacity / 2).min(group)
                || load.pending >= load.in_flight
                || pending_age.is_some_and(|a| a >= l.flush_interval));
        let record = match (flush, contended) {
            (false, _) => 0,
            (true, true) => group.min(load.pending),
            (true, false) => load.pending,
        };
        // Half the lease by the wall clock, or by the monotonic one (a step
        // of the wall clock back must not leave the lease ending far away).
        let heartbeat = load
            .earliest_lease
            .is_some_and(|t| heartbeat_due(t, now, l.lease))
            || load.earliest_renewal.is_some_and(|t| t <= at);
        if claim == 0 && record == 0 && !heartbeat && load.to_release == 0 {
            return None;
        }
        Some(Plan {
            claim,
            claim_bytes: bytes_left,
            claim_one_anyway: nothing_held,
            record,
            heartbeat,
            group,
            contended,
        })
    }

    /// A planned transaction committed, having claimed `claimed` rows;
    /// `pending_left` outcomes still wait.
    pub(crate) fn committed(
        &mut self,
        plan: &Plan,
        claimed: usize,
        pending_left: usize,
        at: Instant,
    ) {
        // A transaction that left out a paused claim says nothing of the
        // claim: its backoff goes on growing until a claim commits.
        if plan.claim > 0 || self.claims_after.is_none() {
            self.error_backoff = Duration::ZERO;
            self.claims_after = None;
        }
        // Pause only after a full-sized transaction: that is a relay working
        // through a backlog, which would otherwise take the lock back at
        // once. Small ones (an event now and then) are short already, and a
        // pause would only add latency.
        let full = claimed >= plan.group || plan.record >= plan.group;
        self.not_before = (plan.contended && full).then(|| at + CONTENDED_PAUSE);
        if plan.record > 0 && pending_left == 0 {
            self.pending_since = None;
        }
    }

    /// A planned transaction failed; nothing of it was recorded. Returns
    /// the pause before the next try.
    pub(crate) fn failed(&mut self, busy: bool, at: Instant) -> Duration {
        self.error_backoff = if busy {
            BUSY_BACKOFF
        } else {
            (self.error_backoff * 2).clamp(MIN_ERROR_BACKOFF, MAX_ERROR_BACKOFF)
        };
        self.not_before = Some(at + self.error_backoff);
        self.error_backoff
    }

    /// The transaction that just [`failed`](Self::failed) ran out of
    /// memory in its claim: the next one records without claiming, and
    /// claims come back after twice the pause, each time the claim fails
    /// again backing off further (a payload SQLite cannot rewrite in the
    /// memory left would otherwise keep every outcome unrecorded).
    pub(crate) fn claim_out_of_memory(&mut self, at: Instant) {
        self.claims_after = Some(at + 2 * self.error_backoff);
    }

    /// How long the writer may sleep before it must look again: at most the
    /// poll interval, no longer than the oldest outcome may wait or than the
    /// shutdown deadline, and at least any pause that is running.
    pub(crate) fn wait(
        &self,
        poll_interval: Duration,
        deadline: Option<Instant>,
        at: Instant,
    ) -> Duration {
        let mut wait = poll_interval;
        if let Some(since) = self.pending_since {
            let age = at.saturating_duration_since(since);
            wait = wait.min(self.limits.flush_interval.saturating_sub(age));
        }
        if let Some(nb) = self.not_before {
            wait = wait.max(nb.saturating_duration_since(at));
        }
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(at));
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);
    const LIMITS: Limits = Limits {
        batch_size: 256,
        capacity: 256,
        flush_interval: Duration::from_millis(2),
        lease: Duration::from_secs(30),
        batch_bytes: 1 << 20,
    };

    fn idle() -> Load {
        Load {
            accepting: true,
            ..Load::default()
        }
    }

    #[test]
    fn an_idle_writer_with_nothing_due_does_not_write() {
        let p = Planner::new(LIMITS);
        let at = Instant::now();
        assert_eq!(p.plan(&idle(), NOW, at), None);
        let later = Load {
            next_due: Some(NOW.plus(Duration::from_secs(1))),
            ..idle()
        };
        assert_eq!(p.plan(&later, NOW, at), None, "due later is not due now");
    }

    #[test]
    fn claims_a_batch_when_something_is_due_and_capacity_is_free() {
        let p = Planner::new(LIMITS);
        let at = Instant::now();
        let due = Load {
            next_due: Some(NOW),
            ..idle()
        };
        let plan = p.plan(&due, NOW, at).unwrap();
        assert_eq!((plan.claim, plan.record, plan.heartbeat), (256, 0, false));
        // With 100 live rows in flight it claims only what the channel holds.
        let busy = Load {
            want_claim: true,
            in_flight: 100,
            ..idle()
        };
        assert_eq!(p.plan(&busy, NOW, at).unwrap().claim, 156);
        // More than half the capacity live: wait for outcomes instead.
        let full = Load {
            in_flight: 129,
            ..busy
        };
        assert_eq!(p.plan(&full, NOW, at), None);
        // The byte budget: what is left of it, and nothing while it is spent
        // (unless nothing is held at all: then one row, whatever its size).
        let heavy = Load {
            bytes_in_flight: 1000,
            ..busy
        };
        let plan = p.plan(&heavy, NOW, at).unwrap();
        assert_eq!(
            (plan.claim_bytes, plan.claim_one_anyway),
            ((1 << 20) - 1000, false)
        );
        let spent = Load {
            bytes_in_flight: 1 << 20,
            ..busy
        };
        assert_eq!(p.plan(&spent, NOW, at), None);
        let plan = p.plan(&due, NOW, at).unwrap();
        assert_eq!((plan.claim_bytes, plan.claim_one_anyway), (1 << 20, true));
        // Shutting down (not accepting): no claim at all.
        let closing = Load {
            accepting: false,
            ..busy
        };
        assert_eq!(p.plan(&closing, NOW, at), None);
    }

    #[test]
    fn records_outcomes_when_all_are_back_when_many_or_when_old() {
        let mut p = Planner::new(LIMITS);
        let t0 = Instant::now();
        p.outcomes_waiting(t0);
        let some = Load {
            pending: 3,
            in_flight: 10,
            ..idle()
        };
        assert_eq!(p.plan(&some, NOW, t0), None, "7 deliveries still running");
        let all_back = Load {
            in_flight: 3,
            ..some
        };
        assert_eq!(p.plan(&all_back, NOW, t0).unwrap().record, 3);
        let many = Load {
            pending: 128,
            in_flight: 200,
            ..idle()
        };
        assert_eq!(p.plan(&many, NOW, t0).unwrap().record, 128);
        let old = t0 + LIMITS.flush_interval;
        assert_eq!(p.plan(&some, NOW, old).unwrap().record, 3);
        let closing = Load {
            accepting: false,
            shutting_down: true,
            ..some
        };
        assert_eq!(p.plan(&closing, NOW, t0).unwrap().record, 3);
        // The oldest outcome bounds the sleep.
        assert_eq!(
            p.wait(Duration::from_millis(5), None, t0),
            LIMITS.flush_interval
        );
    }

    #[test]
    fn heartbeats_once_half_the_earliest_lease_has_run_out() {
        let p = Planner::new(LIMITS);
        let at = Instant::now();
        let leased = |secs| Load {
            in_flight: 1,
            earliest_lease: Some(NOW.plus(Duration::from_secs(secs))),
            ..idle()
        };
        assert_eq!(p.plan(&leased(16), NOW, at), None);
        assert!(p.plan(&leased(15), NOW, at).unwrap().heartbeat);
        assert!(
            heartbeat_due(NOW, NOW.plus(Duration::from_secs(1)), LIMITS.lease),
            "expired"
        );
        // A huge lease never overflows the arithmetic.
        assert!(!heartbeat_due(Timestamp::MAX, NOW, Duration::MAX));
    }

    #[test]
    fn under_contention_transactions_shrink_and_pause_after_a_full_one() {
        let mut p = Planner::new(LIMITS);
        let t0 = Instant::now();
        p.foreign_write(t0);
        let load = Load {
            want_claim: true,
            pending: 40,
            in_flight: 40,
            ..idle()
        };
        let plan = p.plan(&load, NOW, t0).unwrap();
        assert_eq!(
            (plan.claim, plan.record, plan.group),
            (16, 16, CONTENDED_GROUP)
        );
        p.committed(&plan, 16, 24, t0);
        assert_eq!(
            p.plan(&load, NOW, t0),
            None,
            "the lock is left free a moment"
        );
        assert_eq!(p.wait(Duration::ZERO, None, t0), CONTENDED_PAUSE);
        assert!(p.plan(&load, NOW, t0 + CONTENDED_PAUSE).is_some());
        // Long after the other writer stopped, whole batches again.
        let calm = t0 + CONTENTION_WINDOW;
        let plan = p.plan(&load, NOW, calm).unwrap();
        assert_eq!(
            (plan.claim, plan.record),
            (256, 40),
            "every outcome is back: 0 live"
        );
        p.committed(&plan, 0, 0, calm);
        assert_eq!(
            p.wait(Duration::from_millis(5), None, calm),
            Duration::from_millis(5)
        );
    }

    #[test]
    fn failures_back_off_briefly_when_busy_and_doubling_otherwise() {
        let mut p = Planner::new(LIMITS);
        let t0 = Instant::now();
        assert_eq!(p.failed(true, t0), BUSY_BACKOFF);
        assert_eq!(p.failed(false, t0), MIN_ERROR_BACKOFF);
        assert_eq!(p.failed(false, t0), MIN_ERROR_BACKOFF * 2);
        for _ in 0..10 {
            p.failed(false, t0);
        }
        assert_eq!(p.failed(false, t0), MAX_ERROR_BACKOFF);
        let due = Load {
            want_claim: true,
            ..idle()
        };
        assert_eq!(p.plan(&due, NOW, t0), None, "no write during the pause");
        let deadline = t0 + Duration::from_millis(1);
        assert_eq!(
            p.wait(Duration::from_millis(5), Some(deadline), t0),
            Duration::from_millis(1),
            "a shutdown deadline cuts any sleep short"
        );
        let plan = p.plan(&due, NOW, t0 + MAX_ERROR_BACKOFF).unwrap();
        p.committed(&plan, 1, 0, t0 + MAX_ERROR_BACKOFF);
        assert_eq!(
            p.failed(false, t0),
            MIN_ERROR_BACKOFF,
            "a success resets it"
        );
    }

    /// Issue 30.4: a claim out of memory failed its whole transaction, the
    /// outcomes in it too, and the next one claimed again: outcomes were
    /// never recorded. Now the next transaction records without claiming;
    /// claims come back after twice the pause, backing off further while
    /// they fail, and a claim that commits ends it.
    #[test]
    fn after_a_claim_out_of_memory_outcomes_are_recorded_before_the_next_claim() {
        let mut p = Planner::new(LIMITS);
        let t0 = Instant::now();
        let load = Load {
            want_claim: true,
            pending: 8,
            in_flight: 8,
            ..idle()
        };
        let first = p.plan(&load, NOW, t0).unwrap();
        assert!(first.claim > 0 && first.record == 8);
        let pause = p.failed(false, t0);
        p.claim_out_of_memory(t0);
        let next = p.plan(&load, NOW, t0 + pause).unwrap();
        assert_eq!((next.claim, next.record), (0, 8), "records, claims nothing");
        p.committed(&next, 0, 0, t0 + pause);
        let load = Load {
            pending: 0,
            in_flight: 0,
            ..load
        };
        assert_eq!(p.plan(&load, NOW, t0 + pause), None, "no claim yet");
        let again = p.plan(&load, NOW, t0 + 2 * pause).unwrap();
        assert!(again.claim > 0, "claims again after twice the pause");
        let longer = p.failed(false, t0 + 2 * pause);
        assert_eq!(longer, 2 * pause, "the pause went on growing");
        p.claim_out_of_memory(t0 + 2 * pause);
        assert_eq!(p.plan(&load, NOW, t0 + 2 * pause + longer), None);
        let claimed = p.plan(&load, NOW, t0 + 2 * pause + 2 * longer).unwrap();
        p.committed(&claimed, 1, 0, t0 + 2 * pause + 2 * longer);
        assert_eq!(p.failed(false, t0), MIN_ERROR_BACKOFF, "a claim reset it");
    }
}
