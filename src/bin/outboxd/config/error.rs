//! What a config file's problems look like: [`ConfigError`] (file, field,
//! line, what to fix), and serde's messages said in the file's terms.

use std::path::PathBuf;

/// A config file is unusable: which file, which field, what is wrong and
/// what is allowed. Never holds a secret's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub(crate) struct ConfigError {
    /// The config file.
    pub(crate) file: PathBuf,
    /// The field path, such as `consumer[1].sink.url`; empty for a syntax
    /// error outside any field.
    pub(crate) field: String,
    /// The line the problem is on, when the parser knows it.
    pub(crate) line: Option<usize>,
    /// What is wrong and what is allowed.
    pub(crate) message: String,
}

impl ConfigError {
    fn render(&self) -> String {
        let mut s = format!("config {}", self.file.display());
        if let Some(line) = self.line {
            s.push_str(&format!(", line {line}"));
        }
        if !self.field.is_empty() {
            s.push_str(&format!(": {}", self.field));
        }
        s.push_str(": ");
        s.push_str(&self.message);
        s
    }
}

/// serde's "invalid type: integer `3`, expected usize" in words a person
/// who writes TOML reads: "expected a whole number (0 or more), found 3".
/// Other messages (unknown field, missing field, unknown variant) already
/// are, and pass through.
pub(super) fn in_words(message: &str) -> String {
    let (rest, is_value) = match (
        message.strip_prefix("invalid type: "),
        message.strip_prefix("invalid value: "),
    ) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        _ => return message.to_string(),
    };
    let Some((found, expected)) = rest.rsplit_once(", expected ") else {
        return message.to_string();
    };
    // A number past 64 bits reaches serde as 128 bits, "integer `N` as
    // i128": for a whole-number setting, a value out of range.
    let wide = found
        .strip_suffix(" as i128")
        .or_else(|| found.strip_suffix(" as u128"));
    let found = wide.unwrap_or(found);
    let whole = |lo: &str, hi: &str| format!("a whole number from {lo} to {hi}");
    let want = match expected {
        "u8" => whole("0", "255"),
        "u16" => whole("0", "65535"),
        "u32" => whole("0", "4294967295"),
        "u64" | "usize" => "a whole number (0 or more)".to_string(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_string(),
        "f32" | "f64" => "a number, such as 0.5".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" | "path string" => "text in quotes".to_string(),
        "a sequence" => "a list, such as [\"a\", \"b\"]".to_string(),
        "a map" => "a table, such as { name = \"value\" }".to_string(),
        s if s.starts_with("struct ") => "a table".to_string(),
        other => other.to_string(),
    };
    let number = |s: &str| {
        s.strip_suffix('`')
            .and_then(|s| s.split_once(" `"))
            .map(|(_, n)| n.to_string())
    };
    if is_value || (wide.is_some() && want.starts_with("a whole number")) {
        if let Some(n) = found
            .starts_with("integer `")
            .then(|| number(found))
            .flatten()
        {
            return format!("{n} is out of range; expected {want}");
        }
    }
    let found = match found {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        f if f.starts_with("integer `") => {
            format!("the whole number {}", number(f).unwrap_or_default())
        }
        f if f.starts_with("floating point `") => {
            format!("the number {}", number(f).unwrap_or_default())
        }
        f if f.starts_with("boolean `") => number(f).unwrap_or_default(),
        f => match f.strip_prefix("string ") {
            Some(text) => format!("the text {text}"),
            None => f.to_string(),
        },
    };
    format!("expected {want}, found {found}")
}

/// The 1-based line holding byte `offset`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
