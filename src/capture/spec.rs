//! What to capture: one [`CaptureSpec`] per table, as written in a
//! `[[capture]]` config entry or built in code.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::envelope::EventType;

use super::CaptureError;

/// A write to a captured table that becomes an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// A row was inserted: `op` "c", `{op}` in the type is `created`.
    Insert,
    /// A row was updated: `op` "u", `{op}` is `updated`.
    Update,
    /// A row was deleted (or replaced by `INSERT OR REPLACE`): `op` "d",
    /// `{op}` is `deleted`.
    Delete,
}

impl Operation {
    /// All three, in the order triggers are installed.
    pub const ALL: [Operation; 3] = [Operation::Insert, Operation::Update, Operation::Delete];

    /// What `{op}` becomes in the event type template.
    pub fn verb(self) -> &'static str {
        match self {
            Operation::Insert => "created",
            Operation::Update => "updated",
            Operation::Delete => "deleted",
        }
    }

    /// The payload's `op` field (Debezium's letters).
    pub fn code(self) -> &'static str {
        match self {
            Operation::Insert => "c",
            Operation::Update => "u",
            Operation::Delete => "d",
        }
    }

    /// The SQL keyword (`INSERT`, `UPDATE`, `DELETE`).
    pub fn keyword(self) -> &'static str {
        match self {
            Operation::Insert => "INSERT",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    /// The lowercase name used in config files and trigger names.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Insert => "insert",
            Operation::Update => "update",
            Operation::Delete => "delete",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The columns copied into each event: every column (`"*"`), or a list.
/// There is no default: a capture copies a password hash only when told to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Columns {
    /// `"*"`: every column of the table as it is when the capture is applied
    /// (generated columns included). A column added later is not captured
    /// until `capture apply` runs again; `capture list` says so.
    All,
    /// These columns, in this order.
    List(Vec<String>),
}

impl Serialize for Columns {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Columns::All => s.serialize_str("*"),
            Columns::List(cols) => cols.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Columns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Star(String),
            List(Vec<String>),
        }
        match Raw::deserialize(d).map_err(|e| {
            // A missing `columns` keeps serde's "missing field" message.
            if e.to_string().starts_with("missing field") {
                e
            } else {
                serde::de::Error::custom(
                    r#"expected "*" or a list of column names, such as ["id", "title"]"#,
                )
            }
        })? {
            Raw::Star(s) if s == "*" => Ok(Columns::All),
            Raw::Star(s) => Err(serde::de::Error::custom(format!(
                r#"expected "*" or a list of column names, not the string {s:?} (write ["{s}"] for one column)"#
            ))),
            Raw::List(cols) => Ok(Columns::List(cols)),
        }
    }
}

/// An SQL condition deciding which writes become events: one for every
/// operation, or one per operation. It is the trigger's `WHEN` clause, so
/// it refers to the row as `NEW.column` (insert, update) and `OLD.column`
/// (update, delete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum When {
    /// The same condition for every captured operation; it must make sense
    /// for each (an insert has no OLD row, a delete no NEW row).
    All(String),
    /// A condition per operation; an operation without one is unconditional.
    PerOperation {
        /// For inserts (NEW only).
        #[serde(skip_serializing_if = "Option::is_none")]
        insert: Option<String>,
        /// For updates (NEW and OLD).
        #[serde(skip_serializing_if = "Option::is_none")]
        update: Option<String>,
        /// For deletes (OLD only); also decides whether a row replaced by
        /// `INSERT OR REPLACE` makes a delete event.
        #[serde(skip_serializing_if = "Option::is_none")]
        delete: Option<String>,
    },
}

impl<'de> Deserialize<'de> for When {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct PerOperation {
            insert: Option<String>,
            update: Option<String>,
            delete: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            All(String),
            PerOperation(PerOperation),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected an SQL condition such as \"NEW.status = 'published'\", or a table \
                 with a condition per operation: { insert = \"…\", update = \"…\", delete = \"…\" }",
            )
        })? {
            Raw::All(s) => Ok(When::All(s)),
            Raw::PerOperation(p) => Ok(When::PerOperation {
                insert: p.insert,
                update: p.update,
                delete: p.delete,
            }),
        }
    }
}

impl When {
    /// The condition for one operation, if any.
    pub fn for_operation(&self, op: Operation) -> Option<&str> {
        let c = match self {
            When::All(c) => Some(c),
            When::PerOperation {
                insert,
                update,
                delete,
            } => match op {
                Operation::Insert => insert.as_ref(),
                Operation::Update => update.as_ref(),
                Operation::Delete => delete.as_ref(),
            },
        };
        c.map(|s| s.trim()).filter(|s| !s.is_empty())
    }
}

/// The template an ordering key is built from when a capture sets none:
/// one row's changes reach each consumer in order.
pub const DEFAULT_ORDERING_KEY: &str = "{table}:{key}";

/// One captured table: which writes become events, of which type, carrying
/// which columns. Deserializes from a `[[capture]]` config entry.
///
/// ```
/// use outboxd::capture::{CaptureSpec, Columns};
/// let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::List(vec!["title".into()]));
/// assert!(spec.changed_only);
/// assert_eq!(spec.event_type_for(outboxd::capture::Operation::Update).unwrap().as_str(), "page.updated.v1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSpec {
    /// The capture's name: what `capture list`, `capture snapshot
    /// --capture` and its triggers' names know it by. None: the table's
    /// name (the second capture of a table in a config is `<table>-2`, and
    /// so on: [`assign_names`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The table (a rowid or WITHOUT ROWID table of the main database).
    pub table: String,
    /// Which writes make events; all three by default.
    #[serde(default = "all_operations")]
    pub operations: Vec<Operation>,
    /// The event type, where `{op}` becomes `created`, `updated` or
    /// `deleted`: `page.{op}.v1`. Each resulting type must be valid.
    pub event_type: String,
    /// The columns copied into `before` and `after`.
    pub columns: Columns,
    /// The columns identifying a row in the payload's `key`: by default the
    /// primary key, or the rowid for a table without one. Must be the
    /// primary key, the rowid or the columns of a UNIQUE constraint.
    #[serde(default, deserialize_with = "one_or_many")]
    pub key: Option<Vec<String>>,
    /// Which writes become events (SQL on NEW and OLD); all by default.
    #[serde(default)]
    pub when: Option<When>,
    /// For updates: make an event only when a captured or key column
    /// changed (default true).
    #[serde(default = "yes")]
    pub changed_only: bool,
    /// A column whose value becomes the event's tenant.
    #[serde(default)]
    pub tenant_column: Option<String>,
    /// The ordering key template: `{table}`, `{key}` (the key values joined
    /// by `:`) and `{column}` for any column. Default `{table}:{key}`.
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Whether `outboxd run` reinstalls this capture's triggers when it finds
    /// them missing or changed (default false: it only warns).
    #[serde(default)]
    pub auto_repair: bool,
    /// Whether `outboxd run` starts a snapshot of this capture after it
    /// reinstalled its triggers (`auto_repair`), so the writes lost in
    /// between reach the consumers as `r` events (default false). At most
    /// one such snapshot per capture per [`AUTO_SNAPSHOT_EVERY`].
    #[serde(default, skip_serializing_if = "is_false")]
    pub auto_snapshot: bool,
    /// The largest payload the triggers write (default the relay's
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`](crate::limits::DEFAULT_MAX_PAYLOAD_BYTES)):
    /// a change whose values could make a larger one is sent with those
    /// values left out (`too_large`). Keep it at or below the relay's
    /// `max_payload_bytes`, and below a host's lowered
    /// `SQLITE_LIMIT_LENGTH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_payload_bytes: Option<u64>,
}

/// How often `outboxd run` may start an automatic snapshot of one capture
/// (`auto_snapshot`): a table rebuilt by every deploy is not read whole on
/// each one.
pub const AUTO_SNAPSHOT_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The smallest `max_payload_bytes` a capture accepts: room for the
/// payload's own fields and the `too_large` form of a few columns.
pub const MIN_MAX_PAYLOAD_BYTES: u64 = 4096;

fn is_false(b: &bool) -> bool {
    !*b
}

/// Fills in the default names of `specs`: the table's for its first
/// capture, `<table>-2`, `<table>-3`… for the next ones without a name
/// (skipping names taken by another capture). Names given are kept.
pub fn assign_names(specs: &mut [CaptureSpec]) {
    let mut taken: Vec<String> = specs
        .iter()
        .filter_map(|s| s.name.as_ref().map(|n| n.to_ascii_lowercase()))
        .collect();
    for spec in specs.iter_mut().filter(|s| s.name.is_none()) {
        let table = spec.table.clone();
        if !taken.contains(&table.to_ascii_lowercase()) {
            taken.push(table.to_ascii_lowercase());
            continue;
        }
        let mut n = 2;
        while taken.contains(&format!("{table}-{n}").to_ascii_lowercase()) {
            n += 1;
        }
        let name = format!("{table}-{n}");
        taken.push(name.to_ascii_lowercase());
        spec.name = Some(name);
    }
}

fn all_operations() -> Vec<Operation> {
    Operation::ALL.to_vec()
}

fn yes() -> bool {
    true
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    match Option::<Raw>::deserialize(d).map_err(|_| {
        serde::de::Error::custom(r#"expected a column name or a list of them, such as ["id"]"#)
    })? {
        None => Ok(None),
        Some(Raw::One(s)) => Ok(Some(vec![s])),
        Some(Raw::Many(v)) => Ok(Some(v)),
    }
}

impl CaptureSpec {
    /// A capture of every operation on `table` with the defaults.
    pub fn new(table: impl Into<String>, event_type: impl Into<String>, columns: Columns) -> Self {
        CaptureSpec {
            table: table.into(),
            operations: all_operations(),
            event_type: event_type.into(),
            columns,
            key: None,
            when: None,
            changed_only: true,
            tenant_column: None,
            ordering_key: None,
            auto_repair: false,
            auto_snapshot: false,
            max_payload_bytes: None,
            name: None,
        }
    }

    /// The capture's name as given, or its table's.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.table)
    }

    /// The payload bound in force ([`CaptureSpec::max_payload_bytes`]).
    pub fn payload_bound(&self) -> u64 {
        self.max_payload_bytes
            .unwrap_or(crate::limits::DEFAULT_MAX_PAYLOAD_BYTES)
    }

    /// The event type for a snapshot's `r` events (`{op}` as `snapshot`)
    /// or its markers (`snapshot_started`, `snapshot_completed`).
    pub fn event_type_with(&self, verb: &str) -> Result<EventType, CaptureError> {
        let ty = self.event_type.replace("{op}", verb);
        EventType::parse(&ty).map_err(|source| CaptureError::Invalid {
            table: self.table.clone(),
            field: "event_type",
            reason: format!("for a snapshot it gives {ty:?}: {source}"),
        })
    }

    /// The event type for one operation, validated.
    pub fn event_type_for(&self, op: Operation) -> Result<EventType, CaptureError> {
        let ty = self.event_type.replace("{op}", op.verb());
        EventType::parse(&ty).map_err(|source| CaptureError::EventType {
            table: self.table.clone(),
            operation: op,
            source,
        })
    }

    /// The operations, each once, in install order.
    pub fn operations(&self) -> Vec<Operation> {
        let mut ops = self.operations.clone();
        ops.sort();
        ops.dedup();
        ops
    }

    /// Checks what can be checked without the database: operations, event
    /// types, templates.
    pub fn validate(&self) -> Result<(), CaptureError> {
        let bad = |field: &'static str, reason: String| CaptureError::Invalid {
            table: self.table.clone(),
            field,
            reason,
        };
        if self.table.trim().is_empty() {
            return Err(bad("table", "it is empty".into()));
        }
        if let Some(name) = &self.name {
            let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
            if name.is_empty() || name.len() > 100 || !name.chars().all(fine) {
                return Err(bad(
                    "name",
                    format!(
                        "{name:?}: a name is 1 to 100 of the characters a-z, A-Z, 0-9, _, - and ."
                    ),
                ));
            }
        }
        if let Some(n) = self.max_payload_bytes {
            let most = crate::limits::MAX_PAYLOAD_BYTES;
            if !(MIN_MAX_PAYLOAD_BYTES..=most).contains(&n) {
                return Err(bad(
                    "max_payload_bytes",
                    format!("{n} is outside {MIN_MAX_PAYLOAD_BYTES} to {most}"),
                ));
            }
        }
        if self.operations.is_empty() {
            return Err(bad(
                "operations",
                "it is empty; list any of insert, update, delete".into(),
            ));
        }
        for op in self.operations() {
            self.event_type_for(op)?;
        }
        if self.event_type.replace("{op}", "").contains(['{', '}']) {
            return Err(bad(
                "event_type",
                format!("{:?} has a placeholder other than {{op}}", self.event_type),
            ));
        }
        if let Columns::List(cols) = &self.columns {
            if cols.is_empty() {
                return Err(bad(
                    "columns",
                    r#"it is empty; list the columns to copy, or "*" for all"#.into(),
                ));
            }
        }
        if let Some(key) = &self.key {
            if key.is_empty() {
                return Err(bad("key", "it is empty".into()));
            }
        }
        if let Some(t) = &self.ordering_key {
            template_parts(t).map_err(|reason| bad("ordering_key", reason))?;
        }
        Ok(())
    }

    /// The ordering key template in force.
    pub fn ordering_key_template(&self) -> &str {
        self.ordering_key.as_deref().unwrap_or(DEFAULT_ORDERING_KEY)
    }
}

/// A piece of an ordering key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplatePart {
    /// Text copied as it is.
    Literal(String),
    /// `{table}`.
    Table,
    /// `{key}`.
    Key,
    /// `{name}`: a column's value.
    Column(String),
}

/// Splits a template into its parts; `{{` and `}}` stand for braces.
pub(crate) fn template_parts(template: &str) -> Result<Vec<TemplatePart>, String> {
    // SQLite reads SQL text up to its first NUL: one in a literal would cut
    // the trigger short.
    if template.contains('\0') {
        return Err(format!("{template:?} holds a NUL character"));
    }
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                lit.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                lit.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(format!("{template:?} has a {{ without its }}")),
                    }
                }
                if name.is_empty() {
                    return Err(format!("{template:?} has an empty {{}}"));
                }
                if !lit.is_empty() {
                    parts.push(TemplatePart::Literal(std::mem::take(&mut lit)));
                }
                parts.push(match name.as_str() {
                    "table" => TemplatePart::Table,
                    "key" => TemplatePart::Key,
                    _ => TemplatePart::Column(name),
                });
            }
            '}' => {
                return Err(format!(
                    "{template:?} has a }} without its {{ (write }}}} for a brace)"
                ))
            }
            c => lit.push(c),
        }
    }
    if !lit.is_empty() {
        parts.push(TemplatePart::Literal(lit));
    }
    if parts.is_empty() {
        return Err("it is empty".into());
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_like: serde_json::Value) -> Result<CaptureSpec, serde_json::Error> {
        serde_json::from_value(toml_like)
    }

    #[test]
    fn defaults() {
        let s = spec(serde_json::json!({
            "table": "pages", "event_type": "page.{op}.v1", "columns": ["title"]
        }))
        .unwrap();
        assert_eq!(s.operations(), Operation::ALL.to_vec());
        assert!(s.changed_only);
        assert!(!s.auto_repair);
        assert_eq!(s.ordering_key_template(), "{table}:{key}");
        s.validate().unwrap();
    }

    #[test]
    fn columns_are_star_or_a_list() {
        let s = spec(serde_json::json!({"table": "t", "event_type": "t.{op}.v1", "columns": "*"}))
            .unwrap();
        assert_eq!(s.columns, Columns::All);
        let e =
            spec(serde_json::json!({"table": "t", "event_type": "t.{op}.v1", "columns": "title"}))
                .unwrap_err();
        assert!(e.to_string().contains(r#"write ["title"]"#), "{e}");
        let e = spec(serde_json::json!({"table": "t", "event_type": "t.{op}.v1"})).unwrap_err();
        assert!(e.to_string().contains("columns"), "{e}");
    }

    #[test]
    fn when_is_one_condition_or_one_per_operation() {
        let s = spec(
            serde_json::json!({"table": "t", "event_type": "t.{op}.v1", "columns": "*",
            "when": {"insert": "NEW.a = 1", "delete": "OLD.a = 1"}}),
        )
        .unwrap();
        let w = s.when.unwrap();
        assert_eq!(w.for_operation(Operation::Insert), Some("NEW.a = 1"));
        assert_eq!(w.for_operation(Operation::Update), None);
        let w = When::All(" ".into());
        assert_eq!(w.for_operation(Operation::Delete), None);
    }

    #[test]
    fn event_types_are_checked_for_each_operation() {
        let mut s = CaptureSpec::new("pages", "Page.{op}.v1", Columns::All);
        let e = s.validate().unwrap_err();
        assert!(e.to_string().contains("Page.created.v1"), "{e}");
        s.event_type = "page.changed.v1".into();
        s.validate().unwrap();
        s.event_type = "page.{verb}.v1".into();
        assert!(s.validate().is_err());
        s.event_type = "page.{op}".into();
        let e = s.validate().unwrap_err();
        assert!(e.to_string().contains("page.created"), "{e}");
    }

    #[test]
    fn templates() {
        use TemplatePart::*;
        assert_eq!(
            template_parts("{table}:{key}").unwrap(),
            vec![Table, Literal(":".into()), Key]
        );
        assert_eq!(
            template_parts("page-{page_id}{{x}}").unwrap(),
            vec![
                Literal("page-".into()),
                Column("page_id".into()),
                Literal("{x}".into())
            ]
        );
        for bad in ["{", "}", "{}", "", "a{b", "a\0b"] {
            assert!(template_parts(bad).is_err(), "{bad:?}");
        }
    }
}
