//! [`EventId`]: the ULID naming one event, minted in order.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::Ulid;

use super::{truncate, EnvelopeError};
use crate::clock::Timestamp;

/// A ULID naming one event: sortable by creation time, unique without
/// coordination, the same on every retry (so it is the webhook-id too).
///
/// ```
/// use outboxd::EventId;
/// let id = EventId::new();
/// assert_eq!(EventId::parse(&id.to_string()).unwrap(), id);
/// assert!(EventId::parse("not-a-ulid").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(Ulid);

impl EventId {
    /// A fresh id, greater than every id minted before it in this process
    /// (within one millisecond the random part counts up instead of being
    /// drawn again).
    ///
    /// Why: the ids of one batch then enter the `event_id` index in order,
    /// at its right edge, instead of at random places among that
    /// millisecond's entries, which is cheaper (BENCHMARKS.md). Ids stay
    /// unique across processes: each millisecond still starts from 80
    /// random bits.
    pub fn new() -> EventId {
        static IDS: std::sync::Mutex<ulid::Generator> =
            std::sync::Mutex::new(ulid::Generator::new());
        // A poisoned lock only means another thread panicked while holding
        // it; the generator inside is still a valid last id.
        let mut ids = IDS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = match ids.generate() {
            Ok(id) => id,
            // 2^80 ids in one millisecond: carry into the next.
            Err(overflow) => overflow.commit_overflow_random(),
        };
        EventId(id)
    }

    /// Parses a ULID (case-insensitive Crockford base32).
    pub fn parse(s: &str) -> Result<EventId, EnvelopeError> {
        // 26 characters carry 130 bits: a first character above '7' does not
        // fit in 128 and the ulid crate would silently drop its top bits.
        if s.as_bytes().first().is_some_and(|&b| b > b'7') {
            return Err(EnvelopeError::EventId { input: truncate(s) });
        }
        Ulid::from_string(s)
            .map(EventId)
            .map_err(|_| EnvelopeError::EventId { input: truncate(s) })
    }

    /// A stable id for a legacy row (one without an event id): the row's
    /// creation time and row id, so it is the same on every retry and unique
    /// per row.
    pub fn for_legacy_row(created_at: Timestamp, row_id: i64) -> EventId {
        EventId(Ulid::from_parts(
            created_at.as_millis().max(0) as u64,
            row_id as u128,
        ))
    }

    /// The underlying ULID.
    pub fn ulid(&self) -> Ulid {
        self.0
    }
}

impl Default for EventId {
    fn default() -> Self {
        EventId::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for EventId {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventId::parse(s)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        EventId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn event_id_refuses_values_beyond_128_bits() {
        let max = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ";
        assert_eq!(EventId::parse(max).unwrap().to_string(), max);
        for bad in ["8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "ZZZZZZZZZZZZZZZZZZZZZZZZZZ"] {
            assert!(EventId::parse(bad).is_err(), "{bad} overflows a ULID");
        }
    }

    /// Ids minted in a row, even within one millisecond and from several
    /// threads, come out in increasing order (random ULIDs would not: a
    /// thousand of them share a few milliseconds).
    #[test]
    fn new_ids_increase_within_a_millisecond() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| EventId::new()).collect::<Vec<_>>()))
            .collect();
        let mut all = Vec::new();
        for t in threads {
            let ids = t.join().unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
            all.extend(ids);
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4000, "an id was minted twice");
    }

    proptest! {
        #[test]
        fn event_id_text_round_trips(n in any::<u128>()) {
            let id = EventId(Ulid(n));
            prop_assert_eq!(EventId::parse(&id.to_string()).unwrap(), id);
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<EventId>(&json).unwrap(), id);
        }
    }
}
