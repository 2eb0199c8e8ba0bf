//! `[alerts]`: the thresholds a monitor alerts on, as the library's
//! [`Thresholds`]; the library decides which are crossed
//! (`Status::problems`), and [`describe`] says it the same way for `status`
//! (exit 1) and `run` (a log line). The library checks `stale_after`
//! (through `RelayBuilder::build`), and the relay logs stale events itself.

use outboxd::status::{self, Thresholds};
use serde::{Deserialize, Serialize};

use super::values::Dur;
use crate::cmd::support::{count, human};

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    stale_after: Option<Dur>,
    max_dead: Option<u64>,
}

/// The thresholds without a config file, for every command (`status`,
/// `console`, and `run`'s /healthz and dead-letter log): the relay's stale
/// threshold, and any dead letter is a problem. With a config, its
/// `[alerts]` decide ([`thresholds`]).
pub fn without_config() -> Thresholds {
    Thresholds::new(outboxd::relay::DEFAULT_STALE_AFTER, Some(0))
}

/// The thresholds `[alerts]` describes, defaults filled in (no `max_dead`:
/// dead letters alone are no problem).
pub fn thresholds(raw: &RawAlerts) -> Thresholds {
    Thresholds::new(
        raw.stale_after
            .map_or(outboxd::relay::DEFAULT_STALE_AFTER, |d| d.0),
        raw.max_dead,
    )
}

/// A crossed threshold, as `status` prints it (and `--json` shows it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Which threshold: "stale-after" or "max-dead" (the flags' names),
    /// "clock-step" (a lease or retry further ahead than the settings
    /// allow) or "implausible-delay" (events delayed by more than a year).
    pub threshold: &'static str,
    /// What was found and what to do.
    pub message: String,
}

/// What a crossed threshold means and what to do about it.
pub fn describe(p: &status::Problem) -> Problem {
    match p {
        status::Problem::Stale {
            oldest_due_age,
            stale_after,
        } => Problem {
            threshold: "stale-after",
            message: format!(
                "the oldest due event has waited {} (more than {}); is `outboxd run` \
                 running and able to deliver? `outboxd doctor` checks for expired leases",
                human(*oldest_due_age),
                human(*stale_after)
            ),
        },
        status::Problem::TooManyDead { dead, max_dead } => Problem {
            threshold: "max-dead",
            message: format!(
                "{} (more than {max_dead}); see them with `outboxd dead list`, then \
                 `outboxd dead requeue` or `outboxd dead discard`",
                count(*dead, "dead letter", "dead letters")
            ),
        },
        status::Problem::ClockStep {
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
            Problem {
                threshold: "clock-step",
                message: format!(
                    "{}: the system clock stepped back since they were set; a running relay \
                     renews its leases within half a lease and makes such retries due, but the \
                     events of a stopped relay wait until the clock catches up; check the \
                     clock (timedatectl) and that `outboxd run` is running",
                    found.join(", and ")
                ),
            }
        }
        status::Problem::ImplausibleDelay { count: n } => Problem {
            threshold: "implausible-delay",
            message: format!(
                "{} delayed by more than a year: was available_at written in microseconds \
                 or nanoseconds? outboxd times are milliseconds since the Unix epoch. They \
                 are not delivered before then, and hold back every later event of their \
                 ordering key; set their available_at in milliseconds with an UPDATE",
                count(*n, "event is", "events are")
            ),
        },
        other => Problem {
            threshold: "other",
            message: format!("{other:?}"),
        },
    }
}
