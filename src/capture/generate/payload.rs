//! The payload of one event as SQL, within the capture's size bound
//! (`max_payload_bytes`): the values in full when they fit, else the key
//! alone with the columns left out named (`too_large`).
//!
//! The bound must hold for the payload as the relay finally reads it, and
//! no string built on the way may outgrow the host's `SQLITE_LIMIT_LENGTH`,
//! or the host's own write fails. So the size is estimated from the raw
//! values *before* any JSON is built, counting what escaping and the hex
//! form (text that is not UTF-8, [`event_objects`](super::event_objects))
//! can make of them: text (and a number, as its text) at 6 bytes a byte
//! (escaping at most doubles it, the hex form doubles that), a BLOB at 4
//! (hex, then the hex form), plus 48 a value (a REAL's longest rendering,
//! twice), the payload's own text at 3 times its length.

use super::json::{value, Concat};

/// What a placeholder for a value left out may take, hex form included:
/// `{"$too_large":<bytes>}` twice over.
const PLACEHOLDER: u64 = 52;

/// Room for the hex form's own wrapper (`"payload_hex":"…"}`).
const SLACK: u64 = 64;

/// One value the payload renders: its column, and the SQL that reads it.
pub(super) struct Value {
    pub column: String,
    pub sql: String,
}

/// One section of the payload: its name and its values, or None for `null`.
pub(super) type Section = (&'static str, Option<Vec<Value>>);

/// The most bytes a value may render to, hex form included.
fn estimate(x: &str) -> String {
    format!("ifnull(length(CAST({x} AS BLOB)),0)*iif(typeof({x})='blob',4,6)+48")
}

/// The payload of `sections` after `head` (`{"op":…,"table":…`), as an SQL
/// expression whose value is never longer than `bound` bytes, even in its
/// hex form: the values in full when their estimate fits, else the
/// `too_large` form, which keeps the key (each key value that fits its
/// share of the bound; a placeholder for one that does not), sends
/// `before` and `after` as `null` and names the columns it left out.
/// Errs when `bound` cannot hold even that.
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
    let mut dropped: Vec<String> = Vec::new();
    for (_, v) in sections.iter().filter(|(n, _)| *n != "key") {
        for v in v.iter().flatten() {
            let col = serde_json::to_string(&v.column).expect("a string serializes");
            if !dropped.contains(&col) {
                dropped.push(col);
            }
        }
    }
    let tail = format!(",\"too_large\":true,\"dropped\":[{}]}}", dropped.join(","));
    let keys: Vec<&Value> = sections
        .iter()
        .filter(|(n, _)| *n == "key")
        .filter_map(|(_, v)| v.as_ref())
        .flatten()
        .collect();
    let reduced_sections: Vec<Section> = sections
        .iter()
        .map(|(n, v)| {
            let kept = if *n == "key" {
                v.as_ref().map(|vs| {
                    vs.iter()
                        .map(|v| Value {
                            column: v.column.clone(),
                            sql: v.sql.clone(),
                        })
                        .collect()
                })
            } else {
                None
            };
            (*n, kept)
        })
        .collect();
    let reduced_lit = build(head, &reduced_sections, Some(&|_| String::new()), &tail).literal_len();
    let n = keys.len().max(1) as u64;
    let room = bound
        .checked_sub(3 * reduced_lit + SLACK + n * PLACEHOLDER)
        .filter(|r| r / n >= 48)
        .ok_or_else(|| {
            format!(
                "{bound} bytes cannot hold even the too_large form of this capture's payload \
                 (its key and the names of its columns): raise it"
            )
        })?;
    let share = room / n;
    let reduced = build(
        head,
        &reduced_sections,
        Some(&|v: &Value| {
            format!(
                "CASE WHEN {}>{share} THEN '{{\"$too_large\":'||length(CAST({x} AS BLOB))||'}}' ELSE {} END",
                estimate(&v.sql),
                value(&v.sql),
                x = v.sql
            )
        }),
        &tail,
    );
    let budget = bound.saturating_sub(3 * full.literal_len() + SLACK);
    let total: Vec<String> = values.iter().map(|v| estimate(&v.sql)).collect();
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
