//! Which consumers take which event types.

use crate::error::{Error, Result};

/// An event-type pattern: an exact type (`article.created.v1`) or one with
/// `*` segments. A `*` stands for one or more whole segments, so
/// `article.*.v1` takes every v1 article event and `*.v2` every v2 event;
/// a lone `*` takes everything.
///
/// ```
/// use outboxd::router::Pattern;
/// let p = Pattern::parse("article.*.v1").unwrap();
/// assert!(p.matches("article.created.v1"));
/// assert!(p.matches("article.comment.added.v1"));
/// assert!(!p.matches("article.created.v2"));
/// assert!(Pattern::parse("*.v2").unwrap().matches("user.deleted.v2"));
/// assert!(Pattern::parse("Article.*").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

impl Pattern {
    /// Parses a pattern: dot-separated segments, each `*` or lowercase
    /// a-z, 0-9 and `_`.
    pub fn parse(s: &str) -> Result<Pattern> {
        let bad = |reason: &str| Error::InvalidSetting {
            field: "event type pattern",
            reason: format!(
                "{s:?}: {reason}; use an event type such as article.created.v1, \
                 or * for one or more segments (article.*.v1, *.v2, *)"
            ),
        };
        if s.is_empty() {
            return Err(bad("it is empty"));
        }
        let mut segments = Vec::new();
        for seg in s.split('.') {
            if seg == "*" {
                if segments.last() == Some(&Segment::Any) {
                    return Err(bad("two * in a row"));
                }
                segments.push(Segment::Any);
            } else if !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                segments.push(Segment::Literal(seg.to_string()));
            } else {
                return Err(bad(
                    "a segment is empty or has a character other than a-z, 0-9, _",
                ));
            }
        }
        Ok(Pattern {
            text: s.to_string(),
            segments,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the event type matches.
    pub fn matches(&self, event_type: &str) -> bool {
        let parts: Vec<&str> = event_type.split('.').collect();
        match_from(&self.segments, &parts)
    }
}

fn match_from(pattern: &[Segment], parts: &[&str]) -> bool {
    match pattern.split_first() {
        None => parts.is_empty(),
        Some((Segment::Literal(l), rest)) => {
            parts.first() == Some(&l.as_str()) && match_from(rest, &parts[1..])
        }
        // One or more segments: try every split.
        Some((Segment::Any, rest)) => (1..=parts.len()).any(|n| match_from(rest, &parts[n..])),
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let m = |p: &str, t: &str| Pattern::parse(p).unwrap().matches(t);
        assert!(m("a.b.v1", "a.b.v1"));
        assert!(!m("a.b.v1", "a.b.v2"));
        assert!(m("*", "a.b.v1"));
        assert!(m("a.*", "a.b.v1"));
        assert!(!m("a.*", "a"));
        assert!(m("*.v1", "x.y.z.v1"));
        assert!(!m("*.b.v1", "b.v1"));
        for bad in ["", "a..b", "A.b", "a.**.b", "a.*.*.v1", "a b"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
    }
}
