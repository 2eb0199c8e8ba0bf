//! What "healthy" means: the thresholds, the problems that cross them, and
//! the one verdict every surface reports (`outboxd status` and `doctor`,
//! `/healthz`, the console's overview, `run`'s alert log and the problem
//! gauges of `/metrics`).
//!
//! [`check`] measures a database against [`Thresholds`] with a few bounded
//! reads (an index seek for the oldest due event, an index range for the
//! dead letters, the pending rows for clock steps, the capture triggers),
//! so a monitor may call it often on a large file.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! outboxd::schema::migrate(&mut conn)?;
//! use outboxd::health::{check, Thresholds};
//! let verdict = check(&conn, &Thresholds::default(), outboxd::Timestamp::now())?;
//! assert!(verdict.is_healthy());
//! # Ok(()) }
//! ```

mod problem;
mod queries;
mod thresholds;

use std::time::Duration;

use rusqlite::Connection;
use serde::Serialize;

use crate::capture::{self, CaptureStatus};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::limits::CLOCK_STEP_SLACK;
use crate::schema;

pub use problem::{Problem, IMPLAUSIBLE_DELAY, KINDS};
#[cfg(test)]
pub(crate) use queries::DEAD_COUNT;
pub(crate) use queries::{count_column, pending, read_transaction};
pub use queries::{dead_count, oldest_due, stale_count, STALE_COUNT_BOUND};
pub use thresholds::{Thresholds, DEFAULT_MAX_DEAD};

/// Whether one captured table's triggers are intact: the
/// `outboxd_capture_intact` gauge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CaptureState {
    /// The capture's name.
    pub name: String,
    /// The captured table.
    pub table: String,
    /// The capture's event type (`page.{op}.v1`).
    pub capture: String,
    /// Every trigger installed as recorded.
    pub intact: bool,
    /// Its open gaps (`outboxd_capture_gaps`).
    pub open_gaps: u64,
}

/// The health of a database at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Verdict {
    /// The thresholds crossed, in [`KINDS`] order; empty when healthy.
    pub problems: Vec<Problem>,
    /// Every recorded capture and whether it is intact.
    pub captures: Vec<CaptureState>,
}

impl Verdict {
    /// True when no threshold is crossed.
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether a problem of this kind ([`KINDS`]) is crossed.
    pub fn has(&self, kind: &str) -> bool {
        self.problems.iter().any(|p| p.kind() == kind)
    }
}

/// The measures of the outbox the thresholds apply to (the status's, or
/// [`check`]'s own bounded reads).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Measures {
    pub oldest_due_age: Option<Duration>,
    pub oldest_undelivered_age: Option<Duration>,
    pub dead: u64,
    pub furthest_lease: Option<Duration>,
    pub furthest_retry: Option<Duration>,
    pub implausible_delays: u64,
}

/// The thresholds the measures cross (stale, undelivered, dead letters, a
/// clock step, implausible delays, in that order).
pub(crate) fn problems(m: &Measures, t: &Thresholds) -> Vec<Problem> {
    let mut found = Vec::new();
    if let Some(age) = m.oldest_due_age.filter(|age| *age > t.stale_after) {
        found.push(Problem::Stale {
            oldest_due_age: age,
            stale_after: t.stale_after,
        });
    }
    if let Some(age) = m
        .oldest_undelivered_age
        .filter(|age| *age > t.max_undelivered_age)
    {
        found.push(Problem::Undelivered {
            oldest_undelivered_age: age,
            max_undelivered_age: t.max_undelivered_age,
        });
    }
    if let Some(max) = t.max_dead.filter(|max| m.dead > *max) {
        found.push(Problem::TooManyDead {
            dead: m.dead,
            max_dead: max,
        });
    }
    let too_far = |ahead: Option<Duration>, max: Duration| {
        ahead.filter(|a| *a > max.saturating_add(CLOCK_STEP_SLACK))
    };
    let lease = too_far(m.furthest_lease, t.max_lease);
    let retry = too_far(m.furthest_retry, t.max_retry_wait);
    if lease.is_some() || retry.is_some() {
        found.push(Problem::ClockStep {
            lease,
            retry,
            max_lease: t.max_lease,
            max_retry_wait: t.max_retry_wait,
        });
    }
    if m.implausible_delays > 0 {
        found.push(Problem::ImplausibleDelay {
            count: m.implausible_delays,
        });
    }
    found
}

/// The capture problems among `captures`, and every capture's state.
fn capture_verdict(
    captures: &[CaptureStatus],
    now: Timestamp,
) -> (Vec<Problem>, Vec<CaptureState>) {
    let mut problems: Vec<Problem> = captures
        .iter()
        .filter_map(|s| {
            s.problem(now).map(|p| Problem::CaptureDrift {
                table: s.table.clone(),
                capture: s.spec.event_type.clone(),
                unseen_since: s.verified_at,
                message: format!("{p}; reinstall with `outboxd capture apply`"),
            })
        })
        .collect();
    problems.extend(captures.iter().filter(|s| !s.gaps.is_empty()).map(|s| {
        Problem::CaptureGap {
            capture: s.name.clone(),
            table: s.table.clone(),
            gaps: s.gaps.len() as u64,
            lost_after: s
                .gaps
                .iter()
                .map(|g| g.lost_after)
                .min()
                .expect("not empty"),
            lost_until: s
                .gaps
                .iter()
                .map(|g| g.lost_until)
                .max()
                .expect("not empty"),
        }
    }));
    let states = captures
        .iter()
        .map(|s| CaptureState {
            name: s.name.clone(),
            table: s.table.clone(),
            capture: s.spec.event_type.clone(),
            intact: s.is_intact(),
            open_gaps: s.gaps.len() as u64,
        })
        .collect();
    (problems, states)
}

/// The health verdict of the database at `now`: the one every surface
/// reports. Reads only (a read-only connection will do), in one read
/// transaction when the connection is in autocommit mode.
///
/// Fails with [`Error::NotMigrated`], [`Error::SchemaOutdated`] or
/// [`Error::SchemaTooNew`] unless the schema is current.
pub fn check(conn: &Connection, thresholds: &Thresholds, now: Timestamp) -> Result<Verdict> {
    schema::ensure_current(conn)?;
    let tx = read_transaction(conn)?;
    let pending = pending(conn, now)?;
    let measures = Measures {
        oldest_due_age: oldest_due(conn, now)?.map(|at| now.since(at)),
        oldest_undelivered_age: pending.oldest_undelivered.map(|at| now.since(at)),
        dead: dead_count(conn)?,
        furthest_lease: pending.furthest_lease,
        furthest_retry: pending.furthest_retry,
        implausible_delays: pending.implausible_delays,
    };
    let captures = capture::inspect(conn)?;
    if let Some(tx) = tx {
        tx.finish().map_err(Error::db("end the read transaction"))?;
    }
    let mut found = problems(&measures, thresholds);
    let (capture_problems, captures) = capture_verdict(&captures, now);
    found.extend(capture_problems);
    Ok(Verdict {
        problems: found,
        captures,
    })
}

#[cfg(test)]
mod tests;
