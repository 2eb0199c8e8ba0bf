//! Small pieces of SQL text: quoting, and rewriting the row a condition
//! refers to (a `when` written for `OLD` evaluated on a table alias).

/// `name` as an SQL identifier: `"name"`, with `"` doubled.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal: `'text'`, with `'` doubled.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// One token of SQL, as far as rewriting needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A bare or quoted identifier (or keyword).
    Ident,
    /// A string or blob literal, a comment, a number, white space.
    Opaque,
    /// One character of punctuation.
    Punct(char),
}

/// Splits SQL into tokens: enough to find identifiers outside strings,
/// quoted names and comments. Unterminated quotes run to the end.
fn tokens(sql: &str) -> Vec<(Kind, &str)> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let until = |from: usize, end: &[u8]| -> usize {
        sql.as_bytes()[from..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(sql.len(), |p| from + p + end.len())
    };
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b'\'' | b'"' | b'`' => {
                // Quotes are escaped by doubling.
                i += 1;
                loop {
                    match bytes.get(i) {
                        None => break,
                        Some(&q) if q == c && bytes.get(i + 1) == Some(&c) => i += 2,
                        Some(&q) if q == c => {
                            i += 1;
                            break;
                        }
                        Some(_) => i += 1,
                    }
                }
                if c == b'\'' {
                    Kind::Opaque
                } else {
                    Kind::Ident
                }
            }
            b'[' => {
                i = until(i, b"]");
                Kind::Ident
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = until(i, b"\n");
                Kind::Opaque
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = until(i + 2, b"*/");
                Kind::Opaque
            }
            b'x' | b'X' if bytes.get(i + 1) == Some(&b'\'') => {
                i = until(i + 2, b"'");
                Kind::Opaque
            }
            c if c.is_ascii_whitespace() => {
                while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
                    i += 1;
                }
                Kind::Opaque
            }
            c if c.is_ascii_digit() => {
                while bytes
                    .get(i)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'.' || *b == b'_')
                {
                    i += 1;
                }
                Kind::Opaque
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                while bytes.get(i).is_some_and(|b| {
                    b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$' || *b >= 0x80
                }) {
                    i += 1;
                }
                Kind::Ident
            }
            c => {
                i += 1;
                Kind::Punct(c as char)
            }
        };
        out.push((kind, &sql[start..i]));
    }
    out
}

/// The name an identifier token stands for, unquoted.
fn name_of(token: &str) -> String {
    let b = token.as_bytes();
    match b.first() {
        Some(b'"') | Some(b'`') => {
            let q = token[..1].to_string();
            let inner = token[1..].strip_suffix(q.as_str()).unwrap_or(&token[1..]);
            inner.replace(&format!("{q}{q}"), &q)
        }
        Some(b'[') => token[1..].trim_end_matches(']').to_string(),
        _ => token.to_string(),
    }
}

/// Rewrites `row.column` references: every identifier `from` (any case,
/// quoted or not) directly followed by a `.` becomes `to`. Used to evaluate
/// a delete's `when` (written for `OLD`) on a row read from the table.
pub(crate) fn rename_row(sql: &str, from: &str, to: &str) -> String {
    let toks = tokens(sql);
    let mut out = String::with_capacity(sql.len());
    for (i, (kind, text)) in toks.iter().enumerate() {
        let next_is_dot = toks
            .iter()
            .skip(i + 1)
            .find(|(k, t)| !(*k == Kind::Opaque && t.trim().is_empty()))
            .is_some_and(|(k, _)| *k == Kind::Punct('.'));
        let prev_is_dot = toks[..i]
            .iter()
            .rev()
            .find(|(k, t)| !(*k == Kind::Opaque && t.trim().is_empty()))
            .is_some_and(|(k, _)| *k == Kind::Punct('.'));
        if *kind == Kind::Ident
            && next_is_dot
            && !prev_is_dot
            && name_of(text).eq_ignore_ascii_case(from)
        {
            out.push_str(to);
        } else {
            out.push_str(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(ident(r#"we"ird"#), r#""we""ird""#);
        assert_eq!(literal("it's"), "'it''s'");
    }

    #[test]
    fn renames_only_row_references() {
        let w = r#"OLD.status = 'OLD.x' AND old . "id" > 0 AND "OLD".a -- OLD.b
                   AND [old].c /* OLD.d */ AND oldish.e AND t.old.f AND lower(OLD.g)"#;
        assert_eq!(
            rename_row(w, "old", "o"),
            r#"o.status = 'OLD.x' AND o . "id" > 0 AND o.a -- OLD.b
                   AND o.c /* OLD.d */ AND oldish.e AND t.old.f AND lower(o.g)"#
        );
    }

    #[test]
    fn tokens_cover_the_input() {
        for s in [
            "'unterminated",
            "\"x",
            "[a",
            "/* x",
            "-- y",
            "x'00",
            "1.5e3",
            "é.x",
            "",
        ] {
            let joined: String = tokens(s).iter().map(|(_, t)| *t).collect();
            assert_eq!(joined, s);
        }
    }
}
