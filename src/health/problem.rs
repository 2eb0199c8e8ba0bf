//! The problems: one variant per kind, its kind for metrics, its threshold
//! as `status` names it, and its message for people.

use std::time::Duration;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::clock::Timestamp;
use crate::text::duration as human;

/// A delay longer than this (a year) is reported as implausible.
pub const IMPLAUSIBLE_DELAY: Duration = Duration::from_secs(365 * 86_400);

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
    /// The oldest undelivered event (due, being delivered, or failed at
    /// least once) was created longer ago than `max_undelivered_age`: a
    /// consumer that keeps failing, whose retries are not due and so not
    /// stale.
    Undelivered {
        /// How long ago it was created.
        oldest_undelivered_age: Duration,
        /// The threshold.
        max_undelivered_age: Duration,
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
    /// A capture lost a window of writes (its triggers were missing until
    /// reinstalled) that no snapshot has covered and no one acknowledged.
    CaptureGap {
        /// The capture's name.
        capture: String,
        /// Its table.
        table: String,
        /// How many open gaps it has.
        gaps: u64,
        /// The start of the earliest window (an upper bound: the last
        /// time outboxd saw the triggers intact before it).
        lost_after: Timestamp,
        /// The end of the latest window (when the triggers came back).
        lost_until: Timestamp,
    },
}

/// Every [`Problem::kind`], in the order problems are listed: a gauge per
/// kind is exported whether or not it is crossed.
pub const KINDS: &[&str] = &[
    "stale",
    "undelivered",
    "dead_letters",
    "clock_step",
    "implausible_delay",
    "capture",
    "capture_gap",
];

impl Problem {
    /// The kind, one of [`KINDS`]: the `kind` label of the
    /// `outboxd_health_problem` gauge.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Stale { .. } => "stale",
            Problem::Undelivered { .. } => "undelivered",
            Problem::TooManyDead { .. } => "dead_letters",
            Problem::ClockStep { .. } => "clock_step",
            Problem::ImplausibleDelay { .. } => "implausible_delay",
            Problem::CaptureDrift { .. } => "capture",
            Problem::CaptureGap { .. } => "capture_gap",
        }
    }

    /// The setting it crosses, as `status` has always named it:
    /// "stale-after", "max-undelivered-age" and "max-dead" (the flags'
    /// names), "clock-step", "implausible-delay" or "capture".
    pub fn threshold(&self) -> &'static str {
        match self {
            Problem::Stale { .. } => "stale-after",
            Problem::Undelivered { .. } => "max-undelivered-age",
            Problem::TooManyDead { .. } => "max-dead",
            Problem::ClockStep { .. } => "clock-step",
            Problem::ImplausibleDelay { .. } => "implausible-delay",
            Problem::CaptureDrift { .. } => "capture",
            Problem::CaptureGap { .. } => "capture-gap",
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
            Problem::Undelivered {
                oldest_undelivered_age,
                max_undelivered_age,
            } => format!(
                "the oldest undelivered event was written {} ago (more than {}); a consumer \
                 keeps failing or is slow: see `outboxd status` and run's log for the reason \
                 of its retries",
                human(*oldest_undelivered_age),
                human(*max_undelivered_age)
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
            Problem::CaptureGap {
                capture,
                table,
                gaps,
                lost_after,
                lost_until,
            } => format!(
                "capture {capture} of {table} lost {}: writes made between {lost_after} and \
                 {lost_until} (at most) may not have become events; send the rows as they are \
                 now with `outboxd capture snapshot --capture {capture}`, or acknowledge with \
                 `outboxd capture ack --capture {capture}`",
                count(*gaps, "window", "windows")
            ),
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

/// `n` and its noun: "1 dead letter", "3 dead letters".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
