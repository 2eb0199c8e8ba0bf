//! Clipping text that others wrote (a producer's malformed value, a
//! consumer's failure reason) to a bounded size before it goes into a
//! message, a log line or a dead letter, so no row or consumer can flood
//! them. The one place this is done.

use std::borrow::Cow;

/// The mark left where text was cut.
pub const ELLIPSIS: &str = "…";

/// Which end of a long text to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The start (a value, a message that leads with its point).
    Head,
    /// The end (a log's or an error chain's tail, where the cause is).
    Tail,
}

/// `s` itself when it has at most `max` bytes; otherwise its head or tail,
/// cut on a character boundary, with [`ELLIPSIS`] where text was dropped,
/// in at most `max` bytes all told (unless `max` is smaller than the mark).
///
/// ```
/// use outboxd::text::{clip, Keep};
/// assert_eq!(clip("short", 10, Keep::Head), "short");
/// assert_eq!(clip("abcdefgh", 7, Keep::Head), "abcd…");
/// assert_eq!(clip("abcdefgh", 7, Keep::Tail), "…efgh");
/// assert_eq!(clip("ééé", 5, Keep::Head), "é…"); // never half a character
/// ```
pub fn clip(s: &str, max: usize, keep: Keep) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let room = max.saturating_sub(ELLIPSIS.len());
    match keep {
        Keep::Head => {
            let mut end = room;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Cow::Owned(format!("{}{ELLIPSIS}", &s[..end]))
        }
        Keep::Tail => {
            let mut start = s.len() - room;
            while !s.is_char_boundary(start) {
                start += 1;
            }
            Cow::Owned(format!("{ELLIPSIS}{}", &s[start..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cuts_on_character_boundaries() {
        let s = "ééé"; // 6 bytes
        assert_eq!(clip(s, 6, Keep::Head), "ééé");
        assert_eq!(clip(s, 5, Keep::Head), "é…");
        assert_eq!(clip(s, 5, Keep::Tail), "…é");
        assert_eq!(clip(s, 4, Keep::Head), "…");
        assert_eq!(clip("aéé", 5, Keep::Head), "aéé");
        assert_eq!(clip("aéé", 4, Keep::Head), "a…");
    }

    proptest! {
        #[test]
        fn never_longer_than_max_and_keeps_the_chosen_end(s in ".{0,40}", max in 3usize..30) {
            for keep in [Keep::Head, Keep::Tail] {
                let c = clip(&s, max, keep);
                prop_assert!(c.len() <= max);
                if s.len() <= max {
                    prop_assert_eq!(&*c, s.as_str());
                } else if keep == Keep::Head {
                    prop_assert!(s.starts_with(c.trim_end_matches(ELLIPSIS)));
                } else {
                    prop_assert!(s.ends_with(c.trim_start_matches(ELLIPSIS)));
                }
            }
        }
    }
}
