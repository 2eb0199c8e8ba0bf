//! `[purge]`: the relay's TTL purge of finished rows.

use outboxd::purge::PurgePolicy;
use serde::Deserialize;

use super::{Checker, ConfigError, Dur};

/// `[purge]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPurge {
    enabled: Option<bool>,
    delivered_retention: Option<Dur>,
    dedup_ttl: Option<Dur>,
    dead_retention: Option<Dur>,
    intent_retention: Option<Dur>,
    batch_size: Option<usize>,
}

/// Checks `[purge]`; None when it is turned off.
pub fn check(c: &Checker<'_>, p: &RawPurge) -> Result<Option<PurgePolicy>, ConfigError> {
    if p.enabled == Some(false) {
        return Ok(None);
    }
    let d = PurgePolicy::default();
    let batch_size = c
        .range("purge.batch_size", p.batch_size, 1, 100_000)?
        .unwrap_or(d.batch_size);
    let policy = PurgePolicy {
        delivered_retention: p.delivered_retention.map_or(d.delivered_retention, |x| x.0),
        dedup_ttl: p.dedup_ttl.map_or(d.dedup_ttl, |x| x.0),
        dead_retention: p.dead_retention.map(|x| x.0),
        intent_retention: p.intent_retention.map_or(d.intent_retention, |x| x.0),
        batch_size,
    };
    policy.validate().map_err(|e| match e {
        outboxd::Error::InvalidSetting { field, reason } => c.err(field, reason),
        other => c.err("purge", other.to_string()),
    })?;
    Ok(Some(policy))
}
