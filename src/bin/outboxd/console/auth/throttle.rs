//! Wrong tokens counted per peer. After [`FREE_FAILURES`] wrong tokens in a
//! row, the peer's token attempts (the right token too) are refused for a
//! lockout that starts at a minute and doubles with each further wrong
//! token, up to a quarter of an hour: a few guesses an hour, where nothing
//! stopped thousands a second. A right token clears the count; an hour
//! without a wrong one forgets it.
//!
//! A peer is an IPv4 address, or an IPv6 /64 (one host holds a whole /64);
//! the table keeps [`MAX_PEERS`] and forgets the longest quiet beyond.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Wrong tokens a peer may give before its attempts are refused.
pub(crate) const FREE_FAILURES: u32 = 5;

/// The first lockout; each wrong token after it doubles it.
pub(crate) const FIRST_LOCKOUT: Duration = Duration::from_secs(60);

/// The longest lockout.
const MAX_LOCKOUT: Duration = Duration::from_secs(15 * 60);

/// How long a peer's count is kept after its last wrong token.
const FORGET: Duration = Duration::from_secs(3600);

/// Peers counted at most.
const MAX_PEERS: usize = 4096;

/// Who a wrong token is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    /// An IPv4 address (an IPv4-mapped IPv6 one too).
    V4(std::net::Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Peer {
    /// The peer `ip` is counted as.
    pub(crate) fn of(ip: IpAddr) -> Peer {
        match ip {
            IpAddr::V4(v4) => Peer::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::V4(v4),
                None => Peer::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::V4(ip) => write!(f, "{ip}"),
            Peer::V6(net) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*net) << 64)),
        }
    }
}

struct Record {
    failures: u32,
    last: Instant,
    /// A refusal of this lockout has been logged.
    refusal_said: bool,
}

impl Record {
    /// How long after the last wrong token attempts are refused.
    fn lockout(&self) -> Option<Duration> {
        let beyond = self.failures.checked_sub(FREE_FAILURES)?;
        Some(
            FIRST_LOCKOUT
                .saturating_mul(1u32.checked_shl(beyond).unwrap_or(u32::MAX))
                .min(MAX_LOCKOUT),
        )
    }

    fn refused_for(&self, now: Instant) -> Option<Duration> {
        let until = self.last + self.lockout()?;
        until.checked_duration_since(now).filter(|d| !d.is_zero())
    }
}

/// A refused attempt: how long until the peer may try again, after how
/// many wrong tokens, and whether this is the lockout's first refusal (the
/// one logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Locked {
    pub(crate) retry_after: Duration,
    pub(crate) failures: u32,
    pub(crate) first: bool,
}

/// What one more wrong token did: the count, and the lockout it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failed {
    pub(crate) failures: u32,
    pub(crate) lockout: Option<Duration>,
}

/// The counts.
#[derive(Default)]
pub(super) struct Throttle {
    peers: Mutex<HashMap<Peer, Record>>,
}

impl Throttle {
    fn lock(&self) -> MutexGuard<'_, HashMap<Peer, Record>> {
        // Nothing panics under the lock; a poisoned one is whole.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a token attempt from `peer` while it is locked out.
    pub(super) fn check(&self, peer: Peer, now: Instant) -> Result<(), Locked> {
        let mut peers = self.lock();
        let Some(record) = peers.get_mut(&peer) else {
            return Ok(());
        };
        match record.refused_for(now) {
            None => Ok(()),
            Some(retry_after) => {
                let first = !record.refusal_said;
                record.refusal_said = true;
                Err(Locked {
                    retry_after,
                    failures: record.failures,
                    first,
                })
            }
        }
    }

    /// Counts a wrong token from `peer`.
    pub(super) fn failed(&self, peer: Peer, now: Instant) -> Failed {
        let mut peers = self.lock();
        if !peers.contains_key(&peer) && peers.len() >= MAX_PEERS {
            peers.retain(|_, r| now.duration_since(r.last) < FORGET);
            if peers.len() >= MAX_PEERS {
                if let Some(quietest) = peers.iter().min_by_key(|(_, r)| r.last).map(|(p, _)| *p) {
                    peers.remove(&quietest);
                }
            }
        }
        let record = peers.entry(peer).or_insert(Record {
            failures: 0,
            last: now,
            refusal_said: false,
        });
        if now.duration_since(record.last) >= FORGET {
            record.failures = 0;
        }
        record.failures += 1;
        record.last = now;
        record.refusal_said = false;
        Failed {
            failures: record.failures,
            lockout: record.lockout(),
        }
    }

    /// A right token from `peer`: its count starts again.
    pub(super) fn succeeded(&self, peer: Peer) {
        self.lock().remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Peer = Peer::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: Peer = Peer::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn after_five_wrong_tokens_a_peer_waits_a_lockout_that_doubles() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for n in 1..FREE_FAILURES {
            assert_eq!(t.check(A, t0), Ok(()));
            assert_eq!(t.failed(A, t0).lockout, None, "{n}");
        }
        let fifth = t.failed(A, t0);
        assert_eq!((fifth.failures, fifth.lockout), (5, Some(FIRST_LOCKOUT)));
        let locked = t.check(A, t0).unwrap_err();
        let want = Locked {
            retry_after: FIRST_LOCKOUT,
            failures: 5,
            first: true,
        };
        assert_eq!(locked, want);
        assert!(!t.check(A, t0).unwrap_err().first, "logged once");
        assert_eq!(t.check(B, t0), Ok(()), "another peer is not held up");
        // The lockout ends; the next wrong token doubles it.
        let t1 = t0 + FIRST_LOCKOUT;
        assert_eq!(t.check(A, t1), Ok(()));
        assert_eq!(t.failed(A, t1).lockout, Some(FIRST_LOCKOUT * 2));
        assert!(t.check(A, t1 + FIRST_LOCKOUT).is_err());
        for _ in 0..40 {
            t.failed(A, t1);
        }
        assert_eq!(t.failed(A, t1).lockout, Some(MAX_LOCKOUT));
        // An hour quiet after the lockout: forgotten.
        let later = t1 + MAX_LOCKOUT + FORGET;
        assert_eq!(t.failed(A, later).failures, 1);
    }

    #[test]
    fn a_right_token_clears_the_count() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for _ in 1..FREE_FAILURES {
            t.failed(A, t0);
        }
        t.succeeded(A);
        assert_eq!(t.failed(A, t0).failures, 1);
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_bits_of_network() {
        let ip = |s: &str| Peer::of(s.parse().unwrap());
        assert_eq!(ip("2001:db8:1:2::1"), ip("2001:db8:1:2:ffff::9"));
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
        assert_eq!(ip("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(ip("::ffff:192.0.2.1"), A);
        assert_eq!(A.to_string(), "192.0.2.1");
    }

    #[test]
    fn the_table_is_bounded() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS as u32 + 10) {
            let peer = Peer::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            t.failed(peer, t0 + Duration::from_millis(i.into()));
        }
        assert_eq!(t.lock().len(), MAX_PEERS);
    }
}
