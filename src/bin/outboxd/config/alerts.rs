//! `[alerts]`: the thresholds a monitor alerts on, as the library's
//! [`Thresholds`]. The library owns the defaults (the same without a config
//! or without `[alerts]`) and the verdict ([`outboxd::health::check`]);
//! [`verdict`] gives it in the form every surface of the binary shows.

use std::ops::Deref;

use outboxd::health::{self, Thresholds};
use outboxd::Timestamp;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};

use super::values::Dur;

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    stale_after: Option<Dur>,
    max_dead: Option<u64>,
    max_undelivered_age: Option<Dur>,
}

/// The thresholds without a config file: the library's defaults.
pub fn without_config() -> Thresholds {
    Thresholds::default()
}

/// The thresholds `[alerts]` describes, the library's defaults filled in
/// (stale after 5m, any dead letter, undelivered after 1h).
pub fn thresholds(raw: &RawAlerts) -> Thresholds {
    let d = Thresholds::default();
    Thresholds::new(
        raw.stale_after.map_or(d.stale_after, |s| s.0),
        raw.max_dead.or(d.max_dead),
    )
    .max_undelivered_age(
        raw.max_undelivered_age
            .map_or(d.max_undelivered_age, |a| a.0),
    )
}

/// A crossed threshold, as `status` prints it (and `--json`, `/healthz`
/// and the console's overview show it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The problem's kind ([`health::KINDS`]): the `kind` label of the
    /// `outboxd_health_problem` gauge.
    pub kind: &'static str,
    /// Which threshold: "stale-after", "max-undelivered-age" or "max-dead"
    /// (the flags' names), "clock-step", "implausible-delay" or "capture".
    pub threshold: &'static str,
    /// What was found and what to do.
    pub message: String,
}

/// What a crossed threshold means and what to do about it.
pub fn describe(p: &health::Problem) -> Problem {
    Problem {
        kind: p.kind(),
        threshold: p.threshold(),
        message: p.message(),
    }
}

/// The library's verdict with its problems described: a slice of
/// [`Problem`]s to the surfaces that list them, and the capture states for
/// `/metrics`.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The library's verdict.
    pub health: health::Verdict,
    problems: Vec<Problem>,
}

impl Deref for Verdict {
    type Target = [Problem];

    fn deref(&self) -> &[Problem] {
        &self.problems
    }
}

impl From<health::Verdict> for Verdict {
    fn from(health: health::Verdict) -> Verdict {
        let problems = health.problems.iter().map(describe).collect();
        Verdict { health, problems }
    }
}

/// The health verdict of the database at `now`, for every surface.
pub fn verdict(
    conn: &Connection,
    thresholds: &Thresholds,
    now: Timestamp,
) -> outboxd::Result<Verdict> {
    health::check(conn, thresholds, now).map(Verdict::from)
}
