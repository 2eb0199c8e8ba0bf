//! `tracestate`: the vendors' list that travels beside a `traceparent`,
//! checked against W3C Trace Context's grammar and passed on unchanged.

use std::fmt;

use super::TraceError;

/// The longest `tracestate` kept, in bytes: the length W3C Trace Context
/// asks every vendor to propagate, and a bound on what a row can make a
/// sink send.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// The most list members W3C Trace Context allows.
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A valid `tracestate` list, as given (surrounding whitespace trimmed).
///
/// ```
/// use outboxd::trace::TraceState;
/// let s = TraceState::parse("congo=t61rcWkgMzE, rojo@vendor=00f067aa0ba902b7").unwrap().unwrap();
/// assert_eq!(s.as_str(), "congo=t61rcWkgMzE, rojo@vendor=00f067aa0ba902b7");
/// assert!(TraceState::parse("Upper=1").is_err());
/// assert!(TraceState::parse(" ").unwrap().is_none());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceState(String);

impl TraceState {
    /// Checks a list: at most [`MAX_TRACESTATE_LEN`] bytes and
    /// [`MAX_TRACESTATE_MEMBERS`] members, each `key=value` with a key of
    /// lowercase letters, digits and `_-*/` (or `tenant@system`) and a
    /// value of printable ASCII without `,` and `=`, no key twice. `Ok(None)`
    /// for a list with no members (blank, or only commas).
    pub fn parse(s: &str) -> Result<Option<TraceState>, TraceError> {
        let bad = |reason| TraceError::Tracestate {
            input: crate::text::clip(s, 80, crate::text::Keep::Head).into_owned(),
            reason,
        };
        let trimmed = s.trim_matches(|c| c == ' ' || c == '\t');
        if trimmed.len() > MAX_TRACESTATE_LEN {
            return Err(bad("longer than 512 characters"));
        }
        let mut keys: Vec<&str> = Vec::new();
        for member in trimmed.split(',') {
            let member = member.trim_matches(|c| c == ' ' || c == '\t');
            if member.is_empty() {
                continue;
            }
            let (key, value) = member
                .split_once('=')
                .ok_or(bad("a member is not key=value"))?;
            if !valid_key(key) {
                return Err(bad(
                    "a key is not lowercase letters, digits and _-*/ (or tenant@system)",
                ));
            }
            if !valid_value(value) {
                return Err(bad(
                    "a value is empty, too long, or not printable ASCII without , and =",
                ));
            }
            if keys.contains(&key) {
                return Err(bad("a key appears twice"));
            }
            keys.push(key);
            if keys.len() > MAX_TRACESTATE_MEMBERS {
                return Err(bad("more than 32 members"));
            }
        }
        Ok((!keys.is_empty()).then(|| TraceState(trimmed.to_string())))
    }

    /// The list as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TraceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TraceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceState({:?})", self.0)
    }
}

fn key_char(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'*' | b'/')
}

/// `simple-key` or `tenant-id@system-id`.
fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    match key.split_once('@') {
        None => {
            (1..=256).contains(&b.len())
                && b[0].is_ascii_lowercase()
                && b.iter().all(|&c| key_char(c))
        }
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            (1..=241).contains(&t.len())
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t.iter().all(|&c| key_char(c))
                && (1..=14).contains(&s.len())
                && s[0].is_ascii_lowercase()
                && s.iter().all(|&c| key_char(c))
        }
    }
}

/// 1 to 256 characters of 0x20-0x7E but `,` and `=`, not ending in a space.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    (1..=256).contains(&b.len())
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_follow_the_grammar() {
        for good in [
            "a=1",
            "a=1,b=2",
            "a=1 ,\t b=2",
            ",a=1,,",
            "0tenant@sys=x y",
            "a-b_c*d/e=~!",
        ] {
            assert!(matches!(TraceState::parse(good), Ok(Some(_))), "{good:?}");
        }
        let too_many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let too_long = format!("a={}", "x".repeat(511));
        for bad in [
            "A=1",
            "a",
            "a=",
            "a=1,a=2",
            "1a=1",
            "a=b=c",
            "a@=1",
            "a@ABC=1",
            "a@systemtoolongxy=1",
            "a=\u{e9}",
            &too_many,
            &too_long,
        ] {
            assert!(TraceState::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(TraceState::parse(" , ").unwrap(), None);
    }
}
