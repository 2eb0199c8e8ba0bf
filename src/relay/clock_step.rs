//! When the system clock steps back. Leases and retry times are wall-clock
//! times written into the table: after the clock steps back by an hour, a
//! 30-second lease ends an hour and 30 seconds away, a retry due in a minute
//! is due in an hour and a minute, and an event committed a second before
//! the step is not due for an hour.
//!
//! What the relay does about it:
//!
//! - Its own claims are timed by the monotonic clock: it renews the leases
//!   of its deliveries every half lease of monotonic time (the writer), so
//!   they end a lease from the clock as it reads now, whatever it read
//!   before.
//! - It notices a step: [`ClockWatch`] compares how far the wall clock and
//!   the monotonic clock moved between two looks.
//! - When it has noticed one, and once when it starts (a step may have
//!   happened while no relay ran), [`Repair`] looks for times no setting
//!   could have produced with the clock as it reads now, and undoes them: a
//!   retry further ahead than this relay's longest retry wait is made due
//!   now (at worst a retry comes early); an event not delayed by its
//!   producer (`available_at` at or before its `created_at`) but created in
//!   the future is made due now; and a lease ending further ahead than
//!   [`MAX_LEASE`](super::MAX_LEASE) that stays unchanged for a lease of
//!   this relay's monotonic time, so that no live relay is renewing it, is
//!   ended (the next claim takes the row over, and the old token is fenced
//!   out). A lease whose token names a lock file is left to liveness
//!   (docs/liveness.md): its owner's lock, not its times, says whether it
//!   stands. A relay with a longer lease than this one renews less often:
//!   relays that share a database should share the lease.
//!
//! Delayed events keep their time: a producer that delayed an event to a
//! wall-clock time meant that time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

use crate::clock::Timestamp;
use crate::limits::CLOCK_STEP_SLACK;

/// Notices a step of the wall clock by comparing it with the monotonic one.
#[derive(Debug, Default)]
pub(crate) struct ClockWatch {
    last: Option<(Timestamp, Instant)>,
}

impl ClockWatch {
    /// Looks at both clocks; returns how far the wall clock stepped back
    /// since the last look, when that is more than [`CLOCK_STEP_SLACK`].
    pub(crate) fn stepped_back(&mut self, wall: Timestamp, mono: Instant) -> Option<Duration> {
        let last = self.last.replace((wall, mono));
        let (then_wall, then_mono) = last?;
        let moved = mono.saturating_duration_since(then_mono);
        let expected = then_wall.plus(moved);
        let back = expected.since(wall);
        (back > CLOCK_STEP_SLACK).then_some(back)
    }
}

/// What one [`Repair::run`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repaired {
    /// Retries made due now.
    pub retries: usize,
    /// Events created in the future (not delayed) made due now.
    pub created_ahead: usize,
    /// Leases ended.
    pub leases: usize,
}

impl Repaired {
    /// True when anything changed (rows may be due now).
    pub(crate) fn any(&self) -> bool {
        self.retries + self.created_ahead + self.leases > 0
    }
}

/// A far lease seen, and when first.
#[derive(Debug)]
struct Seen {
    token: String,
    lease_until: i64,
    since: Instant,
}

/// The rows a clock step left waiting, found and made due (see the module
/// doc).
#[derive(Debug)]
pub(crate) struct Repair {
    /// This relay's lease: how long a far lease must stay unchanged.
    lease: Duration,
    /// The furthest ahead any retry of this relay is scheduled.
    retry_horizon: Duration,
    /// Look at the next run (at start, and after a step).
    watching: bool,
    /// Far leases seen, by row id.
    seen: HashMap<i64, Seen>,
}

/// Far leases looked at per run.
const LEASE_WINDOW: usize = 1000;

impl Repair {
    /// A repair watching from the start.
    pub(crate) fn new(lease: Duration, retry_horizon: Duration) -> Repair {
        Repair {
            lease,
            retry_horizon,
            watching: true,
            seen: HashMap::new(),
        }
    }

    /// The clock stepped: look again at the next run.
    pub(crate) fn watch(&mut self) {
        self.watching = true;
    }

    /// True while there is something to look at.
    pub(crate) fn watching(&self) -> bool {
        self.watching
    }

    /// Looks for the rows a step left waiting and makes them due; `held`
    /// tells this relay's own deliveries (their leases are renewed by the
    /// writer). Keeps watching while far leases are being timed.
    pub(crate) fn run(
        &mut self,
        conn: &Connection,
        now: Timestamp,
        mono: Instant,
        held: impl Fn(i64) -> bool,
    ) -> rusqlite::Result<Repaired> {
        if !self.watching {
            return Ok(Repaired::default());
        }
        let mut done = Repaired {
            retries: due_now_retries(conn, now, self.retry_horizon + CLOCK_STEP_SLACK)?,
            created_ahead: due_now_created_ahead(conn, now)?,
            leases: 0,
        };
        let far = far_leases(conn, now, super::MAX_LEASE + CLOCK_STEP_SLACK)?;
        let mut seen = HashMap::with_capacity(far.len());
        for (row_id, token, lease_until) in far {
            // A lease that names its owner's lock file is judged by the
            // owner's liveness, never by times (crate::liveness).
            if held(row_id) || crate::liveness::owner_of(&token).is_some() {
                continue;
            }
            let since = match self.seen.remove(&row_id) {
                Some(s) if s.token == token && s.lease_until == lease_until => s.since,
                _ => mono,
            };
            if mono.saturating_duration_since(since) >= self.lease {
                if end_lease(conn, row_id, &token, lease_until, now)? {
                    done.leases += 1;
                }
            } else {
                seen.insert(
                    row_id,
                    Seen {
                        token,
                        lease_until,
                        since,
                    },
                );
            }
        }
        self.seen = seen;
        self.watching = !self.seen.is_empty();
        Ok(done)
    }
}

/// Makes due now the retries scheduled further ahead than `horizon`.
fn due_now_retries(
    conn: &Connection,
    now: Timestamp,
    horizon: Duration,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "UPDATE event_outbox SET available_at = ?1
          WHERE status = 'pending' AND available_at > ?2
            AND claim_token IS NULL AND attempts > 0",
    )?
    .execute(params![now.as_millis(), now.plus(horizon).as_millis()])
}

/// Makes due now the events that were due when created (not delayed by
/// their producer) but were created in the future.
fn due_now_created_ahead(conn: &Connection, now: Timestamp) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "UPDATE event_outbox SET available_at = ?1
          WHERE status = 'pending' AND available_at > ?2
            AND claim_token IS NULL AND attempts = 0 AND available_at <= created_at",
    )?
    .execute(params![
        now.as_millis(),
        now.plus(CLOCK_STEP_SLACK).as_millis()
    ])
}

/// Leases ending further than `max` ahead: (row id, token, lease end). A
/// leased row's `available_at` is its lease's end, so the due index finds
/// them.
fn far_leases(
    conn: &Connection,
    now: Timestamp,
    max: Duration,
) -> rusqlite::Result<Vec<(i64, String, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, claim_token, lease_until FROM event_outbox
          WHERE status = 'pending' AND available_at > ?1 AND claim_token IS NOT NULL
          ORDER BY available_at LIMIT ?2",
    )?;
    let rows = stmt.query_map(
        params![now.plus(max).as_millis(), LEASE_WINDOW as i64],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    rows.collect()
}

/// Ends a lease as it was seen (same token, same end): the row is due now
/// for the next claim, and the old token is fenced out by that claim's.
fn end_lease(
    conn: &Connection,
    row_id: i64,
    token: &str,
    lease_until: i64,
    now: Timestamp,
) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached(
            "UPDATE event_outbox SET lease_until = ?4, available_at = ?4
              WHERE id = ?1 AND claim_token = ?2 AND lease_until = ?3 AND status = 'pending'",
        )?
        .execute(params![row_id, token, lease_until, now.as_millis()])?
        == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_764_487_080_000;

    #[test]
    fn a_watch_sees_the_wall_clock_step_back_but_not_forward_or_drift() {
        let mut w = ClockWatch::default();
        let m0 = Instant::now();
        assert_eq!(w.stepped_back(Timestamp::from_millis(T0), m0), None);
        let m1 = m0 + Duration::from_secs(10);
        assert_eq!(
            w.stepped_back(Timestamp::from_millis(T0 + 10_500), m1),
            None
        );
        let m2 = m1 + Duration::from_secs(1);
        assert_eq!(
            w.stepped_back(Timestamp::from_millis(T0 + 11_500 - 3_600_000), m2),
            Some(Duration::from_secs(3600)),
        );
        let m3 = m2 + Duration::from_secs(1);
        assert_eq!(
            w.stepped_back(Timestamp::from_millis(T0 + 86_400_000), m3),
            None
        );
    }

    #[test]
    fn a_repair_makes_stepped_retries_and_events_due_and_ends_far_leases_unrenewed() {
        let (_dir, conn) = crate::schema::test_db();
        let now = Timestamp::from_millis(T0);
        let hour = 3_600_000;
        conn.execute_batch(&format!(
            "INSERT INTO event_outbox (id, event_type, attempts, available_at, created_at) VALUES
                 (1, 'a.b.v1', 2, {T0} + {hour}, {T0} - 5000),   -- a retry an hour ahead
                 (2, 'a.b.v1', 2, {T0} + 30000, {T0} - 5000),    -- a retry within the horizon
                 (3, 'a.b.v1', 0, {T0} + {hour}, {T0} + {hour}), -- created ahead, not delayed
                 (4, 'a.b.v1', 0, {T0} + 2 * {hour}, {T0} + {hour}); -- delayed by its producer
             INSERT INTO event_outbox (id, event_type, available_at, claim_token, lease_until) VALUES
                 (5, 'a.b.v1', {T0} + {hour}, 'dead-relay', {T0} + {hour}),
                 (6, 'a.b.v1', {T0} + {hour}, 'ours', {T0} + {hour}),
                 (7, 'a.b.v1', {T0} + 20000, 'live', {T0} + 20000);"
        ))
        .unwrap();
        let lease = Duration::from_secs(30);
        let mut r = Repair::new(lease, Duration::from_secs(60));
        let m0 = Instant::now();
        let done = r.run(&conn, now, m0, |id| id == 6).unwrap();
        assert_eq!((done.retries, done.created_ahead, done.leases), (1, 1, 0));
        assert!(r.watching(), "timing the far lease of row 5");
        let due = |id: i64| -> i64 {
            conn.query_row(
                "SELECT available_at FROM event_outbox WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(
            (due(1), due(2), due(3), due(4)),
            (T0, T0 + 30_000, T0, T0 + 2 * hour)
        );
        // Not yet a lease of monotonic time unchanged...
        let done = r.run(&conn, now, m0 + lease / 2, |id| id == 6).unwrap();
        assert_eq!(done.leases, 0);
        // ...and then: row 5's lease ends, ours and the live one stay.
        let done = r.run(&conn, now, m0 + lease, |id| id == 6).unwrap();
        assert_eq!(done.leases, 1);
        assert_eq!((due(5), due(6), due(7)), (T0, T0 + hour, T0 + 20_000));
        assert!(!r.watching());
        // A lease renewed in between is timed afresh.
        let mut r = Repair::new(lease, Duration::from_secs(60));
        r.run(&conn, now, m0, |_| false).unwrap(); // sees row 6
        conn.execute(
            "UPDATE event_outbox SET lease_until = lease_until + 1, available_at = available_at + 1 WHERE id = 6",
            [],
        )
        .unwrap();
        assert_eq!(r.run(&conn, now, m0 + lease, |_| false).unwrap().leases, 0);
    }
}
