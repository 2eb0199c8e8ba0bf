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

use std::time::Duration;

use rusqlite::{params, Connection};
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::capture::{self, CaptureStatus};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::limits::CLOCK_STEP_SLACK;
use crate::schema;
use crate::text::duration as human;

/// A delay longer than this (a year) is reported as implausible.
pub const IMPLAUSIBLE_DELAY: Duration = Duration::from_secs(365 * 86_400);

/// The limits a monitor alerts on. One set of defaults for every surface,
/// with or without a config: stale after 5 minutes, any dead letter.
///
/// ```
/// use outboxd::health::Thresholds;
/// use std::time::Duration;
/// let t = Thresholds::new(Duration::from_secs(60), Some(10));
/// assert_eq!(t.max_dead, Some(10));
/// assert_eq!(Thresholds::default().max_dead, Some(0));
/// assert_eq!(Thresholds::default().stale_after, Duration::from_secs(300));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Thresholds {
    /// Unhealthy when the oldest due event has waited longer than this.
    pub stale_after: Duration,
    /// Unhealthy when there are more dead letters than this; None: no limit.
    pub max_dead: Option<u64>,
    /// The longest lease a relay may have set: a lease ending further
    /// ahead is a clock step. Default [`MAX_LEASE`](crate::limits::MAX_LEASE);
    /// a config's own lease is tighter.
    pub max_lease: Duration,
    /// The longest wait a retry may have been given: a retry due further
    /// ahead is a clock step. Default twice
    /// [`MAX_RETRY_DELAY`](crate::limits::MAX_RETRY_DELAY) (the longest delay
    /// with full jitter); a config's own policies are tighter
    /// ([`RetryPolicy::longest_wait`](crate::RetryPolicy::longest_wait)).
    pub max_retry_wait: Duration,
}

/// The default dead-letter limit: any dead letter is a problem.
pub const DEFAULT_MAX_DEAD: u64 = 0;

impl Thresholds {
    /// Thresholds with these limits, and the clock-step bounds of any
    /// relay setting.
    pub fn new(stale_after: Duration, max_dead: Option<u64>) -> Thresholds {
        Thresholds {
            stale_after,
            max_dead,
            max_lease: crate::limits::MAX_LEASE,
            max_retry_wait: crate::limits::MAX_RETRY_DELAY * 2,
        }
    }

    /// The same, with the clock-step bounds of the relays' own settings:
    /// their lease and their retry policies' longest wait.
    ///
    /// ```
    /// use outboxd::health::Thresholds;
    /// use std::time::Duration;
    /// let t = Thresholds::default().relay_settings(Duration::from_secs(30), Duration::from_secs(3960));
    /// assert_eq!(t.max_lease, Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn relay_settings(mut self, lease: Duration, longest_retry_wait: Duration) -> Thresholds {
        self.max_lease = lease;
        self.max_retry_wait = longest_retry_wait;
        self
    }
}

impl Default for Thresholds {
    /// Stale after [`DEFAULT_STALE_AFTER`](crate::limits::DEFAULT_STALE_AFTER)
    /// (5 minutes), and any dead letter ([`DEFAULT_MAX_DEAD`]).
    fn default() -> Self {
        Thresholds::new(crate::limits::DEFAULT_STALE_AFTER, Some(DEFAULT_MAX_DEAD))
    }
}

/// A threshold crossed: one variant per kind ([`Problem::kind`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The oldest due event has waited longer than `stale_after`.
    Stale {
        /// How long it has waited.
        oldest_due_age: Duration,
        /// The threshold.
        stale_after: Duration,
    },
    /// More dead letters than `max_dead`.
    TooManyDead {
        /// How many there are.
        dead: u64,
        /// The threshold.
        max_dead: u64,
    },
    /// A lease ends, or a retry is due, further ahead than any setting could
    /// have put it: the system clock stepped back since. Until a relay
    /// renews the lease (every half lease of its own monotonic clock) or
    /// takes the retry (it makes such retries due when it notices the step),
    /// those events wait for the wall clock to catch up.
    ClockStep {
        /// How far ahead the furthest lease ends, when that is too far.
        lease: Option<Duration>,
        /// How far ahead the furthest retry is due, when that is too far.
        retry: Option<Duration>,
        /// The longest lease allowed.
        max_lease: Duration,
        /// The longest retry wait allowed.
        max_retry_wait: Duration,
    },
    /// Events delayed by more than [`IMPLAUSIBLE_DELAY`]: an `available_at`
    /// written in microseconds, say. They are never delivered before then,
    /// and hold back every later event of their ordering key.
    ImplausibleDelay {
        /// How many.
        count: u64,
    },
    /// A capture's triggers are missing or changed (its table rebuilt,
    /// renamed or dropped). Writes made while a trigger was missing were not
    /// captured: the window starts after `unseen_since`.
    CaptureDrift {
        /// The captured table.
        table: String,
        /// The capture's event type (`page.{op}.v1`).
        capture: String,
        /// The last time outboxd saw the capture intact.
        unseen_since: Timestamp,
        /// What is wrong and what to do, measured at the check.
        message: String,
    },
}

/// Every [`Problem::kind`], in the order problems are listed: a gauge per
/// kind is exported whether or not it is crossed.
pub const KINDS: &[&str] = &[
    "stale",
    "dead_letters",
    "clock_step",
    "implausible_delay",
    "capture",
];

impl Problem {
    /// The kind, one of [`KINDS`]: the `kind` label of the
    /// `outboxd_health_problem` gauge.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Stale { .. } => "stale",
            Problem::TooManyDead { .. } => "dead_letters",
            Problem::ClockStep { .. } => "clock_step",
            Problem::ImplausibleDelay { .. } => "implausible_delay",
            Problem::CaptureDrift { .. } => "capture",
        }
    }

    /// The setting it crosses, as `status` has always named it:
    /// "stale-after" and "max-dead" (the flags' names), "clock-step",
    /// "implausible-delay" or "capture".
    pub fn threshold(&self) -> &'static str {
        match self {
            Problem::Stale { .. } => "stale-after",
            Problem::TooManyDead { .. } => "max-dead",
            Problem::ClockStep { .. } => "clock-step",
            Problem::ImplausibleDelay { .. } => "implausible-delay",
            Problem::CaptureDrift { .. } => "capture",
        }
    }

    /// What was found and what to do about it, for a person.
    pub fn message(&self) -> String {
        match self {
            Problem::Stale {
                oldest_due_age,
                stale_after,
            } => format!(
                "the oldest due event has waited {} (more than {}); is `outboxd run` \
                 running and able to deliver? `outboxd doctor` checks for expired leases",
                human(*oldest_due_age),
                human(*stale_after)
            ),
            Problem::TooManyDead { dead, max_dead } => format!(
                "{} (more than {max_dead}); see them with `outboxd dead list`, then \
                 `outboxd dead requeue` or `outboxd dead discard`",
                count(*dead, "dead letter", "dead letters")
            ),
            Problem::ClockStep {
                lease,
                retry,
                max_lease,
                max_retry_wait,
            } => {
                let mut found = Vec::new();
                if let Some(a) = lease {
                    found.push(format!(
                        "a lease ends {} from now (leases are {} at most)",
                        human(*a),
                        human(*max_lease)
                    ));
                }
                if let Some(a) = retry {
                    found.push(format!(
                        "a retry is due {} from now (retries wait {} at most)",
                        human(*a),
                        human(*max_retry_wait)
                    ));
                }
                format!(
                    "{}: the system clock stepped back since they were set; a running relay \
                     renews its leases within half a lease and makes such retries due, but the \
                     events of a stopped relay wait until the clock catches up; check the \
                     clock (timedatectl) and that `outboxd run` is running",
                    found.join(", and ")
                )
            }
            Problem::ImplausibleDelay { count: n } => format!(
                "{} delayed by more than a year: was available_at written in microseconds \
                 or nanoseconds? outboxd times are milliseconds since the Unix epoch. They \
                 are not delivered before then, and hold back every later event of their \
                 ordering key; set their available_at in milliseconds with an UPDATE",
                count(*n, "event is", "events are")
            ),
            Problem::CaptureDrift { message, .. } => message.clone(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

/// `{"kind", "threshold", "message"}`, as `status --json` and `/healthz`
/// list it.
impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut p = s.serialize_struct("Problem", 3)?;
        p.serialize_field("kind", self.kind())?;
        p.serialize_field("threshold", self.threshold())?;
        p.serialize_field("message", &self.message())?;
        p.end()
    }
}

/// Whether one captured table's triggers are intact: the
/// `outboxd_capture_intact` gauge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CaptureState {
    /// The captured table.
    pub table: String,
    /// The capture's event type (`page.{op}.v1`).
    pub capture: String,
    /// Every trigger installed as recorded.
    pub intact: bool,
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
    pub dead: u64,
    pub furthest_lease: Option<Duration>,
    pub furthest_retry: Option<Duration>,
    pub implausible_delays: u64,
}

/// The thresholds the measures cross (stale, dead letters, a clock step,
/// implausible delays, in that order).
pub(crate) fn problems(m: &Measures, t: &Thresholds) -> Vec<Problem> {
    let mut found = Vec::new();
    if let Some(age) = m.oldest_due_age.filter(|age| *age > t.stale_after) {
        found.push(Problem::Stale {
            oldest_due_age: age,
            stale_after: t.stale_after,
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
    let problems = captures
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
    let states = captures
        .iter()
        .map(|s| CaptureState {
            table: s.table.clone(),
            capture: s.spec.event_type.clone(),
            intact: s.is_intact(),
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
    let tx = if conn.is_autocommit() {
        Some(
            conn.unchecked_transaction()
                .map_err(Error::db("start a read transaction"))?,
        )
    } else {
        None
    };
    let (furthest_lease, furthest_retry, implausible_delays) = conn
        .prepare_cached(
            "SELECT
                 max(CASE WHEN claim_token IS NOT NULL THEN lease_until END),
                 max(CASE WHEN claim_token IS NULL AND attempts > 0 THEN available_at END),
                 coalesce(sum(claim_token IS NULL AND attempts = 0 AND available_at > ?1), 0)
             FROM event_outbox WHERE status = 'pending'",
        )
        .and_then(|mut s| {
            s.query_row(params![now.plus(IMPLAUSIBLE_DELAY).as_millis()], |r| {
                Ok((ahead(r, 0, now)?, ahead(r, 1, now)?, count_column(r, 2)?))
            })
        })
        .map_err(Error::db("look for clock steps and implausible delays"))?;
    let measures = Measures {
        oldest_due_age: oldest_due(conn, now)?.map(|at| now.since(at)),
        dead: dead_count(conn)?,
        furthest_lease,
        furthest_retry,
        implausible_delays,
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

/// The due time of the oldest due event (pending, `available_at <= now`),
/// None when nothing is due: the measure of a stuck relay, since events
/// delayed on purpose are not due. A row whose lease expired counts, since
/// it is due to be claimed again. One seek on the due index, however long
/// the queue. The status, the relay's stale check and [`check`] all
/// measure staleness with it.
pub fn oldest_due(conn: &Connection, now: Timestamp) -> Result<Option<Timestamp>> {
    conn.prepare_cached(
        "SELECT min(available_at) FROM event_outbox
         WHERE status = 'pending' AND available_at <= ?1",
    )
    .and_then(|mut s| s.query_row([now.as_millis()], |r| r.get::<_, Option<i64>>(0)))
    .map(|t| t.map(Timestamp::from_millis))
    .map_err(Error::db("find the oldest due event"))
}

/// The most stale events [`stale_count`] counts: beyond it the exact number
/// does not matter, and counting a huge backlog would hold a read open.
pub const STALE_COUNT_BOUND: u64 = 1_000_000;

/// How many due events have waited longer than `after` (up to
/// [`STALE_COUNT_BOUND`]).
pub fn stale_count(conn: &Connection, now: Timestamp, after: Duration) -> Result<u64> {
    conn.prepare_cached(
        "SELECT count(*) FROM (SELECT 1 FROM event_outbox
          WHERE status = 'pending' AND available_at <= ?1 LIMIT ?2)",
    )
    .and_then(|mut s| {
        s.query_row(
            params![now.minus(after).as_millis(), STALE_COUNT_BOUND as i64],
            |r| r.get::<_, i64>(0),
        )
    })
    .map(|n| n.max(0) as u64)
    .map_err(Error::db("count stale events"))
}

pub(crate) const DEAD_COUNT: &str =
    "SELECT count(*) FROM event_outbox WHERE status <> 'pending' AND status = 'dead'";

/// How many events are dead-lettered: a range of the finished-rows index,
/// so it costs the dead letters, not the table (the `status <> 'pending'`
/// term lets SQLite use that partial index).
pub fn dead_count(conn: &Connection) -> Result<u64> {
    conn.prepare_cached(DEAD_COUNT)
        .and_then(|mut s| s.query_row([], |r| count_column(r, 0)))
        .map_err(Error::db("count dead letters"))
}

/// How far ahead of `now` a time column's value is: None for NULL or a time
/// not ahead (the schema keeps these columns integers).
pub(crate) fn ahead(
    r: &rusqlite::Row<'_>,
    i: usize,
    now: Timestamp,
) -> rusqlite::Result<Option<Duration>> {
    Ok(r.get::<_, Option<i64>>(i)?
        .map(Timestamp::from_millis)
        .filter(|t| *t > now)
        .map(|t| t.since(now)))
}

/// Reads a count(*) or sum() column; SQLite never returns a negative one.
pub(crate) fn count_column(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(u64::try_from(r.get::<_, i64>(i)?).unwrap_or(0))
}

/// `n` and its noun: "1 dead letter", "3 dead letters".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests;
