//! `[alerts]`: the thresholds, and the one check of them ([`Alerts::check`])
//! that `status` (exit 1) and `run` (a log line) report. The library checks
//! `stale_after` (through `RelayBuilder::build`), and the relay also logs
//! stale events itself, with the same threshold.

use std::time::Duration;

use outboxd::status::Status;
use serde::{Deserialize, Serialize};

use super::Dur;
use crate::cmd::support::{count, human};

/// The `[alerts]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alerts {
    /// The age of the oldest due event that is logged as stale.
    pub stale_after: Duration,
    /// More dead letters than this are logged as a problem.
    pub max_dead: Option<u64>,
}

impl Default for Alerts {
    fn default() -> Alerts {
        Alerts {
            stale_after: outboxd::relay::DEFAULT_STALE_AFTER,
            max_dead: None,
        }
    }
}

/// A crossed threshold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Which threshold: "stale-after" or "max-dead".
    pub threshold: &'static str,
    /// What was found and what to do.
    pub message: String,
}

impl Alerts {
    /// The thresholds `status` crosses.
    pub fn check(&self, s: &Status) -> Vec<Problem> {
        let mut found = Vec::new();
        if let Some(age) = s.oldest_due_age.filter(|age| *age > self.stale_after) {
            found.push(Problem {
                threshold: "stale-after",
                message: format!(
                    "the oldest due event has waited {} (more than {}); is `outboxd run` \
                     running and able to deliver? `outboxd doctor` checks for expired leases",
                    human(age),
                    human(self.stale_after)
                ),
            });
        }
        if let Some(max) = self.max_dead.filter(|max| s.counts.dead > *max) {
            found.push(Problem {
                threshold: "max-dead",
                message: format!(
                    "{} (more than {max}); see them with `outboxd dead list`, then \
                     `outboxd dead requeue` or `outboxd dead discard`",
                    count(s.counts.dead, "dead letter", "dead letters")
                ),
            });
        }
        found
    }
}

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    stale_after: Option<Dur>,
    max_dead: Option<u64>,
}

/// The alerts `[alerts]` describes, defaults filled in.
pub fn alerts(raw: &RawAlerts) -> Alerts {
    Alerts {
        stale_after: raw
            .stale_after
            .map_or(outboxd::relay::DEFAULT_STALE_AFTER, |d| d.0),
        max_dead: raw.max_dead,
    }
}
