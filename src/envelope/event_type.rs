//! [`EventType`]: parsing and validating `<domain>.<verb>.v<N>`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{truncate, EnvelopeError};

/// Longest event type accepted, in bytes.
pub const MAX_EVENT_TYPE_LEN: usize = 255;

/// A validated event type, `<domain>.<verb>.v<N>`: at least a domain and a
/// verb, lowercase segments of letters, digits and underscores, and a version
/// of 1 or more without leading zeros.
///
/// ```
/// use outboxd::EventType;
/// let t = EventType::parse("article.created.v2").unwrap();
/// assert_eq!(t.version(), 2);
/// assert_eq!(t.name(), "article.created");
/// assert!(EventType::parse("Article.created.v1").is_err());
/// assert!(EventType::parse("article.v1").is_err());
/// assert!(EventType::parse("article.created.v0").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventType {
    full: String,
    version: u32,
}

impl EventType {
    /// Parses and validates an event type.
    pub fn parse(s: &str) -> Result<EventType, EnvelopeError> {
        let fail = |reason| EnvelopeError::EventType {
            input: truncate(s),
            reason,
        };
        if s.is_empty() {
            return Err(fail("it is empty"));
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Err(fail("it is longer than 255 bytes"));
        }
        // One pass over the bytes, no allocation (this runs for every event
        // enqueued): the segments before the last dot are names, checked in
        // order, each for emptiness and then for its characters.
        let Some(last_dot) = s.rfind('.') else {
            return Err(fail("it needs a domain, a verb and a version"));
        };
        let (names, version) = (&s[..last_dot], &s[last_dot + 1..]);
        if !names.contains('.') {
            return Err(fail("it needs a domain, a verb and a version"));
        }
        let mut segment_start = 0;
        for (i, &b) in names.as_bytes().iter().enumerate() {
            if b == b'.' {
                if i == segment_start {
                    return Err(fail("it has an empty segment"));
                }
                segment_start = i + 1;
            } else if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
                return Err(fail("a segment has a character other than a-z, 0-9 or _"));
            }
        }
        if segment_start == names.len() {
            return Err(fail("it has an empty segment"));
        }
        let digits = version
            .strip_prefix('v')
            .ok_or_else(|| fail("the last segment is not a version such as v1"))?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail("the last segment is not a version such as v1"));
        }
        if digits.starts_with('0') {
            return Err(fail("the version must be 1 or more, without leading zeros"));
        }
        let version: u32 = digits
            .parse()
            .map_err(|_| fail("the version is too large"))?;
        Ok(EventType {
            full: s.to_string(),
            version,
        })
    }

    /// The whole type, `article.created.v1`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The type without its version, `article.created`.
    pub fn name(&self) -> &str {
        let cut = self.full.rfind('.').expect("validated");
        &self.full[..cut]
    }

    /// The version from the suffix.
    pub fn version(&self) -> u32 {
        self.version
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for EventType {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::parse(s)
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.full)
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        EventType::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn event_type_examples() {
        for ok in [
            "a.b.v1",
            "article.created.v1",
            "shop_2.order.paid.v10",
            "x.y.v4294967295",
        ] {
            assert!(EventType::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a.v1",
            "a.b",
            "a.b.1",
            "a.b.v",
            "a.b.v0",
            "a.b.v01",
            "A.b.v1",
            "a..b.v1",
            "a.b-c.v1",
            "a.b.v1 ",
            ".a.b.v1",
            "a.b.v4294967296",
            "a.b.V1",
        ] {
            assert!(EventType::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// The reading `EventType::parse` replaced (split into a list of
    /// segments, then check each): the one-pass parser must give the same
    /// verdict and the same reason for every input.
    fn reason_by_segment_list(s: &str) -> Option<&'static str> {
        if s.is_empty() {
            return Some("it is empty");
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Some("it is longer than 255 bytes");
        }
        let segments: Vec<&str> = s.split('.').collect();
        if segments.len() < 3 {
            return Some("it needs a domain, a verb and a version");
        }
        let (version, names) = segments.split_last().unwrap();
        for seg in names {
            if seg.is_empty() {
                return Some("it has an empty segment");
            }
            if !seg
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Some("a segment has a character other than a-z, 0-9 or _");
            }
        }
        let Some(digits) = version.strip_prefix('v') else {
            return Some("the last segment is not a version such as v1");
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Some("the last segment is not a version such as v1");
        }
        if digits.starts_with('0') {
            return Some("the version must be 1 or more, without leading zeros");
        }
        digits
            .parse::<u32>()
            .err()
            .map(|_| "the version is too large")
    }

    fn reason(s: &str) -> Option<&'static str> {
        match EventType::parse(s) {
            Ok(_) => None,
            Err(EnvelopeError::EventType { reason, .. }) => Some(reason),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_parser_gives_each_reason_as_before() {
        for s in [
            "",
            "a",
            "a.b",
            ".b.v1",
            "a..v1",
            "a.b.",
            "A.b.v1",
            "a.B..v1",
            "a..B.v1",
            "a.b.c",
            "a.b.v",
            "a.b.v01",
            "a.b.v0",
            "a.b.v99999999999",
            "a.b.v1",
            "a.b.c.v2",
            "a.b.1",
            "...",
            "a.b.v1.",
            "é.b.v1",
        ] {
            assert_eq!(reason(s), reason_by_segment_list(s), "{s:?}");
        }
    }

    proptest! {
        #[test]
        fn valid_types_parse_and_keep_their_parts(
            names in proptest::collection::vec("[a-z0-9_]{1,8}", 2..5),
            version in 1u32..100_000,
        ) {
            let s = format!("{}.v{}", names.join("."), version);
            let t = EventType::parse(&s).unwrap();
            prop_assert_eq!(t.version(), version);
            prop_assert_eq!(t.name(), names.join("."));
            prop_assert_eq!(t.as_str(), s.as_str());
        }

        #[test]
        fn parser_never_panics_and_accepts_only_the_grammar(s in "\\PC{0,40}") {
            if let Ok(t) = EventType::parse(&s) {
                let segs: Vec<&str> = s.split('.').collect();
                prop_assert!(segs.len() >= 3);
                prop_assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.'));
                prop_assert_eq!(format!("v{}", t.version()), *segs.last().unwrap());
            }
        }

        #[test]
        fn the_parser_agrees_with_the_segment_list_reading(s in "[a-zA-Z0-9_.v]{0,12}") {
            prop_assert_eq!(reason(&s), reason_by_segment_list(&s));
        }
    }
}
