//! Value types the sections share, each refusing a wrong value while the
//! file is parsed, with its line: durations and bounded whole numbers.

use std::time::Duration;

use outboxd::clock::parse_duration;
use serde::Deserialize;

/// A duration written as `500ms`, `30s`, `5m`, `2h` or `1d`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dur(pub(crate) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dur;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration in quotes, such as \"30s\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// A whole number from `LO` to `HI` (`u64::MAX`: no upper bound), the
/// range the setting allows (the library's constants): a wrong type or a
/// number outside it is refused while parsing, with the line, in the
/// setting's own range ("expected a whole number from 1 to 1000"), not the
/// range of the Rust type that holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Whole<const LO: u64, const HI: u64>(pub(crate) u64);

impl<const LO: u64, const HI: u64> Whole<LO, HI> {
    /// The value as a `usize` (every bound outboxd uses fits in one).
    pub(crate) fn get(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl<'de, const LO: u64, const HI: u64> Deserialize<'de> for Whole<LO, HI> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<const LO: u64, const HI: u64>;
        impl<const LO: u64, const HI: u64> serde::de::Visitor<'_> for Visitor<LO, HI> {
            type Value = Whole<LO, HI>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                if HI == u64::MAX {
                    write!(f, "a whole number ({LO} or more)")
                } else {
                    write!(f, "a whole number from {LO} to {HI}")
                }
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                if (LO..=HI).contains(&n) {
                    Ok(Whole(n))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
                }
            }
            // TOML hands over a number past 64 bits as 128 bits: out of
            // range, said with the number as written.
            fn visit_i128<E: serde::de::Error>(self, n: i128) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(too_large(n, &self)),
                }
            }
            fn visit_u128<E: serde::de::Error>(self, n: u128) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(too_large(n, &self)),
                }
            }
        }
        fn too_large<E: serde::de::Error>(
            n: impl std::fmt::Display,
            expected: &dyn serde::de::Expected,
        ) -> E {
            let found = format!("integer `{n}`");
            E::invalid_value(serde::de::Unexpected::Other(&found), expected)
        }
        d.deserialize_u64(Visitor::<LO, HI>)
    }
}
