//! The snapshot table's SQL (`outboxd_capture_snapshot`): one row per
//! snapshot, its progress written with each chunk.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use super::cursor::KeyValue;
use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// Where a snapshot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SnapshotState {
    /// Started and not finished: running, or stopped by a crash and
    /// resumable (run it again).
    Running,
    /// Every row was read; its completed marker was written.
    Completed,
    /// Cancelled by an operator.
    Cancelled,
    /// Stopped by a change it cannot go on through (the table rebuilt).
    Failed,
}

impl SnapshotState {
    fn parse(s: &str) -> SnapshotState {
        match s {
            "completed" => SnapshotState::Completed,
            "cancelled" => SnapshotState::Cancelled,
            "failed" => SnapshotState::Failed,
            _ => SnapshotState::Running,
        }
    }

    /// The state as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Running => "running",
            SnapshotState::Completed => "completed",
            SnapshotState::Cancelled => "cancelled",
            SnapshotState::Failed => "failed",
        }
    }
}

/// One snapshot and its progress.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Snapshot {
    /// Its id (a ULID), in its markers' `snapshot_id`.
    pub id: String,
    /// The capture's name.
    pub capture: String,
    /// Its table.
    pub table: String,
    /// The operator's `--where`, if any.
    pub filter: Option<String>,
    /// Where it is.
    pub state: SnapshotState,
    /// Who started it: `cli`, `auto`, `console` or `library`.
    pub origin: String,
    /// When it started.
    pub started_at: Timestamp,
    /// When its last chunk was written.
    pub updated_at: Timestamp,
    /// When it completed, was cancelled or failed.
    pub finished_at: Option<Timestamp>,
    /// Rows read so far.
    pub scanned: u64,
    /// `r` events written so far (rows that passed the capture's condition
    /// and the `--where`).
    pub rows: u64,
    /// The table's row count when it started.
    pub total: Option<u64>,
    /// Why it failed or was cancelled.
    pub message: Option<String>,
    /// The capture's `installed_at` when it started.
    #[serde(skip)]
    pub(crate) installed_at: i64,
    /// The key of the last row read.
    #[serde(skip)]
    pub(crate) cursor: Option<Vec<KeyValue>>,
    /// The table's last key when it started; None: it was empty.
    #[serde(skip)]
    pub(crate) last_key: Option<Vec<KeyValue>>,
}

const COLUMNS: &str = "id, capture, table_name, filter, state, origin, started_at, updated_at, \
                       finished_at, scanned, rows, total, message, installed_at, cursor, last_key";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Snapshot> {
    let count = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    Ok(Snapshot {
        id: r.get(0)?,
        capture: r.get(1)?,
        table: r.get(2)?,
        filter: r.get(3)?,
        state: SnapshotState::parse(&r.get::<_, String>(4)?),
        origin: r.get(5)?,
        started_at: Timestamp::from_millis(r.get(6)?),
        updated_at: Timestamp::from_millis(r.get(7)?),
        finished_at: r.get::<_, Option<i64>>(8)?.map(Timestamp::from_millis),
        scanned: count(9)?,
        rows: count(10)?,
        total: r.get::<_, Option<i64>>(11)?.map(|n| n.max(0) as u64),
        message: r.get(12)?,
        installed_at: r.get(13)?,
        cursor: r
            .get::<_, Option<String>>(14)?
            .and_then(|c| serde_json::from_str(&c).ok()),
        last_key: r
            .get::<_, Option<String>>(15)?
            .and_then(|c| serde_json::from_str(&c).ok()),
    })
}

/// Records a new snapshot.
pub(crate) fn insert(conn: &Connection, s: &Snapshot) -> Result<()> {
    conn.execute(
        "INSERT INTO outboxd_capture_snapshot
             (id, capture, table_name, filter, state, origin, started_at, updated_at,
              installed_at, total, last_key)
         VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?6, ?7, ?8, ?9)",
        params![
            s.id,
            s.capture,
            s.table,
            s.filter,
            s.origin,
            s.started_at.as_millis(),
            s.installed_at,
            s.total.map(|n| n as i64),
            s.last_key
                .as_ref()
                .map(|k| serde_json::to_string(k).expect("a key serializes"))
        ],
    )
    .map_err(Error::db("record a snapshot"))?;
    Ok(())
}

/// One snapshot by id.
pub(crate) fn get(conn: &Connection, id: &str) -> Result<Option<Snapshot>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM outboxd_capture_snapshot WHERE id = ?1"),
        [id],
        read,
    )
    .optional()
    .map_err(Error::db("read a snapshot"))
}

/// The running snapshot of a capture, if any.
pub(crate) fn running(conn: &Connection, capture: &str) -> Result<Option<Snapshot>> {
    conn.query_row(
        &format!(
            "SELECT {COLUMNS} FROM outboxd_capture_snapshot
             WHERE capture = ?1 COLLATE NOCASE AND state = 'running' ORDER BY started_at LIMIT 1"
        ),
        [capture],
        read,
    )
    .optional()
    .map_err(Error::db("read the running snapshots"))
}

/// When the newest snapshot of a capture started by `origin` started.
pub(crate) fn last_started(
    conn: &Connection,
    capture: &str,
    origin: &str,
) -> Result<Option<Timestamp>> {
    conn.query_row(
        "SELECT max(started_at) FROM outboxd_capture_snapshot
         WHERE capture = ?1 COLLATE NOCASE AND origin = ?2",
        params![capture, origin],
        |r| r.get::<_, Option<i64>>(0),
    )
    .map(|t| t.map(Timestamp::from_millis))
    .map_err(Error::db("read the snapshots"))
}

/// Every snapshot, newest first (at most `limit`).
pub fn snapshots(conn: &Connection, limit: usize) -> Result<Vec<Snapshot>> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {COLUMNS} FROM outboxd_capture_snapshot ORDER BY started_at DESC, id DESC LIMIT ?1"
        ))
        .map_err(Error::db("read the snapshots"))?;
    let rows = stmt
        .query_map([limit as i64], read)
        .map_err(Error::db("read the snapshots"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the snapshots"))
}

/// Writes a chunk's progress.
pub(crate) fn advance(
    conn: &Connection,
    id: &str,
    cursor: &[KeyValue],
    scanned: u64,
    rows: u64,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "UPDATE outboxd_capture_snapshot
            SET cursor = ?2, scanned = scanned + ?3, rows = rows + ?4, updated_at = ?5
          WHERE id = ?1",
        params![
            id,
            serde_json::to_string(cursor).expect("a cursor serializes"),
            scanned as i64,
            rows as i64,
            now.as_millis()
        ],
    )
    .map_err(Error::db("record a snapshot's progress"))?;
    Ok(())
}

/// Ends a running snapshot in `state` with an optional message; returns
/// whether it was running.
pub(crate) fn finish(
    conn: &Connection,
    id: &str,
    state: SnapshotState,
    message: Option<&str>,
    now: Timestamp,
) -> Result<bool> {
    conn.execute(
        "UPDATE outboxd_capture_snapshot
            SET state = ?2, message = ?3, finished_at = ?4, updated_at = ?4
          WHERE id = ?1 AND state = 'running'",
        params![id, state.as_str(), message, now.as_millis()],
    )
    .map(|n| n > 0)
    .map_err(Error::db("record the end of a snapshot"))
}
