//! The triggers of one captured table: each builds its event (type,
//! payload, tenant, ordering key) from the row and inserts it into the
//! event view; BEFORE triggers note the rows a REPLACE is about to delete.

use std::collections::BTreeMap;

use super::json::{object, Concat};
use super::payload::{Section, Value};
use super::{SqlObject, INSERT_EVENT, REPLACED_TABLE, TRIGGER_PREFIX};
use crate::capture::spec::{CaptureSpec, Operation, TemplatePart};
use crate::capture::sqltext::{ident, literal, rename_row};
use crate::capture::table::Table;

/// What each trigger of a table does; its name is
/// `outboxd_capture_<kind>_<table>`. The kind comes first, and no kind
/// followed by `_` begins another kind followed by `_`, so the name of one
/// table's trigger is never the name of another table's: with the table
/// first (`outboxd_capture_<table>_<kind>`, before), `pages` with
/// `before_insert` and `pages_before` with `insert` collided. Nor does a
/// kind begin like a shared object's name (`event`, `fix`, `replaced`).
pub(crate) const KINDS: [&str; 5] = [
    "insert",
    "update",
    "delete",
    "before_insert",
    "before_update",
];

/// The alias under which a BEFORE trigger reads the row a REPLACE is about to
/// delete.
const REPLACED: &str = "o";

/// A capture resolved against its table: the names checked, the defaults
/// filled in.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub spec: CaptureSpec,
    /// The capture's name: its triggers are named after it, and its
    /// REPLACE notes carry it.
    pub name: String,
    pub table: Table,
    /// The captured columns, as the table spells them.
    pub columns: Vec<String>,
    /// The key: column names, or the rowid alias (`rowid`).
    pub key: Vec<String>,
    /// True when the key is the rowid of a table without a primary key.
    pub key_is_rowid: bool,
    pub tenant: Option<String>,
    pub ordering: Vec<TemplatePart>,
    pub operations: Vec<Operation>,
    pub event_types: BTreeMap<Operation, String>,
}

/// Where a trigger reads a row from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Row {
    New,
    Old,
    /// The row of the captured table a REPLACE is about to delete.
    Replaced,
}

impl Row {
    fn prefix(self) -> &'static str {
        match self {
            Row::New => "NEW",
            Row::Old => "OLD",
            Row::Replaced => REPLACED,
        }
    }
}

impl Plan {
    /// `row."column"`, or `row.rowid` for the rowid key.
    pub(super) fn col(&self, row: Row, name: &str) -> String {
        if self.key_is_rowid && self.table.rowid.as_deref() == Some(name) {
            format!("{}.{name}", row.prefix())
        } else {
            format!("{}.{}", row.prefix(), ident(name))
        }
    }

    pub(super) fn rowid(&self, row: Row) -> Option<String> {
        self.table
            .rowid
            .as_ref()
            .map(|alias| format!("{}.{alias}", row.prefix()))
    }

    /// `outboxd_capture_<kind>_<table>`; see [`KINDS`].
    fn trigger_name(&self, kind: &str) -> String {
        debug_assert!(KINDS.contains(&kind), "{kind} is not in KINDS");
        format!("{TRIGGER_PREFIX}{kind}_{}", self.name)
    }

    /// The key as a JSON object.
    fn key_json(&self, row: Row) -> Concat {
        let mut c = Concat::default();
        object(
            &mut c,
            self.key.iter().map(|k| (k.as_str(), self.col(row, k))),
        );
        c
    }

    /// The payload: `{"op","table","key","before","after"}`, within the
    /// capture's size bound ([`payload`](super::payload)). `code` is the
    /// payload's `op`.
    pub(super) fn payload(
        &self,
        code: &str,
        key_row: Row,
        before: Option<Row>,
        after: Option<Row>,
    ) -> String {
        self.payload_with(code, "", key_row, before, after)
    }

    /// [`payload`](Self::payload) with `extra` (JSON members, each after a
    /// comma) after `table`.
    pub(super) fn payload_with(
        &self,
        code: &str,
        extra: &str,
        key_row: Row,
        before: Option<Row>,
        after: Option<Row>,
    ) -> String {
        let head = format!(
            "{{\"op\":\"{code}\",\"table\":{}{extra}",
            serde_json::to_string(&self.table.name).expect("a string serializes")
        );
        let values = |row: Row, cols: &[String]| -> Vec<Value> {
            cols.iter()
                .map(|k| Value {
                    column: k.clone(),
                    sql: self.col(row, k),
                })
                .collect()
        };
        let sections: [Section; 3] = [
            ("key", Some(values(key_row, &self.key))),
            ("before", before.map(|r| values(r, &self.columns))),
            ("after", after.map(|r| values(r, &self.columns))),
        ];
        super::payload::payload(&head, &sections, self.spec.payload_bound())
            .expect("the bound is checked when the plan is made")
    }

    /// The tenant of the event, from the row.
    pub(super) fn tenant(&self, row: Row) -> String {
        match &self.tenant {
            Some(col) => {
                let x = self.col(row, col);
                format!("CASE typeof({x}) WHEN 'blob' THEN hex({x}) ELSE {x} END")
            }
            None => "NULL".into(),
        }
    }

    /// The ordering key of the event, from the row.
    pub(super) fn ordering_key(&self, row: Row) -> String {
        let mut parts = Vec::new();
        for part in &self.ordering {
            match part {
                TemplatePart::Literal(s) => parts.push(literal(s)),
                TemplatePart::Table => parts.push(literal(&self.table.name)),
                TemplatePart::Key => {
                    for (i, k) in self.key.iter().enumerate() {
                        if i > 0 {
                            parts.push("':'".into());
                        }
                        parts.push(key_text(&self.col(row, k)));
                    }
                }
                TemplatePart::Column(c) => parts.push(key_text(&self.col(row, c))),
            }
        }
        parts.join("||")
    }

    /// The user's condition for an operation, if any.
    pub(super) fn when(&self, op: Operation) -> Option<String> {
        self.spec
            .when
            .as_ref()
            .and_then(|w| w.for_operation(op))
            .map(|w| format!("({w})"))
    }

    /// For updates with `changed_only`: some captured or key column changed.
    fn changed(&self) -> Option<String> {
        if !self.spec.changed_only {
            return None;
        }
        let mut cols: Vec<&String> = self.columns.iter().chain(&self.key).collect();
        cols.sort();
        cols.dedup();
        Some(format!(
            "({})",
            cols.iter()
                .map(|c| format!(
                    "{} IS NOT {} COLLATE BINARY",
                    self.col(Row::Old, c),
                    self.col(Row::New, c)
                ))
                .collect::<Vec<_>>()
                .join(" OR ")
        ))
    }

    /// The insert of one event, built from the trigger's rows, into the
    /// event view. Always `VALUES`: SQLite copies the rows of an `INSERT …
    /// SELECT` into a temporary table first when the target has triggers, a
    /// cost on every write. A condition makes the payload NULL instead,
    /// which the view's trigger skips.
    fn event_insert(&self, op: Operation, condition: Option<String>) -> String {
        let (key_row, before, after, row) = match op {
            Operation::Insert => (Row::New, None, Some(Row::New), Row::New),
            Operation::Update => (Row::New, Some(Row::Old), Some(Row::New), Row::New),
            Operation::Delete => (Row::Old, Some(Row::Old), None, Row::Old),
        };
        let payload = self.payload(op.code(), key_row, before, after);
        let payload = match condition {
            Some(cond) => format!("CASE WHEN {cond} THEN {payload} END"),
            None => payload,
        };
        format!(
            "{INSERT_EVENT}\nVALUES ({}, {payload}, {}, {});",
            literal(&self.event_types[&op]),
            self.tenant(row),
            self.ordering_key(row),
        )
    }

    /// Checks that the size bound can hold this capture's largest payload
    /// (an update's key, before and after).
    pub fn check_bound(&self) -> Result<(), String> {
        let values = |row: Row, cols: &[String]| -> Vec<Value> {
            cols.iter()
                .map(|k| Value {
                    column: k.clone(),
                    sql: self.col(row, k),
                })
                .collect()
        };
        let sections: [Section; 3] = [
            ("key", Some(values(Row::New, &self.key))),
            ("before", Some(values(Row::Old, &self.columns))),
            ("after", Some(values(Row::New, &self.columns))),
        ];
        super::payload::payload(
            "{\"op\":\"u\",\"table\":\"\"",
            &sections,
            self.spec.payload_bound(),
        )
        .map(drop)
    }

    /// Whether REPLACE handling is installed: only deletes need it.
    pub fn handles_replace(&self) -> bool {
        self.operations.contains(&Operation::Delete)
    }

    /// Every trigger of this capture, in install order.
    pub fn triggers(&self) -> Vec<SqlObject> {
        let mut out = Vec::new();
        let on = ident(&self.table.name);
        let replace = self.handles_replace();
        let table_lit = literal(&self.name);
        if replace {
            out.push(self.before_trigger(Operation::Insert));
            out.push(self.before_trigger(Operation::Update));
        }
        for op in [Operation::Insert, Operation::Update] {
            let captured = self.operations.contains(&op);
            if !captured && !replace {
                continue;
            }
            let mut cond: Vec<String> = Vec::new();
            if captured {
                cond.extend(self.when(op));
                if op == Operation::Update {
                    cond.extend(self.changed());
                }
            }
            let cond = (!cond.is_empty()).then(|| cond.join(" AND "));
            let name = self.trigger_name(op.name());
            let sql = if replace {
                // No WHEN: the replaced rows' events are due whatever the
                // condition says about the new row.
                let mut body = self.flush(op);
                if captured {
                    body.push('\n');
                    body.push_str(&self.event_insert(op, cond));
                }
                format!(
                    "CREATE TRIGGER {} AFTER {} ON {on}\nBEGIN\n{body}\nEND",
                    ident(&name),
                    op.keyword()
                )
            } else {
                let when = cond.map(|c| format!(" WHEN {c}")).unwrap_or_default();
                format!(
                    "CREATE TRIGGER {} AFTER {} ON {on}{when}\nBEGIN\n{}\nEND",
                    ident(&name),
                    op.keyword(),
                    self.event_insert(op, None)
                )
            };
            out.push(SqlObject::trigger(name, &self.name, sql));
        }
        if self.operations.contains(&Operation::Delete) {
            let name = self.trigger_name("delete");
            let when = self
                .when(Operation::Delete)
                .map(|c| format!(" WHEN {c}"))
                .unwrap_or_default();
            // With recursive_triggers on, SQLite fires this trigger for a row
            // a REPLACE deletes: the event is made here, so the BEFORE
            // trigger's note of that row goes (deleted unmarked: no event).
            let sql = format!(
                "CREATE TRIGGER {} AFTER DELETE ON {on}{when}\nBEGIN\n{}\n\
                 DELETE FROM {REPLACED_TABLE} WHERE table_name = {table_lit} AND row_key = {};\nEND",
                ident(&name),
                self.event_insert(Operation::Delete, None),
                self.key_json(Row::Old).sql()
            );
            out.push(SqlObject::trigger(name, &self.name, sql));
        }
        out
    }

    /// The BEFORE trigger that notes the rows a REPLACE will delete, with
    /// their delete events, in outboxd_capture_replaced.
    fn before_trigger(&self, op: Operation) -> SqlObject {
        let o = Row::Replaced;
        let table = ident(&self.table.name);
        let table_lit = literal(&self.name);
        // Each UNIQUE constraint the incoming row matches, as a condition on
        // a row read under `alias`. (A comparison with NULL is NULL: no
        // match, as in a UNIQUE constraint.)
        let matching = |alias: &str| -> Vec<String> {
            self.table
                .unique
                .iter()
                .map(|u| {
                    let parts: Vec<String> = u
                        .columns
                        .iter()
                        .map(|(c, coll)| {
                            format!(
                                "{alias}.{} = NEW.{} COLLATE {}",
                                ident(c),
                                ident(c),
                                ident(coll)
                            )
                        })
                        .collect();
                    parts.join(" AND ")
                })
                .collect()
        };
        // The same as a 0 or 1 (a look-up's own condition stays bare: an
        // index serves it only as it is).
        let known = |m: &String| format!("ifnull({m},0)");
        // How a row is found again: its rowid, or its primary key.
        let identity: Vec<String> = match &self.table.rowid {
            Some(alias) => vec![alias.clone()],
            None => self.table.primary_key.iter().map(|c| ident(c)).collect(),
        };
        let cols = |alias: &str| -> Vec<String> {
            identity.iter().map(|c| format!("{alias}.{c}")).collect()
        };
        let named = |cols: &[String]| -> String {
            cols.iter()
                .enumerate()
                .map(|(i, c)| format!("{c} AS c{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // The conflicting rows: one indexed look-up per constraint, each
        // leaving out the rows an earlier one found, joined with UNION ALL.
        // (An OR of the constraints is not always planned as look-ups
        // inside a trigger, and IN or UNION would build a temporary table.)
        let u_matches = matching("u");
        let mut lookups = Vec::new();
        for (i, m) in u_matches.iter().enumerate() {
            let mut cond = m.clone();
            for earlier in &u_matches[..i] {
                cond.push_str(&format!(" AND NOT {}", known(earlier)));
            }
            lookups.push(format!(
                "SELECT {} FROM {table} AS u WHERE {cond}",
                named(&cols("u"))
            ));
        }
        if let (Some(alias), Some(new)) = (&self.table.rowid, self.rowid(Row::New)) {
            let mut cond = format!("u.{alias} = {new}");
            for m in &u_matches {
                cond.push_str(&format!(" AND NOT {}", known(m)));
            }
            lookups.push(format!(
                "SELECT u.{alias} AS c0 FROM {table} AS u WHERE {cond}"
            ));
        }
        let names: Vec<String> = (0..identity.len()).map(|i| format!("c{i}")).collect();
        let join: Vec<String> = cols(o.prefix())
            .iter()
            .zip(&names)
            .map(|(col, n)| format!("{col} = c.{n}"))
            .collect();
        let mut cond: Vec<String> = Vec::new();
        // The row being updated is not replaced by itself.
        if op == Operation::Update {
            match (self.rowid(o), self.rowid(Row::Old)) {
                (Some(a), Some(b)) => cond.push(format!("{a} <> {b}")),
                _ => {
                    let same: Vec<String> = self
                        .table
                        .primary_key
                        .iter()
                        .map(|c| format!("{} IS OLD.{}", self.col(o, c), ident(c)))
                        .collect();
                    cond.push(format!("NOT ({})", same.join(" AND ")));
                }
            }
        }
        if let Some(w) = self.when(Operation::Delete) {
            cond.push(rename_row(&w, "old", REPLACED));
        }
        let cond = if cond.is_empty() {
            String::new()
        } else {
            format!("\nWHERE {}", cond.join(" AND "))
        };
        // In a BEFORE INSERT trigger NEW.rowid is not yet known (-1 or NULL
        // when SQLite will choose it), so a rowid match is confirmed after
        // the insert; a UNIQUE match, or any match before an UPDATE, cannot
        // be wrong once the write has succeeded.
        let exact = if op == Operation::Update {
            "1".to_string()
        } else if u_matches.is_empty() {
            "0".to_string()
        } else {
            let on_o: Vec<String> = matching(o.prefix()).iter().map(known).collect();
            format!("({})", on_o.join(" OR "))
        };
        let row_id = self.rowid(o).unwrap_or_else(|| "NULL".into());
        let name = self.trigger_name(&format!("before_{}", op.name()));
        let sql = format!(
            "CREATE TRIGGER {} BEFORE {} ON {table}\nBEGIN\n\
             DELETE FROM {REPLACED_TABLE} WHERE table_name = {table_lit};\n\
             INSERT INTO {REPLACED_TABLE} (table_name, row_id, row_key, exact, event_type, payload, tenant_id, ordering_key)\n\
             SELECT {table_lit}, {row_id}, {}, {exact}, {}, {}, {}, {}\n\
             FROM ({}) AS c\nJOIN {table} AS {REPLACED} ON {}{cond};\nEND",
            ident(&name),
            op.keyword(),
            self.key_json(o).sql(),
            literal(&self.event_types[&Operation::Delete]),
            self.payload(Operation::Delete.code(), o, Some(o), None),
            self.tenant(o),
            self.ordering_key(o),
            lookups.join("\n  UNION ALL "),
            join.join(" AND "),
        );
        SqlObject::trigger(name, &self.name, sql)
    }

    /// Statements of an AFTER INSERT or UPDATE trigger that turn the rows
    /// the write replaced into delete events, ahead of its own event: mark
    /// them, then delete every note of the table; the shared trigger on
    /// outboxd_capture_replaced writes the marked ones.
    fn flush(&self, op: Operation) -> String {
        let table_lit = literal(&self.name);
        let confirmed = match (op, self.rowid(Row::New)) {
            (Operation::Insert, Some(new)) => format!(" AND (exact OR row_id = {new})"),
            _ => String::new(),
        };
        format!(
            "UPDATE {REPLACED_TABLE} SET emit = 1 WHERE table_name = {table_lit}{confirmed};\n\
             DELETE FROM {REPLACED_TABLE} WHERE table_name = {table_lit};"
        )
    }
}

/// A value as text for an ordering key: NULL as empty, a BLOB as hex.
fn key_text(x: &str) -> String {
    format!("ifnull(CASE typeof({x}) WHEN 'blob' THEN hex({x}) ELSE {x} END,'')")
}
