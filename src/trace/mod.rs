//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` a producer stores with its event, and the
//! child each delivery attempt sends on.
//!
//! The row keeps the producer's context; every attempt gets a child of it
//! ([`TraceContext::child`]: a new span id, the same trace id, the
//! `sampled` flag kept) in its transport metadata only (headers, the
//! command's environment, the sql sink's parameters), never in the
//! envelope. A value that breaks the rules below is refused by the `Event`
//! builder and, in a row a foreign producer wrote, dropped with a warning
//! when the row is delivered (never a dead letter).
//!
//! ```
//! use outboxd::trace::TraceParent;
//! let p: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
//! let c = p.child();
//! assert_eq!(c.trace_id(), p.trace_id());
//! assert_ne!(c.span_id(), p.span_id());
//! assert!(c.sampled());
//! assert!("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01".parse::<TraceParent>().is_err());
//! ```

#[cfg(feature = "otel")]
mod otel;
mod state;

use std::fmt;
use std::str::FromStr;

#[cfg(feature = "otel")]
pub use otel::{current, opentelemetry, tracing_opentelemetry};
pub use state::{TraceState, MAX_TRACESTATE_LEN, MAX_TRACESTATE_MEMBERS};

/// Why a `traceparent` or `tracestate` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Not a version-00 `traceparent`.
    #[error(
        "invalid traceparent {input:?}: {reason}; expected 00-<32 lowercase hex trace id>-\
         <16 lowercase hex parent id>-<2 lowercase hex flags>, ids not all zero"
    )]
    Traceparent {
        /// The value as given (clipped).
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Not a `tracestate` list.
    #[error(
        "invalid tracestate {input:?}: {reason}; expected at most 32 comma-separated key=value \
         members, {MAX_TRACESTATE_LEN} characters in all"
    )]
    Tracestate {
        /// The value as given (clipped).
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A stored value that is not text.
    #[error("column {column} is not text in UTF-8")]
    NotText {
        /// The column's name.
        column: &'static str,
    },
}

/// A version-00 `traceparent`: trace id, parent (span) id and flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

/// The `sampled` bit of the flags.
const SAMPLED: u8 = 0x01;

/// The flags a child keeps: `sampled`, and Level 2's `random` (it says
/// how the trace id, which the child keeps, was made).
const KEPT_FLAGS: u8 = 0x03;

impl TraceParent {
    /// A context from its parts; `None` when an id is all zeros (which
    /// W3C Trace Context forbids).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<TraceParent> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceParent {
            trace_id,
            span_id,
            flags: if sampled { SAMPLED } else { 0 },
        })
    }

    /// Parses a version-00 value: exactly 55 characters, lowercase hex,
    /// neither id all zeros. Other versions are refused rather than guessed
    /// at, so what is stored is what is sent.
    pub fn parse(s: &str) -> Result<TraceParent, TraceError> {
        let bad = |reason| TraceError::Traceparent {
            input: crate::text::clip(s, 80, crate::text::Keep::Head).into_owned(),
            reason,
        };
        let b = s.as_bytes();
        if b.len() != 55 {
            return Err(bad("not 55 characters long"));
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(bad("the fields are not separated by '-' at 2, 35 and 52"));
        }
        let mut version = [0u8; 1];
        hex_into(&b[0..2], &mut version).ok_or(bad("the version is not lowercase hex"))?;
        if version[0] != 0 {
            return Err(bad("the version is not 00"));
        }
        let mut p = TraceParent {
            trace_id: [0; 16],
            span_id: [0; 8],
            flags: 0,
        };
        hex_into(&b[3..35], &mut p.trace_id).ok_or(bad("the trace id is not lowercase hex"))?;
        hex_into(&b[36..52], &mut p.span_id).ok_or(bad("the parent id is not lowercase hex"))?;
        let mut flags = [0u8; 1];
        hex_into(&b[53..55], &mut flags).ok_or(bad("the flags are not lowercase hex"))?;
        p.flags = flags[0];
        if p.trace_id == [0; 16] {
            return Err(bad("the trace id is all zeros"));
        }
        if p.span_id == [0; 8] {
            return Err(bad("the parent id is all zeros"));
        }
        Ok(p)
    }

    /// A child: the same trace id, a new random span id, the `sampled`
    /// (and `random`) flag kept, any other flag bit cleared.
    pub fn child(&self) -> TraceParent {
        let mut span_id = [0; 8];
        while span_id == [0; 8] {
            span_id = rand::random();
        }
        TraceParent {
            trace_id: self.trace_id,
            span_id,
            flags: self.flags & KEPT_FLAGS,
        }
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent (span) id, 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// The trace id's bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span id's bytes.
    pub fn span_id_bytes(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether the producer's sampler recorded the trace.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.flags
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

impl FromStr for TraceParent {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceParent::parse(s)
    }
}

/// A `traceparent` with the `tracestate` that goes with it: what a row
/// stores, and what one delivery attempt sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The position in the trace.
    pub traceparent: TraceParent,
    /// Vendors' state, passed on unchanged.
    pub tracestate: Option<TraceState>,
    /// The span id of the context this one is a [`child`](Self::child) of
    /// (the producer's, for a delivery attempt's); `None` for a context as
    /// stored.
    pub parent_span_id: Option<[u8; 8]>,
}

impl TraceContext {
    /// The context of one delivery attempt: a [`TraceParent::child`], the
    /// state unchanged.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            traceparent: self.traceparent.child(),
            tracestate: self.tracestate.clone(),
            parent_span_id: Some(self.traceparent.span_id),
        }
    }

    /// The context as W3C's header names and values: `traceparent`, then
    /// `tracestate` when there is one. Every sink sends these pairs, under
    /// these names or its transport's spelling of them.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        std::iter::once(("traceparent", self.traceparent.to_string())).chain(
            self.tracestate
                .as_ref()
                .map(|s| ("tracestate", s.as_str().to_string())),
        )
    }

    /// The context stored in a row's `traceparent` and `tracestate`
    /// columns (text, a UTF-8 blob, or NULL), and what was dropped from
    /// them. An invalid traceparent drops the whole context (W3C: state
    /// means nothing without its parent), an invalid tracestate only
    /// itself; a tracestate without a traceparent is ignored.
    pub fn from_columns(
        traceparent: rusqlite::types::ValueRef<'_>,
        tracestate: rusqlite::types::ValueRef<'_>,
    ) -> (Option<TraceContext>, Option<TraceError>) {
        let parent = match column_text(traceparent, "traceparent") {
            Ok(None) => return (None, None),
            Ok(Some(text)) => TraceParent::parse(text),
            Err(e) => Err(e),
        };
        let traceparent = match parent {
            Ok(p) => p,
            Err(e) => return (None, Some(e)),
        };
        let (tracestate, dropped) =
            match column_text(tracestate, "tracestate").and_then(|s| match s {
                Some(s) => TraceState::parse(s),
                None => Ok(None),
            }) {
                Ok(state) => (state, None),
                Err(e) => (None, Some(e)),
            };
        let context = TraceContext {
            traceparent,
            tracestate,
            parent_span_id: None,
        };
        (Some(context), dropped)
    }
}

fn column_text<'a>(
    v: rusqlite::types::ValueRef<'a>,
    column: &'static str,
) -> Result<Option<&'a str>, TraceError> {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => Ok(None),
        ValueRef::Text(b) | ValueRef::Blob(b) => std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| TraceError::NotText { column }),
        _ => Err(TraceError::NotText { column }),
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// Lowercase hex digits into bytes; `None` at any other character.
fn hex_into(digits: &[u8], out: &mut [u8]) -> Option<()> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (pair, byte) in digits.chunks_exact(2).zip(out.iter_mut()) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_and_its_child_keeps_the_trace() {
        let p = TraceParent::parse(GOOD).unwrap();
        assert_eq!(p.to_string(), GOOD);
        assert_eq!(p.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id(), "00f067aa0ba902b7");
        let c = p.child();
        assert_eq!(c.trace_id(), p.trace_id());
        assert_ne!(c.span_id(), p.span_id());
        assert!(c.sampled());
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(!unsampled.child().sampled());
        // Unknown flag bits are not passed on; sampled and random are.
        let flags = TraceParent::parse(&GOOD.replace("-01", "-ff")).unwrap();
        assert_eq!(flags.child().flags(), 0x03);
    }

    #[test]
    fn every_rule_of_version_00_is_enforced() {
        let zeros_trace = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        let zeros_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for bad in [
            "",
            &GOOD.to_uppercase(),
            &GOOD.replace("00-4b", "01-4b"),
            &GOOD.replace("00-4b", "ff-4b"),
            &format!("{GOOD}-extra"),
            &GOOD.replace('-', "_"),
            &GOOD.replace("-01", "-0g"),
            &GOOD.replace("4bf9", "4bfz"),
            &zeros_trace,
            zeros_span,
        ] {
            assert!(TraceParent::parse(bad).is_err(), "{bad:?}");
        }
    }
}
