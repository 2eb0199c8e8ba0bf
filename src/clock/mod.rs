//! Time as an input: the wall clock in production, a hand-set clock in tests;
//! and durations and times as people write them ([`format_duration`],
//! [`parse_duration`], [`parse_time`]).

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

mod text;

pub use text::{
    format_duration, format_duration_at_least, parse_duration, parse_time, DurationError, TimeError,
};

/// A point in time as milliseconds since the Unix epoch, UTC: the unit of
/// every timestamp column in the schema. Serializes as RFC 3339 UTC
/// (`2026-11-30T07:18:00.123Z`).
///
/// ```
/// use outboxd::Timestamp;
/// let t: Timestamp = "2026-11-30T08:18:00.5+01:00".parse().unwrap();
/// assert_eq!(t.to_string(), "2026-11-30T07:18:00.500Z");
/// assert_eq!(Timestamp::from_millis(t.as_millis()), t);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

/// A duration in whole milliseconds, saturating at `i64::MAX`.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Timestamp {
    /// The earliest timestamp.
    pub const MIN: Timestamp = Timestamp(i64::MIN);
    /// The latest timestamp.
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    /// The wall clock now.
    pub fn now() -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0);
        Timestamp(ms)
    }

    /// From milliseconds since the epoch.
    pub const fn from_millis(ms: i64) -> Timestamp {
        Timestamp(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This time plus a duration. Saturates at the largest timestamp, so a
    /// huge duration (a lease or retention of `Duration::MAX`) means "never",
    /// not a wrap into the past.
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(millis(d)))
    }

    /// This time minus a duration. Saturates at the smallest timestamp, so a
    /// huge duration means "before anything", never a wrap into the future:
    /// a retention of `Duration::MAX` purges nothing.
    ///
    /// ```
    /// use outboxd::Timestamp;
    /// use std::time::Duration;
    /// let now = Timestamp::from_millis(1_000);
    /// assert_eq!(now.minus(Duration::from_millis(400)).as_millis(), 600);
    /// assert!(now.minus(Duration::MAX) < Timestamp::from_millis(0)); // long before, never after
    /// assert_eq!(now.plus(Duration::MAX), Timestamp::MAX);
    /// ```
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(millis(d)))
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }
}

/// A timestamp string is not RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid timestamp {input:?}: expected RFC 3339, such as 2026-11-30T07:18:00Z")]
pub struct TimestampError {
    /// The text that was given.
    pub input: String,
}

impl std::str::FromStr for Timestamp {
    type Err = TimestampError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || TimestampError {
            input: s.to_string(),
        };
        let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| err())?;
        let ms = t.unix_timestamp_nanos() / 1_000_000;
        i64::try_from(ms).map(Timestamp).map_err(|_| err())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = OffsetDateTime::from_unix_timestamp_nanos(self.0 as i128 * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        // Always three fractional digits and a Z, so the text sorts like the time.
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where the relay reads the time. [`SystemClock`] in production; tests use
/// [`ManualClock`] to expire leases and reach retry times without sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to. Clones share one time.
///
/// ```
/// use outboxd::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now().as_millis(), 31_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start.as_millis())))
    }

    /// Moves the clock forward (saturating at [`Timestamp::MAX`]).
    pub fn advance(&self, d: Duration) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(millis(d)))
            });
    }

    /// Sets the clock (also backwards, to test clock jumps).
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip_keeps_milliseconds() {
        let t = Timestamp::from_millis(1_764_487_080_123);
        let s = t.to_string();
        assert!(s.ends_with(".123Z"), "{s}");
        assert_eq!(s.parse::<Timestamp>().unwrap(), t);
    }

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let t = Timestamp::from_millis(1_764_487_080_123);
        for huge in [Duration::MAX, Duration::from_secs(1_000_000_000_000)] {
            assert!(t.minus(huge) < t, "{huge:?}");
            assert!(t.plus(huge) > t, "{huge:?}");
        }
        assert_eq!(
            Timestamp::MIN.minus(Duration::from_millis(1)),
            Timestamp::MIN
        );
        assert_eq!(
            Timestamp::MAX.plus(Duration::from_millis(1)),
            Timestamp::MAX
        );
        let clock = ManualClock::new(t);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Timestamp::MAX);
    }

    #[test]
    fn rejects_non_rfc3339() {
        assert!("2026-11-30 07:18:00".parse::<Timestamp>().is_err());
        assert!("yesterday".parse::<Timestamp>().is_err());
    }
}
