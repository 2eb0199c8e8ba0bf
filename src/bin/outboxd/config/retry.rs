//! `[retry]` and each consumer's `[consumer.retry]`: the backoff schedule.
//! The library's `RetryPolicy::validate` checks it (through
//! `RelayBuilder::build`).

use outboxd::RetryPolicy;
use serde::Deserialize;

use super::values::{Dur, Whole};

/// A retry table as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    initial: Option<Dur>,
    max_delay: Option<Dur>,
    max_attempts: Option<Whole<1, { outboxd::relay::MAX_RETRY_ATTEMPTS as u64 }>>,
    jitter: Option<f64>,
    probe_interval: Option<Dur>,
    probe_max_interval: Option<Dur>,
}

/// The keys a retry table sets, on top of `base`.
pub(crate) fn apply(raw: &RawRetry, base: RetryPolicy) -> RetryPolicy {
    let mut p = base;
    if let Some(Dur(d)) = raw.initial {
        p = p.initial(d);
    }
    if let Some(Dur(d)) = raw.max_delay {
        p = p.max_delay(d);
    }
    if let Some(n) = raw.max_attempts {
        p = p.max_attempts(u32::try_from(n.0).unwrap_or(u32::MAX));
    }
    if let Some(j) = raw.jitter {
        p = p.jitter(j);
    }
    if let Some(Dur(d)) = raw.probe_interval {
        p = p.probe_interval(d);
    }
    if let Some(Dur(d)) = raw.probe_max_interval {
        p = p.probe_max_interval(d);
    }
    p
}
