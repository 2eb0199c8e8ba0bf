//! The SQL a snapshot reads a chunk with: each row's event built by the same
//! expressions as the insert trigger's (key, ordering key, tenant, payload
//! within the size bound), with `op` "r" and the type's `{op}` as
//! `snapshot`, so a row's snapshot event and its live events agree.

use super::per_table::{Plan, Row};
use crate::capture::spec::Operation;
use crate::capture::sqltext::{check_expression, ident, literal, refers_to};
use crate::capture::CaptureError;

/// The statements of one capture's snapshot. Its rows are those up to the
/// table's last key when it started (`last`): rows inserted after that are
/// sent by their live events, and a table written faster than it is read
/// cannot keep a snapshot from ending.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotSql {
    /// The table's last key now.
    pub last: String,
    /// The first chunk: the last key `?1…?n`, then `LIMIT ?n+1`.
    pub first: String,
    /// The next chunks: the cursor's values `?1…?n`, the last key's
    /// `?n+1…?2n`, then `LIMIT ?2n+1`.
    pub next: String,
    /// How many values the cursor has (1 for a rowid table; the primary
    /// key's columns for a WITHOUT ROWID one).
    pub cursor_len: usize,
}

impl Plan {
    /// Why this capture cannot be snapshotted, if it cannot: a capture of
    /// deletes only, or one whose update condition reads OLD, makes events
    /// about changes, not about rows.
    pub fn not_snapshottable(&self) -> Option<String> {
        let ops = &self.operations;
        if !ops.contains(&Operation::Insert) && !ops.contains(&Operation::Update) {
            return Some("it captures deletes only".into());
        }
        if ops.contains(&Operation::Update) {
            if let Some(w) = self.when(Operation::Update) {
                if refers_to(&w, "old") {
                    return Some(format!(
                        "its update condition {w} reads OLD: its events are about a change, not a row"
                    ));
                }
            }
        }
        None
    }

    /// The condition a row must meet to be in a snapshot: the capture's
    /// insert condition (its update condition when it captures no inserts),
    /// and the operator's `filter`.
    fn snapshot_condition(&self, filter: Option<&str>) -> Result<Option<String>, CaptureError> {
        let own = if self.operations.contains(&Operation::Insert) {
            self.when(Operation::Insert)
        } else {
            self.when(Operation::Update)
        };
        let mut parts: Vec<String> = own.into_iter().collect();
        if let Some(f) = filter.map(str::trim).filter(|f| !f.is_empty()) {
            check_expression(f).map_err(|reason| CaptureError::Invalid {
                table: self.table.name.clone(),
                field: "where",
                reason,
            })?;
            parts.push(format!("({f})"));
        }
        Ok((!parts.is_empty()).then(|| parts.join(" AND ")))
    }

    /// The chunk statements of snapshot `id` with an optional `--where`.
    /// Its `r` events carry `snapshot_id` after `table`, so a consumer can
    /// count them against the completed marker.
    pub fn snapshot_sql(
        &self,
        id: &str,
        filter: Option<&str>,
    ) -> Result<SnapshotSql, CaptureError> {
        if let Some(why) = self.not_snapshottable() {
            return Err(CaptureError::Invalid {
                table: self.table.name.clone(),
                field: "snapshot",
                reason: format!("capture {} cannot be snapshotted: {why}", self.name),
            });
        }
        let ty = self.spec.event_type_with("snapshot")?;
        let cursor: Vec<String> = match &self.table.rowid {
            Some(alias) => vec![format!("NEW.{alias}")],
            None => self
                .table
                .primary_key
                .iter()
                .map(|c| format!("NEW.{}", ident(c)))
                .collect(),
        };
        let extra = format!(
            ",\"snapshot_id\":{}",
            serde_json::to_string(id).expect("a string serializes")
        );
        let payload = self.payload_with("r", &extra, Row::New, None, Some(Row::New));
        let payload = match self.snapshot_condition(filter)? {
            Some(cond) => format!("CASE WHEN {cond} THEN {payload} END"),
            None => payload,
        };
        let select = format!(
            "SELECT {}, {}, {payload}, {}, {}\nFROM {} AS NEW",
            cursor.join(", "),
            literal(ty.as_str()),
            self.tenant(Row::New),
            self.ordering_key(Row::New),
            ident(&self.table.name),
        );
        let order = format!("ORDER BY {}", cursor.join(", "));
        let n = cursor.len();
        let compare = |op: &str, from: usize| -> String {
            let marks: Vec<String> = (from..from + n).map(|i| format!("?{i}")).collect();
            if n == 1 {
                format!("{} {op} {}", cursor[0], marks[0])
            } else {
                format!("({}) {op} ({})", cursor.join(", "), marks.join(", "))
            }
        };
        let desc: Vec<String> = cursor.iter().map(|c| format!("{c} DESC")).collect();
        Ok(SnapshotSql {
            last: format!(
                "SELECT {} FROM {} AS NEW ORDER BY {} LIMIT 1",
                cursor.join(", "),
                ident(&self.table.name),
                desc.join(", ")
            ),
            first: format!(
                "{select}\nWHERE {}\n{order} LIMIT ?{}",
                compare("<=", 1),
                n + 1
            ),
            next: format!(
                "{select}\nWHERE {} AND {}\n{order} LIMIT ?{}",
                compare(">", 1),
                compare("<=", n + 1),
                2 * n + 1
            ),
            cursor_len: n,
        })
    }
}
