//! `[relay]`: how the relay claims, leases and shuts down. The ranges are
//! the library's (checked by `RelayBuilder::build`); only the shutdown
//! grace, which the binary applies itself, is checked here.

use std::time::Duration;

use outboxd::relay::UnroutedPolicy;
use serde::Deserialize;

use super::checker::Checker;

use super::error::ConfigError;

use super::values::{Dur, Whole};
use outboxd::clock::format_duration as human;

/// How long in-flight deliveries may finish after SIGINT or SIGTERM, unless
/// configured. Below the packaged systemd unit's `TimeoutStopSec=40`.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The longest shutdown grace accepted.
const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(3600);

/// The `[relay]` settings (None: the library default).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RelaySettings {
    /// Worker threads.
    pub(crate) workers: Option<usize>,
    /// Rows claimed per transaction.
    pub(crate) batch_size: Option<usize>,
    /// The most payload bytes held by deliveries in flight.
    pub(crate) batch_bytes: Option<u64>,
    /// The largest payload loaded; larger ones are dead-lettered unread.
    pub(crate) max_payload_bytes: Option<u64>,
    /// The lease of a claim.
    pub(crate) lease: Duration,
    /// How often an idle relay looks for other processes' commits.
    pub(crate) poll_interval: Option<Duration>,
    /// What to do with events no consumer takes.
    pub(crate) unrouted: UnroutedPolicy,
    /// How long in-flight deliveries may finish on shutdown.
    pub(crate) shutdown_grace: Duration,
}

impl Default for RelaySettings {
    fn default() -> RelaySettings {
        RelaySettings {
            workers: None,
            batch_size: None,
            batch_bytes: None,
            max_payload_bytes: None,
            lease: outboxd::relay::DEFAULT_LEASE,
            poll_interval: None,
            unrouted: UnroutedPolicy::default(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// `[relay]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRelay {
    workers: Option<Whole<1, { outboxd::relay::MAX_WORKERS as u64 }>>,
    batch_size: Option<Whole<1, { outboxd::relay::MAX_BATCH_SIZE as u64 }>>,
    batch_bytes: Option<u64>,
    pub(crate) max_payload_bytes: Option<u64>,
    lease: Option<Dur>,
    poll_interval: Option<Dur>,
    unrouted: Option<Unrouted>,
    shutdown_grace: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Unrouted {
    DeadLetter,
    Skip,
}

/// Reads `[relay]`; checks the shutdown grace.
pub(crate) fn check(c: &Checker<'_>, r: &RawRelay) -> Result<RelaySettings, ConfigError> {
    let shutdown_grace = r.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0);
    if shutdown_grace > MAX_SHUTDOWN_GRACE {
        return Err(c.err(
            "relay.shutdown_grace",
            format!(
                "{} is too long; allowed: up to 1h (and keep it below the \
                 service manager's stop timeout, 40s in the packaged systemd unit)",
                human(shutdown_grace)
            ),
        ));
    }
    Ok(RelaySettings {
        workers: r.workers.map(Whole::get),
        batch_size: r.batch_size.map(Whole::get),
        batch_bytes: r.batch_bytes,
        max_payload_bytes: r.max_payload_bytes,
        lease: r.lease.map_or(outboxd::relay::DEFAULT_LEASE, |d| d.0),
        poll_interval: r.poll_interval.map(|d| d.0),
        unrouted: match r.unrouted {
            None | Some(Unrouted::DeadLetter) => UnroutedPolicy::DeadLetter,
            Some(Unrouted::Skip) => UnroutedPolicy::Skip,
        },
        shutdown_grace,
    })
}
