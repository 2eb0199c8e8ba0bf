//! SQLite values as JSON text, built in SQL with `||` (no JSON1): the
//! payload's key, before and after objects.

use crate::capture::sqltext::literal;

/// One SQLite value as JSON, whatever its type:
/// - NULL → `null`; INTEGER → a number;
/// - REAL → a number in the shortest form that reads back exactly
///   (`quote()` does that); ±infinity, which JSON lacks → `{"$real":"Inf"}`;
/// - TEXT → a string (`"`, `\`, line feed, carriage return and tab
///   escaped here, so that most text is plain printable ASCII or UTF-8 for
///   the event view; other control characters, text that is not UTF-8 or
///   holds NUL are the fix trigger's);
/// - BLOB → `{"$blob":"<hex, upper case>"}`.
pub(crate) fn value(x: &str) -> String {
    format!(
        "CASE typeof({x}) WHEN 'text' THEN \
         '\"'||replace(replace(replace(replace(replace({x},'\\','\\\\'),'\"','\\\"'),x'0a','\\n'),x'0d','\\r'),x'09','\\t')||'\"' \
         WHEN 'real' THEN iif({x}*0 IS NULL,'{{\"$real\":\"'||{x}||'\"}}',quote({x})) \
         WHEN 'blob' THEN '{{\"$blob\":\"'||hex({x})||'\"}}' \
         ELSE ifnull({x},'null') END"
    )
}

/// `{"name":<value>,…}` appended to `c`.
pub(super) fn object<'a>(c: &mut Concat, fields: impl Iterator<Item = (&'a str, String)>) {
    c.lit("{");
    for (i, (name, x)) in fields.enumerate() {
        let key = serde_json::to_string(name).expect("a string serializes");
        c.lit(&format!("{}{key}:", if i > 0 { "," } else { "" }));
        c.expr(value(&x));
    }
    c.lit("}");
}

/// An SQL string concatenation being built: adjacent literals merge.
#[derive(Debug, Default)]
pub(super) struct Concat {
    parts: Vec<(bool, String)>,
}

impl Concat {
    pub(super) fn lit(&mut self, s: &str) {
        match self.parts.last_mut() {
            Some((true, last)) => last.push_str(s),
            _ => self.parts.push((true, s.to_string())),
        }
    }

    pub(super) fn expr(&mut self, e: String) {
        self.parts.push((false, e));
    }

    /// The bytes of text its literals add to the value.
    pub(super) fn literal_len(&self) -> u64 {
        self.parts
            .iter()
            .filter(|(is_lit, _)| *is_lit)
            .map(|(_, s)| s.len() as u64)
            .sum()
    }

    pub(super) fn sql(&self) -> String {
        self.parts
            .iter()
            .map(|(is_lit, s)| {
                if *is_lit {
                    literal(s)
                } else {
                    format!("({s})")
                }
            })
            .collect::<Vec<_>>()
            .join("||")
    }
}
