//! Drift: whether the triggers outboxd recorded are still installed as it
//! installed them, and whether they match a config.
//!
//! A host's migration tool often rebuilds a table to alter it (create a new
//! table, copy the rows, drop the old one, rename), and dropping the old
//! table drops its triggers; `ALTER TABLE … RENAME` rewrites them. SQLite
//! keeps no history, so the best outboxd can say about *when* a trigger went
//! missing is: after it last saw it installed ([`CaptureStatus::verified_at`],
//! moved forward by `outboxd run`'s checks: [`mark_verified`]), and around the newest event
//! the capture wrote that is still in the outbox.

use rusqlite::{params, Connection};
use serde::Serialize;

use super::gap::{open_gaps, Gap};
use super::generate::EVENT_VIEW;
use super::objects::installed_objects;
use super::spec::CaptureSpec;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::schema;

/// The state of one recorded trigger or view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TriggerState {
    /// Installed exactly as outboxd installed it.
    Installed,
    /// Gone: dropped with its table (a migration that rebuilt it), or by hand.
    Missing,
    /// Present, but its SQL is not what outboxd installed (an `ALTER TABLE`
    /// renamed a column or the table, or someone replaced it).
    Changed {
        /// The table it is on now (a renamed table takes its triggers).
        table: String,
        /// The SQL it has now.
        sql: String,
    },
}

/// One recorded trigger or view and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectStatus {
    /// Its name.
    pub name: String,
    /// `trigger` or `view`.
    #[serde(rename = "type")]
    pub kind: String,
    /// True for the shared event view and its trigger: while either is
    /// missing, the host's writes to every captured table fail.
    pub shared: bool,
    /// Installed, missing or changed.
    #[serde(flatten)]
    pub state: TriggerState,
}

/// A recorded capture and whether its triggers are intact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CaptureStatus {
    /// The capture's name.
    pub name: String,
    /// The captured table.
    pub table: String,
    /// The definition as it was applied.
    pub spec: CaptureSpec,
    /// When its triggers were last installed.
    pub installed_at: Timestamp,
    /// The last time outboxd recorded seeing every trigger installed as
    /// recorded: `capture apply`, or `outboxd run`'s checks (written at
    /// start, every few minutes, and when a check finds the capture broken,
    /// then with the time of the last check that saw it intact).
    pub verified_at: Timestamp,
    /// Whether the table exists.
    pub table_exists: bool,
    /// Its triggers, then the shared event view and its trigger.
    pub objects: Vec<ObjectStatus>,
    /// When something is wrong: the time of the newest event of this
    /// capture's types still in the outbox, a hint to when it stopped.
    pub newest_event_at: Option<Timestamp>,
    /// Its open gaps: windows in which its triggers were missing, not yet
    /// covered by a snapshot nor acknowledged.
    pub gaps: Vec<Gap>,
}

impl CaptureStatus {
    /// "capture of pages", or "capture page-published of pages" for a
    /// capture whose name is not its table's.
    pub fn label(&self) -> String {
        if self.name.eq_ignore_ascii_case(&self.table) {
            format!("capture of {}", self.table)
        } else {
            format!("capture {} of {}", self.name, self.table)
        }
    }

    /// True when every trigger is installed as recorded.
    pub fn is_intact(&self) -> bool {
        self.table_exists
            && self
                .objects
                .iter()
                .all(|t| t.state == TriggerState::Installed)
    }

    /// The triggers (and view) that are missing.
    pub fn missing(&self) -> Vec<&str> {
        self.objects
            .iter()
            .filter(|t| t.state == TriggerState::Missing)
            .map(|t| t.name.as_str())
            .collect()
    }

    /// The triggers (and view) whose SQL changed.
    pub fn changed(&self) -> Vec<&str> {
        self.objects
            .iter()
            .filter(|t| matches!(t.state, TriggerState::Changed { .. }))
            .map(|t| t.name.as_str())
            .collect()
    }

    /// True when the shared event view or its trigger is not as installed:
    /// the host's writes to captured tables then fail, not only go
    /// uncaptured.
    pub fn breaks_writes(&self) -> bool {
        self.table_exists
            && self
                .objects
                .iter()
                .any(|t| t.shared && t.state != TriggerState::Installed)
    }

    /// What is wrong and since when, in one line for a log or a status
    /// report; None when intact. Says plainly that writes made while a
    /// trigger was missing are lost: a trigger that is not there captures
    /// nothing, and nothing can find those writes afterwards.
    pub fn problem(&self, now: Timestamp) -> Option<String> {
        if self.is_intact() {
            return None;
        }
        let mut since = format!(
            "since some time after {} ({} ago), when outboxd last saw the capture intact",
            self.verified_at,
            ago(now.since(self.verified_at))
        );
        if let Some(t) = self.newest_event_at {
            since.push_str(&format!(
                "; the newest event it wrote that is still in the outbox is from {t}"
            ));
        }
        let own = |f: &dyn Fn(&TriggerState) -> bool| -> Vec<&ObjectStatus> {
            self.objects
                .iter()
                .filter(|o| !o.shared && f(&o.state))
                .collect()
        };
        let missing = own(&|s| *s == TriggerState::Missing);
        let changed = own(&|s| matches!(s, TriggerState::Changed { .. }));
        let names = |v: &[&ObjectStatus]| {
            v.iter()
                .map(|o| o.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if !self.table_exists && changed.is_empty() {
            parts.push(format!(
                "table {} no longer exists (dropped, and its capture triggers with it) {since}",
                self.table
            ));
        } else if !missing.is_empty() {
            parts.push(format!(
                "{}: trigger{} {} missing {since}: writes to {} made since then were not captured; \
                 once the triggers are back, `outboxd capture snapshot --capture {}` sends every \
                 row as it is then",
                self.label(),
                plural(missing.len()),
                names(&missing),
                self.table,
                self.name
            ));
        }
        let moved_to = changed.iter().find_map(|o| match &o.state {
            TriggerState::Changed { table, .. } if !table.eq_ignore_ascii_case(&self.table) => {
                Some(table.clone())
            }
            _ => None,
        });
        match (moved_to, changed.is_empty()) {
            (Some(to), _) => parts.push(format!(
                "table {} was renamed to {to}: its triggers moved with it and still capture, under \
                 the old name; capture {to} instead",
                self.table
            )),
            (None, false) => parts.push(format!(
                "{}: trigger{} {} rewritten since outboxd installed {} (an ALTER TABLE \
                 renamed a column?): {} still capture, but not as the capture says",
                self.label(),
                plural(changed.len()),
                names(&changed),
                if changed.len() == 1 { "it" } else { "them" },
                if changed.len() == 1 { "it" } else { "they" },
            )),
            (None, true) => {}
        }
        if self.breaks_writes() {
            parts.push(format!(
                "the shared view {EVENT_VIEW} or a trigger of it is missing or changed: the host's \
                 writes to {} FAIL until `outboxd capture apply` reinstalls it",
                self.table
            ));
        }
        Some(parts.join("; "))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn ago(d: std::time::Duration) -> String {
    crate::clock::format_duration(std::time::Duration::from_secs(d.as_secs()))
}

/// Every recorded capture with the state of its triggers. Reads only, so it
/// works on a read-only connection (status, doctor, the console).
pub fn inspect(conn: &Connection) -> Result<Vec<CaptureStatus>> {
    schema::ensure_current(conn)?;
    let installed = installed_objects(conn)?;
    let recorded: Vec<(String, String, String, String)> = {
        let mut stmt = conn
            .prepare(
                "SELECT name, type, capture_name, sql FROM outboxd_capture_object ORDER BY rowid",
            )
            .map_err(Error::db("read the recorded capture triggers"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(Error::db("read the recorded capture triggers"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(Error::db("read the recorded capture triggers"))?
    };
    let status = |(name, kind, owner, sql): &(String, String, String, String)| ObjectStatus {
        name: name.clone(),
        kind: kind.clone(),
        shared: owner.is_empty(),
        state: match installed.get(name) {
            Some(o) if o.kind == *kind && o.sql == *sql => TriggerState::Installed,
            Some(o) => TriggerState::Changed {
                table: o.on.clone(),
                sql: o.sql.clone(),
            },
            None => TriggerState::Missing,
        },
    };
    let shared: Vec<ObjectStatus> = recorded
        .iter()
        .filter(|r| r.2.is_empty())
        .map(status)
        .collect();
    let mut gaps = open_gaps(conn)?;
    let captures: Vec<(String, String, String, i64, i64)> = {
        let mut stmt = conn
            .prepare(
                "SELECT name, table_name, spec, installed_at, verified_at FROM outboxd_capture ORDER BY table_name, name",
            )
            .map_err(Error::db("read the recorded captures"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .map_err(Error::db("read the recorded captures"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(Error::db("read the recorded captures"))?
    };
    let mut out = Vec::new();
    for (name, table, spec, installed_at, verified_at) in captures {
        let spec: CaptureSpec = serde_json::from_str(&spec).map_err(|e| {
            Error::from(super::CaptureError::Record {
                table: table.clone(),
                reason: e.to_string(),
            })
        })?;
        let table_exists: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE)",
                [&table],
                |r| r.get(0),
            )
            .map_err(Error::db("look for a captured table"))?;
        let mut objects: Vec<ObjectStatus> = recorded
            .iter()
            .filter(|r| r.2 == name)
            .map(status)
            .collect();
        objects.extend(shared.iter().cloned());
        let (mine, rest): (Vec<Gap>, Vec<Gap>) = gaps
            .into_iter()
            .partition(|g| g.capture.eq_ignore_ascii_case(&name));
        gaps = rest;
        let mut status = CaptureStatus {
            name,
            table,
            spec,
            installed_at: Timestamp::from_millis(installed_at),
            verified_at: Timestamp::from_millis(verified_at),
            table_exists,
            objects,
            newest_event_at: None,
            gaps: mine,
        };
        if !status.is_intact() {
            status.newest_event_at = newest_event(conn, &status.spec)?;
        }
        out.push(status);
    }
    Ok(out)
}

/// One recorded capture, by name (any case): its spec, table and
/// `installed_at`.
pub(crate) fn recorded(
    conn: &Connection,
    name: &str,
) -> Result<Option<(CaptureSpec, String, i64)>> {
    use rusqlite::OptionalExtension;
    let row: Option<(String, String, String, i64)> = conn
        .query_row(
            "SELECT name, table_name, spec, installed_at FROM outboxd_capture WHERE name = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .map_err(Error::db("read the recorded captures"))?;
    let Some((name, table, spec, installed_at)) = row else {
        return Ok(None);
    };
    let mut spec: CaptureSpec = serde_json::from_str(&spec).map_err(|e| {
        Error::from(super::CaptureError::Record {
            table: table.clone(),
            reason: e.to_string(),
        })
    })?;
    spec.name = Some(name);
    Ok(Some((spec, table, installed_at)))
}

/// The recorded captures of a table (any case): their names.
pub(crate) fn names_of(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare(
            "SELECT name FROM outboxd_capture WHERE table_name = ?1 COLLATE NOCASE ORDER BY name",
        )
        .map_err(Error::db("read the recorded captures"))?;
    let rows = stmt
        .query_map([table], |r| r.get(0))
        .map_err(Error::db("read the recorded captures"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the recorded captures"))
}

/// The newest event of a capture's types still in the outbox. Scans the
/// outbox (event types are not indexed), so it runs only on drift.
fn newest_event(conn: &Connection, spec: &CaptureSpec) -> Result<Option<Timestamp>> {
    let types: Vec<String> = spec
        .operations()
        .into_iter()
        .filter_map(|op| spec.event_type_for(op).ok())
        .map(|t| t.to_string())
        .collect();
    let marks = vec!["?"; types.len()].join(",");
    conn.query_row(
        &format!("SELECT max(occurred_at) FROM event_outbox WHERE event_type IN ({marks})"),
        rusqlite::params_from_iter(&types),
        |r| r.get::<_, Option<i64>>(0),
    )
    .map(|t| t.map(Timestamp::from_millis))
    .map_err(Error::db("find the newest captured event"))
}

/// Records when captures were seen intact: for each `(name, at)`,
/// `verified_at` moves forward to `at` (never back), all in one `BEGIN
/// IMMEDIATE` transaction; returns how many moved. `at` must be the time of
/// an [`inspect`] that found the capture intact: the value is what a later
/// warning's "missing since some time after …" rests on. A name with no
/// capture is skipped; a capture already verified at or after `at` is not
/// written at all.
pub fn mark_verified(conn: &mut Connection, seen: &[(String, Timestamp)]) -> Result<usize> {
    if seen.is_empty() {
        return Ok(0);
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(Error::db("record a capture check"))?;
    let mut moved = 0;
    for (name, at) in seen {
        moved += tx
            .execute(
                "UPDATE outboxd_capture SET verified_at = ?2 WHERE name = ?1 AND verified_at < ?2",
                params![name, at.as_millis()],
            )
            .map_err(Error::db("record a capture check"))?;
    }
    tx.commit().map_err(Error::db("record a capture check"))?;
    Ok(moved)
}
