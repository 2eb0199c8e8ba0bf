//! The lasting record of capture gaps (`outboxd_capture_gap`): a window in
//! which a capture's triggers were missing, so the host's writes in it may
//! not have become events. Recorded when the triggers are reinstalled, open
//! until a later complete snapshot covers it or an operator acknowledges it.

use rusqlite::{params, Connection};
use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// What put a capture's triggers back, ending a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GapEnd {
    /// `outboxd capture apply` (or [`apply`](super::apply)).
    Apply,
    /// `outboxd run`'s `auto_repair`.
    Repair,
}

impl GapEnd {
    fn as_str(self) -> &'static str {
        match self {
            GapEnd::Apply => "apply",
            GapEnd::Repair => "repair",
        }
    }
}

/// One recorded gap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// Its id (`outboxd capture ack --gap ID`).
    pub id: i64,
    /// The capture's name.
    pub capture: String,
    /// Its table.
    pub table: String,
    /// The last time outboxd saw the triggers intact: the window starts
    /// after it. An upper bound: they may have gone missing later.
    pub lost_after: Timestamp,
    /// When they were reinstalled: the window ends here.
    pub lost_until: Timestamp,
    /// What reinstalled them: `apply` or `repair`.
    pub ended_by: String,
    /// When the gap was covered by a snapshot or acknowledged; None while
    /// it is open.
    pub resolved_at: Option<Timestamp>,
    /// `snapshot <id>` or `ack`.
    pub resolved_by: Option<String>,
}

impl Gap {
    /// The window in one line, saying it is an upper bound.
    pub fn describe(&self) -> String {
        format!(
            "capture {} of {}: writes made between {} and {} (at most; outboxd last saw its \
             triggers intact at the start) may not have become events; triggers reinstalled by {}",
            self.capture, self.table, self.lost_after, self.lost_until, self.ended_by
        )
    }
}

/// Records a gap of `capture` that `by` ended at `until`.
pub(crate) fn record(
    conn: &Connection,
    capture: &str,
    table: &str,
    after: Timestamp,
    until: Timestamp,
    by: GapEnd,
) -> Result<Gap> {
    conn.execute(
        "INSERT INTO outboxd_capture_gap (capture, table_name, lost_after, lost_until, ended_by)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            capture,
            table,
            after.as_millis(),
            until.as_millis(),
            by.as_str()
        ],
    )
    .map_err(Error::db("record a capture gap"))?;
    Ok(Gap {
        id: conn.last_insert_rowid(),
        capture: capture.to_string(),
        table: table.to_string(),
        lost_after: after,
        lost_until: until,
        ended_by: by.as_str().to_string(),
        resolved_at: None,
        resolved_by: None,
    })
}

const COLUMNS: &str =
    "id, capture, table_name, lost_after, lost_until, ended_by, resolved_at, resolved_by";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Gap> {
    Ok(Gap {
        id: r.get(0)?,
        capture: r.get(1)?,
        table: r.get(2)?,
        lost_after: Timestamp::from_millis(r.get(3)?),
        lost_until: Timestamp::from_millis(r.get(4)?),
        ended_by: r.get(5)?,
        resolved_at: r.get::<_, Option<i64>>(6)?.map(Timestamp::from_millis),
        resolved_by: r.get(7)?,
    })
}

/// Every gap, open or not, newest first (at most `limit`).
pub fn gaps(conn: &Connection, limit: usize) -> Result<Vec<Gap>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM outboxd_capture_gap ORDER BY id DESC LIMIT ?1"
        ))
        .map_err(Error::db("read the capture gaps"))?;
    let rows = stmt
        .query_map([limit as i64], read)
        .map_err(Error::db("read the capture gaps"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the capture gaps"))
}

/// The open gaps, oldest first.
pub fn open_gaps(conn: &Connection) -> Result<Vec<Gap>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM outboxd_capture_gap WHERE resolved_at IS NULL ORDER BY id"
        ))
        .map_err(Error::db("read the open capture gaps"))?;
    let rows = stmt
        .query_map([], read)
        .map_err(Error::db("read the open capture gaps"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the open capture gaps"))
}

/// Which open gaps [`ack`] acknowledges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GapSelection {
    /// One gap, by id.
    Id(i64),
    /// Every open gap of a capture (by name).
    Capture(String),
    /// Every open gap of the captures of a table.
    Table(String),
    /// Every open gap.
    All,
}

/// Acknowledges open gaps (an operator reconciled them another way, or
/// accepts the loss); returns how many.
pub fn ack(conn: &Connection, which: &GapSelection, now: Timestamp) -> Result<usize> {
    let set = "UPDATE outboxd_capture_gap SET resolved_at = ?1, resolved_by = 'ack' \
               WHERE resolved_at IS NULL";
    let t = now.as_millis();
    match which {
        GapSelection::Id(id) => conn.execute(&format!("{set} AND id = ?2"), params![t, id]),
        GapSelection::Capture(c) => conn.execute(
            &format!("{set} AND capture = ?2 COLLATE NOCASE"),
            params![t, c],
        ),
        GapSelection::Table(tb) => conn.execute(
            &format!("{set} AND table_name = ?2 COLLATE NOCASE"),
            params![t, tb],
        ),
        GapSelection::All => conn.execute(set, params![t]),
    }
    .map_err(Error::db("acknowledge capture gaps"))
}

/// Marks the open gaps of `capture` that ended at or before `started` as
/// covered by snapshot `id`; returns how many.
pub(crate) fn cover(
    conn: &Connection,
    capture: &str,
    started: Timestamp,
    id: &str,
    now: Timestamp,
) -> Result<usize> {
    conn.execute(
        "UPDATE outboxd_capture_gap SET resolved_at = ?1, resolved_by = 'snapshot ' || ?2
         WHERE resolved_at IS NULL AND capture = ?3 COLLATE NOCASE AND lost_until <= ?4",
        params![now.as_millis(), id, capture, started.as_millis()],
    )
    .map_err(Error::db("record the gaps a snapshot covered"))
}
