//! Snapshots: one `r` event per existing row of a captured table, so a new
//! consumer, a new index or a consumer after a gap gets the rows that
//! already exist (Debezium's snapshot, done in SQL).
//!
//! A snapshot reads its table in chunks in key order (the rowid, or a
//! WITHOUT ROWID table's primary key). Each chunk is read, its events
//! written and the cursor moved in one short `BEGIN IMMEDIATE` transaction,
//! so the host's writers wait for one chunk at most, a crash or kill -9
//! loses no more than the chunk in flight (rolled back, read again on
//! resume), and a row's live changes are ordered against its `r` event: a
//! change committed before the chunk is before it in the outbox (and the
//! `r` event shows its result), one committed after is after it. Events of
//! one row share the capture's ordering key, so each consumer gets them in
//! that order. Two processes driving one snapshot share its chunks: each
//! reads the cursor under the write lock.
//!
//! Markers (`{op}` as `snapshot_started` / `snapshot_completed`, ordering key
//! `snapshot:<capture>`) carry the snapshot's id, table, start time and, at
//! the end, its row count: a consumer that has counted as many `r` events of
//! that id sweeps away what the snapshot did not mention (docs/capture.md).

mod cursor;
mod store;

use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};

use self::cursor::{Bound, KeyValue};
pub use self::store::{snapshots, Snapshot, SnapshotState};
use super::drift::{names_of, recorded};
use super::generate::EVENT_VIEW;
use super::objects::{damaged, installed_objects};
use super::resolve::resolve;
use super::CaptureError;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::schema;

/// How a snapshot reads its table.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// An SQL condition on the table's columns: only rows meeting it are
    /// sent (a filtered snapshot covers no gap).
    pub filter: Option<String>,
    /// The most rows one chunk reads (default 500).
    pub chunk_rows: usize,
    /// A chunk ends early once its payloads reach this many bytes
    /// (default 4 MiB): what one transaction writes, and what the process
    /// holds, stays bounded whatever the rows hold.
    pub chunk_bytes: u64,
    /// At most this many rows read per second; None: as fast as the
    /// chunks go.
    pub rate: Option<u32>,
    /// Who starts it (`cli`, `auto`, `console`, `library`).
    pub origin: String,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            filter: None,
            chunk_rows: 500,
            chunk_bytes: 4 << 20,
            rate: None,
            origin: "library".into(),
        }
    }
}

/// The marker events' ordering key: one capture's markers in order.
fn marker_key(capture: &str) -> String {
    format!("snapshot:{capture}")
}

fn write_event(conn: &Connection, ty: &str, payload: &str, key: &str) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO {EVENT_VIEW} (event_type, payload, tenant_id, ordering_key) VALUES (?1, ?2, NULL, ?3)"
    ))
    .and_then(|mut s| s.execute(params![ty, payload, key]))
    .map_err(Error::db("write a snapshot marker"))?;
    Ok(())
}

/// Why the capture cannot be read now, if it cannot: not recorded, its
/// triggers not intact (live changes would go uncaptured), or reinstalled
/// since `installed_at`.
fn check_capture(
    conn: &Connection,
    name: &str,
    installed_at: Option<i64>,
) -> Result<std::result::Result<(super::CaptureSpec, String, i64), String>> {
    let Some((spec, table, at)) = recorded(conn, name)? else {
        return Ok(Err(format!("capture {name} is no longer installed")));
    };
    let installed = installed_objects(conn)?;
    let (missing, changed) = damaged(conn, name, &installed)?;
    let (shared_missing, shared_changed) = damaged(conn, "", &installed)?;
    let broken: Vec<String> = [missing, changed, shared_missing, shared_changed].concat();
    if !broken.is_empty() {
        return Ok(Err(format!(
            "capture {name}'s triggers are not intact ({}): was table {table} rebuilt? \
             Reinstall them with `outboxd capture apply`, then snapshot again",
            broken.join(", ")
        )));
    }
    if installed_at.is_some_and(|t| t != at) {
        return Ok(Err(format!(
            "capture {name} was reinstalled during the snapshot (table {table} rebuilt, or \
             `capture apply` changed it): start a new snapshot"
        )));
    }
    Ok(Ok((spec, table, at)))
}

/// Starts a snapshot of capture `name`, or returns its running one (a
/// snapshot stopped by a crash resumes from its cursor). Writes the
/// `snapshot_started` marker. Fails when the capture's triggers are not
/// intact, when it cannot be snapshotted (its `when` reads OLD, it captures
/// deletes only), or when its running snapshot has another filter.
pub fn start(
    conn: &mut Connection,
    name: &str,
    opts: &SnapshotOptions,
    now: Timestamp,
) -> Result<Snapshot> {
    schema::ensure_current(conn)?;
    let filter = opts
        .filter
        .as_deref()
        .map(str::trim)
        .filter(|f| !f.is_empty());
    // Counted before the write transaction: a count reads the whole table.
    let total = match recorded(conn, name)? {
        Some((_, table, _)) => conn
            .query_row(
                &format!("SELECT count(*) FROM {}", super::sqltext::ident(&table)),
                [],
                |r| r.get::<_, i64>(0),
            )
            .ok()
            .map(|n| n.max(0) as u64),
        None => None,
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start a snapshot"))?;
    let (spec, table, installed_at) = match check_capture(&tx, name, None)? {
        Ok(c) => c,
        Err(_) if recorded(&tx, name)?.is_none() => {
            return Err(Error::NotFound {
                what: format!("a capture named {name:?}"),
            });
        }
        Err(reason) => return Err(snapshot_error(name, reason)),
    };
    let plan = resolve(&tx, &spec)?;
    let id = crate::EventId::new().to_string();
    let sql = plan.snapshot_sql(&id, filter)?;
    tx.prepare(&sql.first).map_err(|e| {
        Error::from(CaptureError::Invalid {
            table: table.clone(),
            field: "where",
            reason: format!("it does not compile on {table}: {e}"),
        })
    })?;
    if let Some(run) = store::running(&tx, &plan.name)? {
        if run.filter.as_deref() != filter {
            return Err(snapshot_error(
                &plan.name,
                format!(
                    "snapshot {} of it is running with {}; finish it, or cancel it with \
                     `outboxd capture snapshot --cancel {}`",
                    run.id,
                    run.filter
                        .as_deref()
                        .map_or("no --where".to_string(), |f| format!("--where {f:?}")),
                    run.id
                ),
            ));
        }
        tx.commit().map_err(Error::db("start a snapshot"))?;
        return Ok(run);
    }
    let last_key: Option<Vec<KeyValue>> = {
        let mut stmt = tx
            .prepare(&sql.last)
            .map_err(Error::db("read a table's last key"))?;
        let mut rows = stmt
            .query([])
            .map_err(Error::db("read a table's last key"))?;
        match rows.next().map_err(Error::db("read a table's last key"))? {
            Some(r) => Some(
                (0..sql.cursor_len)
                    .map(|i| r.get_ref(i).map(KeyValue::read))
                    .collect::<rusqlite::Result<_>>()
                    .map_err(Error::db("read a table's last key"))?,
            ),
            None => None,
        }
    };
    let snapshot = Snapshot {
        id,
        capture: plan.name.clone(),
        table: table.clone(),
        filter: filter.map(str::to_string),
        state: SnapshotState::Running,
        origin: opts.origin.clone(),
        started_at: now,
        updated_at: now,
        finished_at: None,
        scanned: 0,
        rows: 0,
        total,
        message: None,
        installed_at,
        cursor: None,
        last_key,
    };
    store::insert(&tx, &snapshot)?;
    let marker = serde_json::json!({
        "op": "snapshot_started", "table": table, "capture": plan.name,
        "snapshot_id": snapshot.id, "started_at": now.as_millis(), "where": filter,
    });
    write_event(
        &tx,
        spec.event_type_with("snapshot_started")?.as_str(),
        &marker.to_string(),
        &marker_key(&plan.name),
    )?;
    tx.commit().map_err(Error::db("start a snapshot"))?;
    Ok(snapshot)
}

fn snapshot_error(capture: &str, reason: String) -> Error {
    CaptureError::Snapshot {
        capture: capture.to_string(),
        reason,
    }
    .into()
}

/// Reads one chunk of snapshot `id` and writes its events, in one `BEGIN
/// IMMEDIATE` transaction; after the last row it writes the
/// `snapshot_completed` marker and marks the gaps it covers. Returns the
/// snapshot as it is then: a snapshot no longer running (completed,
/// cancelled, or failed here because its table was rebuilt) is returned as
/// it is, and nothing is written.
pub fn step(
    conn: &mut Connection,
    id: &str,
    opts: &SnapshotOptions,
    now: Timestamp,
) -> Result<Snapshot> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start a snapshot chunk"))?;
    let Some(snap) = store::get(&tx, id)? else {
        return Err(Error::NotFound {
            what: format!("snapshot {id}"),
        });
    };
    if snap.state != SnapshotState::Running {
        return Ok(snap);
    }
    let spec = match check_capture(&tx, &snap.capture, Some(snap.installed_at))? {
        Ok((spec, ..)) => spec,
        Err(reason) => {
            store::finish(&tx, id, SnapshotState::Failed, Some(&reason), now)?;
            tx.commit().map_err(Error::db("record a failed snapshot"))?;
            return store::get(conn, id)?.ok_or_else(|| Error::NotFound {
                what: format!("snapshot {id}"),
            });
        }
    };
    let plan = resolve(&tx, &spec)?;
    let sql = plan.snapshot_sql(&snap.id, snap.filter.as_deref())?;
    let limit = opts.chunk_rows.max(1) as i64;
    let (mut scanned, mut rows, mut bytes) = (0u64, 0u64, 0u64);
    let mut last: Option<Vec<KeyValue>> = None;
    if let Some(until) = &snap.last_key {
        let mut stmt = match &snap.cursor {
            None => tx.prepare(&sql.first),
            Some(_) => tx.prepare(&sql.next),
        }
        .map_err(Error::db("prepare a snapshot chunk"))?;
        let mut bound: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
        for v in snap.cursor.iter().flatten().chain(until) {
            bound.push(Box::new(Bound::of(v)));
        }
        bound.push(Box::new(limit));
        let mut found = stmt
            .query(rusqlite::params_from_iter(bound.iter()))
            .map_err(Error::db("read a snapshot chunk"))?;
        let mut insert = tx
            .prepare_cached(&format!(
                "INSERT INTO {EVENT_VIEW} (event_type, payload, tenant_id, ordering_key) VALUES (?1, ?2, ?3, ?4)"
            ))
            .map_err(Error::db("prepare a snapshot chunk"))?;
        let n = sql.cursor_len;
        while let Some(r) = found.next().map_err(Error::db("read a snapshot chunk"))? {
            let get = |i: usize| r.get_ref(i).map_err(Error::db("read a snapshot row"));
            last = Some(
                (0..n)
                    .map(|i| get(i).map(KeyValue::read))
                    .collect::<Result<_>>()?,
            );
            scanned += 1;
            let payload = get(n + 1)?;
            if payload == rusqlite::types::ValueRef::Null {
                continue;
            }
            bytes += payload.as_bytes().map_or(0, |b| b.len() as u64);
            insert
                .execute(params![
                    Raw(get(n)?),
                    Raw(payload),
                    Raw(get(n + 2)?),
                    Raw(get(n + 3)?)
                ])
                .map_err(Error::db("write a snapshot event"))?;
            rows += 1;
            if bytes >= opts.chunk_bytes {
                break;
            }
        }
    }
    match last {
        Some(cursor) => store::advance(&tx, id, &cursor, scanned, rows, now)?,
        None => {
            let marker = serde_json::json!({
                "op": "snapshot_completed", "table": snap.table, "capture": snap.capture,
                "snapshot_id": snap.id, "started_at": snap.started_at.as_millis(),
                "where": snap.filter, "rows": snap.rows,
            });
            write_event(
                &tx,
                spec.event_type_with("snapshot_completed")?.as_str(),
                &marker.to_string(),
                &marker_key(&snap.capture),
            )?;
            store::finish(&tx, id, SnapshotState::Completed, None, now)?;
            if snap.filter.is_none() {
                super::gap::cover(&tx, &snap.capture, snap.started_at, &snap.id, now)?;
            }
        }
    }
    tx.commit().map_err(Error::db("commit a snapshot chunk"))?;
    store::get(conn, id)?.ok_or_else(|| Error::NotFound {
        what: format!("snapshot {id}"),
    })
}

/// A value read from one statement, bound into another as it is.
struct Raw<'a>(rusqlite::types::ValueRef<'a>);

impl rusqlite::ToSql for Raw<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(self.0))
    }
}

/// How long [`run`] waits after the host held the write lock past the
/// connection's busy timeout, before it tries the chunk again.
const BUSY_PAUSE: Duration = Duration::from_millis(200);

/// Starts (or resumes) a snapshot of capture `name` and drives it to its
/// end, chunk after chunk, at most `opts.rate` rows a second. `progress` is
/// called after each chunk; returning false stops (the snapshot stays
/// running and resumes from there). A chunk that meets a busy host is tried
/// again. Fails when the snapshot failed (its table was rebuilt).
pub fn run(
    conn: &mut Connection,
    name: &str,
    opts: &SnapshotOptions,
    mut progress: impl FnMut(&Snapshot) -> bool,
) -> Result<Snapshot> {
    let snap = start(conn, name, opts, Timestamp::now())?;
    drive(conn, &snap.id, opts, &mut progress)
}

/// Drives a started snapshot to its end (see [`run`]).
pub fn drive(
    conn: &mut Connection,
    id: &str,
    opts: &SnapshotOptions,
    progress: &mut dyn FnMut(&Snapshot) -> bool,
) -> Result<Snapshot> {
    let mut opts = opts.clone();
    if let Some(rate) = opts.rate {
        opts.chunk_rows = opts.chunk_rows.min(rate.max(1) as usize);
    }
    let began = Instant::now();
    let mut first_scanned: Option<u64> = None;
    loop {
        let snap = match step(conn, id, &opts, Timestamp::now()) {
            Ok(s) => s,
            Err(e) if e.is_busy() => {
                std::thread::sleep(BUSY_PAUSE);
                continue;
            }
            Err(e) => return Err(e),
        };
        let go_on = progress(&snap);
        match snap.state {
            SnapshotState::Running => {}
            SnapshotState::Failed => {
                return Err(snapshot_error(
                    &snap.capture,
                    snap.message.clone().unwrap_or_else(|| "it failed".into()),
                ))
            }
            _ => return Ok(snap),
        }
        if !go_on {
            return Ok(snap);
        }
        if let Some(rate) = opts.rate {
            // Rows read by this drive (a resumed snapshot read some before).
            let before = *first_scanned.get_or_insert(0);
            let read = snap.scanned.saturating_sub(before);
            let due = Duration::from_secs_f64(read as f64 / f64::from(rate.max(1)));
            if let Some(wait) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
}

/// The captures of `table` a snapshot can read (not those whose condition
/// reads OLD, nor those of deletes only), by name.
pub fn snapshottable(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in names_of(conn, table)? {
        if let Some((spec, ..)) = recorded(conn, &name)? {
            if let Ok(plan) = resolve(conn, &spec) {
                if plan.not_snapshottable().is_none() {
                    out.push(name);
                }
            }
        }
    }
    Ok(out)
}

/// Which running snapshots [`cancel`] stops.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotSelection {
    /// One snapshot, by id.
    Id(String),
    /// The running snapshot of a capture.
    Capture(String),
}

/// Cancels running snapshots: their driver stops at its next chunk, and no
/// completed marker is written. Returns the snapshots cancelled.
pub fn cancel(conn: &Connection, which: &SnapshotSelection, now: Timestamp) -> Result<Vec<String>> {
    schema::ensure_current(conn)?;
    let ids: Vec<String> = match which {
        SnapshotSelection::Id(id) => vec![id.clone()],
        SnapshotSelection::Capture(c) => {
            store::running(conn, c)?.into_iter().map(|s| s.id).collect()
        }
    };
    let mut done = Vec::new();
    for id in ids {
        if store::finish(
            conn,
            &id,
            SnapshotState::Cancelled,
            Some("cancelled by an operator"),
            now,
        )? {
            done.push(id);
        }
    }
    Ok(done)
}

/// When the newest snapshot of a capture started by `origin` started: the
/// throttle of `auto_snapshot`.
pub fn last_started(conn: &Connection, capture: &str, origin: &str) -> Result<Option<Timestamp>> {
    store::last_started(conn, capture, origin)
}

/// The running snapshots (to resume them).
pub fn running(conn: &Connection) -> Result<Vec<Snapshot>> {
    Ok(snapshots(conn, 1000)?
        .into_iter()
        .filter(|s| s.state == SnapshotState::Running)
        .collect())
}
