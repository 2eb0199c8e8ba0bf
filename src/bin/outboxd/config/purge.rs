//! `[purge]`: the relay's TTL purge of finished rows. The library's
//! `PurgePolicy::validate` checks it (through `RelayBuilder::build`).

use outboxd::purge::PurgePolicy;
use serde::Deserialize;

use super::{Dur, Whole};

/// `[purge]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPurge {
    enabled: Option<bool>,
    delivered_retention: Option<Dur>,
    dedup_ttl: Option<Dur>,
    dead_retention: Option<Dur>,
    intent_retention: Option<Dur>,
    batch_size: Option<Whole<1, { outboxd::purge::MAX_PURGE_BATCH as u64 }>>,
}

/// The purge policy `[purge]` describes: the library's defaults with the
/// keys set on top; None when it is turned off.
pub fn policy(p: &RawPurge) -> Option<PurgePolicy> {
    if p.enabled == Some(false) {
        return None;
    }
    let d = PurgePolicy::default();
    Some(
        PurgePolicy::default()
            .delivered_retention(p.delivered_retention.map_or(d.delivered_retention, |x| x.0))
            .dedup_ttl(p.dedup_ttl.map_or(d.dedup_ttl, |x| x.0))
            .dead_retention(p.dead_retention.map(|x| x.0))
            .intent_retention(p.intent_retention.map_or(d.intent_retention, |x| x.0))
            .batch_size(p.batch_size.map_or(d.batch_size, Whole::get)),
    )
}
