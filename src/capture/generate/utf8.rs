//! The fix trigger's text checks, as chains of `replace` that any SQLite
//! parses: the JSON escapes of control characters, and the reduction of
//! valid UTF-8 to ASCII that tells whether text is UTF-8.

use crate::capture::sqltext::literal;

/// A pattern matching text with a byte outside 0x01–0x7F (GLOB decodes
/// UTF-8, and every byte of 0x80 or more yields a code point above 0x7F).
pub(super) const NON_ASCII: &str = "'*[^'||char(1)||'-'||char(127)||']*'";

/// A pattern matching text with a control character that is not escaped
/// (all but tab, line feed, form feed, carriage return and backspace; NUL
/// is found with instr, since GLOB stops at it).
pub(super) const OTHER_CONTROL: &str =
    "'*['||char(1)||'-'||char(7)||char(11)||char(14)||'-'||char(31)||']*'";

/// The longest chain of nested `replace` calls put in one statement, well
/// inside the fixed parser stack of older SQLite (about 28 in a trigger).
pub(super) const CHAIN: usize = 16;

/// `replace(…replace(x, a1, b1)…, an, bn)`.
pub(super) fn chain(x: &str, steps: &[(String, String)]) -> String {
    steps.iter().fold(x.to_string(), |acc, (from, to)| {
        format!("replace({acc},{from},{to})")
    })
}

fn byte(b: u8) -> String {
    format!("x'{b:02x}'")
}

fn bytes(bs: &[u8]) -> String {
    let hex: String = bs.iter().map(|b| format!("{b:02x}")).collect();
    format!("x'{hex}'")
}

/// The JSON escapes of the control characters text usually holds (tab, line
/// feed, carriage return, backspace, form feed). Text with any other
/// control character is sent as hex, as is text holding NUL (`replace`
/// cannot match NUL: it treats a pattern starting with one as empty).
pub(super) fn control_escapes() -> Vec<(String, String)> {
    [
        (8u8, "\\b"),
        (9, "\\t"),
        (10, "\\n"),
        (12, "\\f"),
        (13, "\\r"),
    ]
    .iter()
    .map(|(c, esc)| (byte(*c), literal(esc)))
    .collect()
}

/// The steps that reduce valid UTF-8 to ASCII, in order; text is valid
/// UTF-8 exactly when no byte of 0x80 or more is left after them. `replace`
/// works on bytes, so:
/// 1. each byte is mapped to a representative of its class: continuation
///    bytes to 80, 90 or A0 (by the ranges E0, ED, F0 and F4 restrict their
///    second byte to), leads of two bytes to C2, of three to E1 (E0 and ED
///    keep their own), of four to F1 (F0 and F4 keep theirs). C0, C1 and
///    F5–FF, never valid, stay as they are;
/// 2. the restricted leads followed by an allowed second byte become the
///    unrestricted form (E0 A0 → E1 80, ED 80 → E1 80, …);
/// 3. the three continuation classes merge into 80;
/// 4. each complete sequence (C2 80, E1 80 80, F1 80 80 80) becomes one
///    ASCII byte. A replacement can never create a new match: it is ASCII,
///    and every pattern starts with a lead byte, which a match contains only
///    first.
///
/// Whatever stays above 0x7F is a stray continuation, a truncated or
/// overlong sequence, a surrogate, a value past U+10FFFF or a byte never
/// valid. (U+FFFE and U+FFFF pass, as Rust's UTF-8 check lets them.)
pub(crate) fn utf8_steps() -> Vec<(String, String)> {
    let mut steps = Vec::new();
    let mut map = |from: std::ops::RangeInclusive<u8>, to: u8| {
        for b in from {
            steps.push((byte(b), byte(to)));
        }
    };
    map(0x81..=0x8F, 0x80);
    map(0x91..=0x9F, 0x90);
    map(0xA1..=0xBF, 0xA0);
    map(0xC3..=0xDF, 0xC2);
    map(0xE2..=0xEC, 0xE1);
    map(0xEE..=0xEF, 0xE1);
    map(0xF2..=0xF3, 0xF1);
    for (from, to) in [
        (&[0xE0, 0xA0][..], &[0xE1, 0x80][..]),
        (&[0xED, 0x80], &[0xE1, 0x80]),
        (&[0xED, 0x90], &[0xE1, 0x80]),
        (&[0xF0, 0x90], &[0xF1, 0x80]),
        (&[0xF0, 0xA0], &[0xF1, 0x80]),
        (&[0xF4, 0x80], &[0xF1, 0x80]),
    ] {
        steps.push((bytes(from), bytes(to)));
    }
    steps.push((byte(0x90), byte(0x80)));
    steps.push((byte(0xA0), byte(0x80)));
    for seq in [
        &[0xC2, 0x80][..],
        &[0xE1, 0x80, 0x80],
        &[0xF1, 0x80, 0x80, 0x80],
    ] {
        steps.push((bytes(seq), "'u'".into()));
    }
    steps
}

/// Sequences of valid UTF-8 that text in Western languages mostly holds
/// (accented Latin letters, typographic quotes and dashes, the euro sign):
/// removed first, so that such text is checked in a few steps rather than
/// all of [`utf8_steps`]. Removing complete valid sequences keeps valid text
/// valid and invalid text invalid (the argument of step 4 there).
pub(super) fn common_utf8() -> Vec<(String, String)> {
    let latin = [
        0xA4u8, 0xB6, 0xBC, 0x9F, 0x84, 0x96, 0x9C, 0xA9, 0xA8, 0xA0, 0xA7, 0xAA, 0xB4, 0xAE, 0xB1,
        0xA1, 0xAD, 0xB3, 0xBA, 0xAB, 0xB2, 0xB9, 0xA2, 0x89,
    ];
    let mut steps: Vec<(String, String)> = latin
        .iter()
        .map(|b| (bytes(&[0xC3, *b]), "'u'".to_string()))
        .collect();
    for tail in [0x9C, 0x9D, 0x99, 0x98, 0x93, 0x94, 0xA6] {
        steps.push((bytes(&[0xE2, 0x80, tail]), "'u'".into()));
    }
    steps.push((bytes(&[0xE2, 0x82, 0xAC]), "'u'".into()));
    for b in [0xA0u8, 0xAB, 0xBB, 0xB0, 0xA9] {
        steps.push((bytes(&[0xC2, b]), "'u'".into()));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_utf8_steps_decide_exactly_what_rust_accepts() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let steps = utf8_steps();
        let mut sql = "SELECT CAST(?1 AS TEXT) AS p".to_string();
        for chunk in steps.chunks(CHAIN) {
            sql = format!("SELECT {} AS p FROM ({sql})", chain("p", chunk));
        }
        let sql = format!("SELECT NOT (p GLOB {NON_ASCII}) FROM ({sql})");
        let mut stmt = conn.prepare(&sql).unwrap();
        let mut check = |b: &[u8]| {
            let ok: bool = stmt.query_row([b], |r| r.get(0)).unwrap();
            assert_eq!(ok, std::str::from_utf8(b).is_ok(), "{b:02x?}");
        };
        // Every sequence of up to three bytes from the interesting classes.
        let probe = [
            0x01, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
            0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF,
        ];
        for &a in &probe {
            check(&[a]);
            for &b in &probe {
                check(&[a, b]);
                for &c in &probe {
                    check(&[a, b, c]);
                }
            }
        }
        for s in [
            "é",
            "“quoted”",
            "日本語",
            "🎉 emoji",
            "\u{FFFD}",
            "\u{10FFFF}",
            "\u{FFFF}",
            "\u{E000}",
        ] {
            check(s.as_bytes());
        }
        let mut four = |s: &[u8]| check(s);
        four(&[0xF0, 0x9F, 0x8E, 0x89]);
        four(&[0xF4, 0x90, 0x80, 0x80]); // past U+10FFFF
        four(&[0xED, 0xA0, 0x80]); // a surrogate
        four(&[0xF0, 0x80, 0x80, 0x80]); // overlong
        four(&[0xC2, 0x80, 0x80]); // one continuation too many
        four(&[0xE2, 0x82, 0x41]); // one too few
    }

    proptest::proptest! {
        #[test]
        fn the_utf8_steps_agree_with_rust_on_random_bytes(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24)) {
            let conn = rusqlite::Connection::open_in_memory().unwrap();
            let mut sql = "SELECT CAST(?1 AS TEXT) AS p".to_string();
            for chunk in utf8_steps().chunks(CHAIN) {
                sql = format!("SELECT {} AS p FROM ({sql})", chain("p", chunk));
            }
            let ok: bool = conn
                .query_row(&format!("SELECT NOT (p GLOB {NON_ASCII}) FROM ({sql})"), [&b], |r| r.get(0))
                .unwrap();
            // NUL ends GLOB's view of the text; the event view's trigger
            // sends text with NUL as hex before this check.
            if !b.contains(&0) {
                proptest::prop_assert_eq!(ok, std::str::from_utf8(&b).is_ok());
            }
        }
    }
}
