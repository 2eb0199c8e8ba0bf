//! `[purge]`: the relay's TTL purge of finished rows. The library's
//! `PurgePolicy::validate` checks it (through `RelayBuilder::build`).

use outboxd::purge::PurgePolicy;
use serde::Deserialize;

use super::values::{Dur, Whole};

/// `[purge]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPurge {
    enabled: Option<bool>,
    delivered_retention: Option<Dur>,
    dedup_ttl: Option<Dur>,
    dead_retention: Option<Dur>,
    intent_retention: Option<Dur>,
    batch_size: Option<Whole<1, { outboxd::purge::MAX_PURGE_BATCH as u64 }>>,
}

/// The purge policy `[purge]` describes: the library's defaults with the
/// keys set on top; None when it is turned off.
pub(crate) fn policy(p: &RawPurge) -> Option<PurgePolicy> {
    (p.enabled != Some(false)).then(|| retentions(p).policy)
}

/// The keys of `[purge]` on the library's defaults, whether or not the
/// relay's own purge is turned off: what `outboxd purge --config` starts
/// from.
pub(crate) fn retentions(p: &RawPurge) -> Retentions {
    let d = PurgePolicy::default();
    Retentions {
        policy: PurgePolicy::default()
            .delivered_retention(p.delivered_retention.map_or(d.delivered_retention, |x| x.0))
            .dedup_ttl(p.dedup_ttl.map_or(d.dedup_ttl, |x| x.0))
            .dead_retention(p.dead_retention.map(|x| x.0))
            .intent_retention(p.intent_retention.map_or(d.intent_retention, |x| x.0))
            .batch_size(p.batch_size.map_or(d.batch_size, Whole::get)),
        delivered_retention_set: p.delivered_retention.is_some(),
        dedup_ttl_set: p.dedup_ttl.is_some(),
    }
}

/// `[purge]`'s retentions, and which of the two that must agree it set
/// itself (when it did not set `dedup_ttl`, a longer delivered retention
/// raises the dedup window with it).
#[derive(Debug, Clone)]
pub(crate) struct Retentions {
    pub(crate) policy: PurgePolicy,
    pub(crate) delivered_retention_set: bool,
    pub(crate) dedup_ttl_set: bool,
}
