//! `[alerts]`: the thresholds the relay logs and `status` checks.

use std::time::Duration;

use serde::Deserialize;

use super::{Checker, ConfigError, Dur};

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

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    stale_after: Option<Dur>,
    max_dead: Option<u64>,
}

/// Checks `[alerts]`.
pub fn check(c: &Checker<'_>, raw: &RawAlerts) -> Result<Alerts, ConfigError> {
    let stale_after = raw
        .stale_after
        .map_or(outboxd::relay::DEFAULT_STALE_AFTER, |d| d.0);
    if stale_after.is_zero() {
        return Err(c.err("alerts.stale_after", "must be longer than zero, such as 5m"));
    }
    Ok(Alerts {
        stale_after,
        max_dead: raw.max_dead,
    })
}
