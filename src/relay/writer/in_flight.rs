//! The rows in flight: the claims this relay holds, kept by row id.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Instant;

use crate::clock::Timestamp;
use crate::envelope::EventId;

/// A row this relay holds a claim on.
pub(super) struct InFlight {
    pub(super) token: Arc<str>,
    pub(super) lease_until: Timestamp,
    /// When to renew the lease by the monotonic clock: half a lease after
    /// the claim or the last renewal, whatever the wall clock did meanwhile.
    pub(super) renew_at: Instant,
    pub(super) event_id: EventId,
    pub(super) attempts: u32,
    /// Its payload's size while its delivery runs; 0 once its outcome is in.
    pub(super) bytes: u64,
}

/// The writer's maps and sets keyed by row id, hashed by [`RowIdHasher`].
pub(super) type RowMap<V> = HashMap<i64, V, BuildHasherDefault<RowIdHasher>>;
pub(super) type RowSet = HashSet<i64, BuildHasherDefault<RowIdHasher>>;

/// Hashes a row id with one multiplication by an odd constant (Fibonacci
/// hashing): a bijection, so ids that differ only in their low bits (as
/// the rows of one claim do) never share a bucket, and the high bits the
/// table also reads are mixed. The default SipHash cost the writer more
/// per event (BENCHMARKS.md). Its resistance to chosen keys is not needed:
/// these maps hold at most the rows in flight (the jobs channel's
/// capacity), so even ids picked to collide cost little.
#[derive(Default)]
pub(super) struct RowIdHasher(u64);

impl Hasher for RowIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_i64` is used (the keys are i64); this serves any
        // other key type correctly, if slowly.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(FIBONACCI);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// 2^64 divided by the golden ratio, made odd.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of one claim are consecutive ids: none of them share a
    /// bucket of a table that size, and the set finds every one.
    #[test]
    fn consecutive_row_ids_spread_over_every_bucket() {
        let hash = |id: i64| {
            let mut h = RowIdHasher::default();
            h.write_i64(id);
            h.finish()
        };
        for start in [1_i64, 1_000_003, i64::MAX - 300] {
            let buckets: HashSet<u64> = (start..start + 256).map(|id| hash(id) & 255).collect();
            assert_eq!(buckets.len(), 256, "ids from {start}");
        }
        let set: RowSet = (1..=1000).collect();
        assert!((1..=1000).all(|id| set.contains(&id)) && !set.contains(&0));
    }
}
