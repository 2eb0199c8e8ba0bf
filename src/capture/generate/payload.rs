//! The payload of one event as SQL, within the capture's size bound
//! (`max_payload_bytes`): the values in full when they fit, else with the
//! values that are too large to carry left out and named (`too_large`).
//!
//! The bound must hold for the payload as the relay finally reads it, and
//! no string built on the way may outgrow the host's `SQLITE_LIMIT_LENGTH`,
//! or the host's own write fails. So the size is estimated from the raw
//! values *before* any JSON is built, counting what escaping and the hex
//! form (text that is not UTF-8, [`event_objects`](super::event_objects))
//! can make of them: text at 6 bytes a byte (escaping at most doubles it,
//! the hex form doubles that), a BLOB at 4 (hex, then the hex form), any
//! other value at 48, the payload's own text at 3 times its length.

use super::json::{value, Concat};

/// What a placeholder for a value left out may take, hex form included:
/// `{"$too_large":<bytes>}` twice over.
const PLACEHOLDER: u64 = 52;

/// Room for the hex form's own wrapper (`"payload_hex":"…"}`).
const SLACK: u64 = 64;

/// One value the payload renders: the section it is in (`key`, `before`,
/// `after`), its column, and the SQL that reads it.
pub(super) struct Value {
    pub column: String,
    pub sql: String,
}

/// One section of the payload: its name and its values, or None for `null`.
pub(super) type Section = (&'static str, Option<Vec<Value>>);

/// The most bytes a value may render to, hex form included.
fn estimate(x: &str) -> String {
    format!(
        "CASE typeof({x}) WHEN 'text' THEN 6*length(CAST({x} AS BLOB)) \
         WHEN 'blob' THEN 4*length({x}) ELSE 48 END"
    )
}

/// The payload of `sections` after `head` (`{"op":…,"table":…`), as an SQL
/// expression whose value is never longer than `bound` bytes, even in its
/// hex form. Errs when `bound` cannot hold even the reduced form.
pub(super) fn payload(head: &str, sections: &[Section], bound: u64) -> Result<String, String> {
    let values: Vec<&Value> = sections
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .flatten()
        .collect();
    let full = build(head, sections, None, "}");
    if values.is_empty() {
        return Ok(full.sql());
    }
    // The reduced form: a column is left out wherever it appears when any
    // of its values exceeds its share of the bound.
    let mut columns: Vec<&str> = Vec::new();
    for v in &values {
        if !columns.iter().any(|c| *c == v.column) {
            columns.push(&v.column);
        }
    }
    let names: Vec<String> = columns
        .iter()
        .map(|c| serde_json::to_string(c).expect("a string serializes"))
        .collect();
    let tail_len = ",\"too_large\":true,\"dropped\":[]}".len() as u64
        + names.iter().map(|n| n.len() as u64 + 1).sum::<u64>();
    let reduced_lit = build(head, sections, Some(&|_| String::new()), "").literal_len() + tail_len;
    let n = values.len() as u64;
    let room = bound
        .checked_sub(3 * reduced_lit + SLACK + n * PLACEHOLDER)
        .filter(|r| r / n >= 48)
        .ok_or_else(|| {
            format!(
                "{bound} bytes cannot hold a payload of {n} values (the key, before and after): \
                 raise it, or capture fewer columns"
            )
        })?;
    let share = room / n;
    let big = |column: &str| -> String {
        let cond: Vec<String> = values
            .iter()
            .filter(|v| v.column == column)
            .map(|v| format!("{}>{share}", estimate(&v.sql)))
            .collect();
        format!("({})", cond.join(" OR "))
    };
    let mut reduced = build(
        head,
        sections,
        Some(&|v: &Value| {
            format!(
                "CASE WHEN {} THEN '{{\"$too_large\":'||length(CAST({x} AS BLOB))||'}}' ELSE {} END",
                big(&v.column),
                value(&v.sql),
                x = v.sql
            )
        }),
        ",\"too_large\":true,\"dropped\":[",
    );
    let dropped: Vec<String> = columns
        .iter()
        .zip(&names)
        .map(|(c, name)| {
            format!(
                "CASE WHEN {} THEN {} ELSE '' END",
                big(c),
                super::super::sqltext::literal(&format!(",{name}"))
            )
        })
        .collect();
    reduced.expr(format!("substr({},2)", dropped.join("||")));
    reduced.lit("]}");
    let full_lit = full.literal_len();
    let budget = bound.saturating_sub(3 * full_lit + SLACK);
    let total: Vec<String> = values
        .iter()
        .map(|v| format!("({})", estimate(&v.sql)))
        .collect();
    Ok(format!(
        "CASE WHEN {}>{budget} THEN {} ELSE {} END",
        total.join("+"),
        reduced.sql(),
        full.sql()
    ))
}

/// The payload text: `head`, each section as an object (or `null`), then
/// `tail`. `render` replaces the plain rendering of a value when given.
fn build(
    head: &str,
    sections: &[Section],
    render: Option<&dyn Fn(&Value) -> String>,
    tail: &str,
) -> Concat {
    let mut c = Concat::default();
    c.lit(head);
    for (name, values) in sections {
        c.lit(&format!(",\"{name}\":"));
        match values {
            None => c.lit("null"),
            Some(values) => {
                c.lit("{");
                for (i, v) in values.iter().enumerate() {
                    let key = serde_json::to_string(&v.column).expect("a string serializes");
                    c.lit(&format!("{}{key}:", if i > 0 { "," } else { "" }));
                    match render {
                        Some(f) => {
                            let e = f(v);
                            if !e.is_empty() {
                                c.expr(e);
                            }
                        }
                        None => c.expr(value(&v.sql)),
                    }
                }
                c.lit("}");
            }
        }
    }
    c.lit(tail);
    c
}
