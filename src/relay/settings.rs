//! The relay's validated settings, and the checks the builder validates
//! them with.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Result, Setting, SettingError};
use crate::purge::PurgePolicy;

/// The relay's validated settings.
pub(crate) struct Settings {
    pub path: PathBuf,
    pub workers: usize,
    pub batch_size: usize,
    pub batch_bytes: u64,
    pub max_payload_bytes: u64,
    pub lease: Duration,
    pub poll_interval: Duration,
    /// Watch the `-wal` file for other connections' commits.
    pub watch_wal: bool,
    pub flush_interval: Duration,
    pub housekeeping_interval: Duration,
    pub stale_after: Duration,
    pub purge: Option<PurgePolicy>,
}

/// Checks a consumer name: 1 to 128 characters of A-Z, a-z, 0-9, `_`, `-`
/// and `.`. [`RelayBuilder::build`](super::RelayBuilder::build) applies it to every consumer.
///
/// ```
/// use outboxd::relay::validate_consumer_name;
/// assert!(validate_consumer_name("search-index.v2").is_ok());
/// assert!(validate_consumer_name("search index").is_err());
/// ```
pub fn validate_consumer_name(name: &str) -> std::result::Result<(), SettingError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if name.is_empty() || name.len() > 128 || !name.bytes().all(allowed) {
        return Err(SettingError::new(
            Setting::ConsumerName,
            format!(
                "{name:?} is not allowed; use 1 to 128 characters of A-Z, a-z, 0-9, _, - and ."
            ),
        )
        .for_consumer(name));
    }
    Ok(())
}

pub(super) fn check_range<T: PartialOrd + std::fmt::Display>(
    setting: Setting,
    n: T,
    lo: T,
    hi: T,
) -> Result<()> {
    if n < lo || n > hi {
        return Err(SettingError::new(
            setting,
            format!("{n} is out of range; allowed: {lo} to {hi}"),
        )
        .into());
    }
    Ok(())
}

pub(super) fn check_duration(
    setting: Setting,
    d: Duration,
    lo: Duration,
    hi: Duration,
) -> Result<()> {
    if d < lo || d > hi {
        return Err(SettingError::new(
            setting,
            format!(
                "{} is out of range; allowed: {} to {}",
                crate::text::duration(d),
                crate::text::duration(lo),
                crate::text::duration(hi)
            ),
        )
        .into());
    }
    Ok(())
}
