//! `[alerts]`: the thresholds the relay logs and `status` checks. The
//! library checks `stale_after` (through `RelayBuilder::build`).

use std::time::Duration;

use serde::Deserialize;

use super::Dur;

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

/// The alerts `[alerts]` describes, defaults filled in.
pub fn alerts(raw: &RawAlerts) -> Alerts {
    Alerts {
        stale_after: raw
            .stale_after
            .map_or(outboxd::relay::DEFAULT_STALE_AFTER, |d| d.0),
        max_dead: raw.max_dead,
    }
}
