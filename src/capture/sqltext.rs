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

/// One token: its kind, its text, and whether it is closed (a string,
/// quoted name or comment that runs to the end of the input is not; nor is
/// a `--` comment, which would swallow whatever follows it on its line).
type Token<'a> = (Kind, &'a str, bool);

/// Splits SQL into tokens: enough to find identifiers outside strings,
/// quoted names and comments. Unterminated quotes run to the end.
fn tokens(sql: &str) -> Vec<Token<'_>> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    // The end of the token that `end` closes, and whether it was found.
    let until = |from: usize, end: &[u8]| -> (usize, bool) {
        sql.as_bytes()[from..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or((sql.len(), false), |p| (from + p + end.len(), true))
    };
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let mut closed = true;
        let kind = match c {
            b'\'' | b'"' | b'`' => {
                // Quotes are escaped by doubling.
                i += 1;
                closed = false;
                loop {
                    match bytes.get(i) {
                        None => break,
                        Some(&q) if q == c && bytes.get(i + 1) == Some(&c) => i += 2,
                        Some(&q) if q == c => {
                            i += 1;
                            closed = true;
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
                (i, closed) = until(i, b"]");
                Kind::Ident
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                (i, closed) = until(i, b"\n");
                Kind::Opaque
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                (i, closed) = until(i + 2, b"*/");
                Kind::Opaque
            }
            b'x' | b'X' if bytes.get(i + 1) == Some(&b'\'') => {
                (i, closed) = until(i + 2, b"'");
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
        out.push((kind, &sql[start..i], closed));
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
    for (i, (kind, text, _)) in toks.iter().enumerate() {
        let next_is_dot = toks
            .iter()
            .skip(i + 1)
            .find(|(k, t, _)| !(*k == Kind::Opaque && t.trim().is_empty()))
            .is_some_and(|(k, _, _)| *k == Kind::Punct('.'));
        let prev_is_dot = toks[..i]
            .iter()
            .rev()
            .find(|(k, t, _)| !(*k == Kind::Opaque && t.trim().is_empty()))
            .is_some_and(|(k, _, _)| *k == Kind::Punct('.'));
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

/// Whether `sql` refers to `row.column` for the row `row` (any case,
/// quoted or not): a condition that reads OLD.
pub(crate) fn refers_to(sql: &str, row: &str) -> bool {
    rename_row(sql, row, "\u{1}") != sql
}

/// Checks that `sql` is at most one expression when capture pastes it
/// between parentheses (a trigger's `WHEN (…)`, `CASE WHEN (…)`, `WHERE
/// … AND (…)`): it holds no `;` (the end of a statement), never closes a
/// parenthesis it did not open, and ends outside any string, quoted name
/// or comment. Text that passes cannot reach outside its parentheses, so
/// it cannot end the `CREATE TRIGGER` early or add a statement after it;
/// SQLite then decides whether it is a valid expression.
pub(crate) fn check_expression(sql: &str) -> Result<(), String> {
    if sql.contains('\0') {
        return Err("it holds a NUL character".into());
    }
    let mut depth = 0usize;
    for (kind, text, closed) in tokens(sql) {
        if !closed {
            let inside = match text.as_bytes().first() {
                Some(b'-') => "a -- comment that runs to its end (end the comment with a new line, or remove it)",
                Some(b'/') => "an unterminated /* comment",
                Some(b'[') | Some(b'"') | Some(b'`') => "an unterminated quoted name",
                _ => "an unterminated string",
            };
            return Err(format!("it ends inside {inside}"));
        }
        match kind {
            Kind::Punct(';') => {
                return Err("it holds a `;`: it must be one SQL condition, not statements".into())
            }
            Kind::Punct('(') => depth += 1,
            Kind::Punct(')') => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    "it closes a parenthesis it did not open: it must be one SQL condition"
                        .to_string()
                })?;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("a parenthesis it opens is never closed".into());
    }
    Ok(())
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
    fn finds_row_references() {
        assert!(refers_to("NEW.live = 1 AND (OLD.live IS NULL)", "old"));
        assert!(refers_to("\"old\" . x", "old"));
        assert!(!refers_to("NEW.live = 'OLD.live' /* OLD.x */", "old"));
        assert!(!refers_to("NEW.old_value = 1", "old"));
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
            let joined: String = tokens(s).iter().map(|(_, t, _)| *t).collect();
            assert_eq!(joined, s);
        }
    }

    #[test]
    fn an_expression_cannot_reach_outside_its_parentheses() {
        for ok in [
            "NEW.status = 'published'",
            "NEW.a IN (SELECT x FROM t WHERE y = ';')",
            "\"NEW\".\"a;b\" = 1 /* ; ) */ AND [x)] -- note\n AND 1",
            "CASE WHEN (1) THEN ')' END",
        ] {
            check_expression(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "1) BEGIN SELECT 1; END; DROP TABLE victim; --",
            "1); DROP TABLE victim",
            "1; DROP TABLE victim",
            "1) OR (1",
            "(1",
            "1 -- comment",
            "1 /* comment",
            "'unterminated",
            "\"unterminated",
            "[unterminated",
            "x'00",
            "1\0",
        ] {
            assert!(check_expression(bad).is_err(), "{bad:?} passed");
        }
    }
}
