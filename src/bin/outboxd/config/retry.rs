//! `[retry]` and each consumer's `[consumer.retry]`: the backoff schedule.

use outboxd::RetryPolicy;
use serde::Deserialize;

use super::{Checker, ConfigError, Dur};

/// A retry table as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    initial: Option<Dur>,
    max_delay: Option<Dur>,
    max_attempts: Option<u32>,
    jitter: Option<f64>,
}

/// Checks a retry table at `prefix` (`retry`, `consumer[1].retry`): the
/// keys it sets, on top of `base`.
pub fn check(
    c: &Checker<'_>,
    prefix: &str,
    raw: &RawRetry,
    base: RetryPolicy,
) -> Result<RetryPolicy, ConfigError> {
    let mut p = base;
    if let Some(Dur(d)) = raw.initial {
        if d.is_zero() {
            return Err(c.err(
                format!("{prefix}.initial"),
                "must be longer than zero, such as 30s",
            ));
        }
        p = p.initial(d);
    }
    if let Some(Dur(d)) = raw.max_delay {
        p = p.max_delay(d);
    }
    if let Some(n) = c.range(&format!("{prefix}.max_attempts"), raw.max_attempts, 1, 1000)? {
        p = p.max_attempts(n);
    }
    if let Some(j) = raw.jitter {
        if !(0.0..=1.0).contains(&j) {
            return Err(c.err(
                format!("{prefix}.jitter"),
                format!("{j} is out of range; allowed: 0.0 to 1.0 (a fraction of the delay)"),
            ));
        }
        p = p.jitter(j);
    }
    p.validate().map_err(|e| match e {
        outboxd::Error::InvalidSetting { field, reason } => {
            let field = field.strip_prefix("retry.").unwrap_or(field);
            c.err(format!("{prefix}.{field}"), reason)
        }
        other => c.err(prefix, other.to_string()),
    })?;
    Ok(p)
}
