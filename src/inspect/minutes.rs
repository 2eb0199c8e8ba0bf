//! Events inserted, delivered and dead-lettered per minute, as the table
//! tells (retries leave no trace there).

use std::collections::BTreeMap;

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Error, Result};

/// One minute's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinuteCounts {
    /// The minute, counted from the Unix epoch.
    pub minute: i64,
    /// Rows inserted.
    pub enqueued: u64,
    /// Rows finished as delivered.
    pub delivered: u64,
    /// Rows finished as dead.
    pub dead: u64,
}

const SQL_FINISHED_PER_MINUTE: &str = "SELECT finished_at / 60000, count(*) FROM event_outbox \
     WHERE status <> 'pending' AND status = ?1 AND finished_at >= ?2 GROUP BY 1";

// Two subqueries: each is one seek at an end of the key (min() and max()
// over one table together would walk it).
const SQL_ID_RANGE: &str =
    "SELECT (SELECT min(id) FROM event_outbox), (SELECT max(id) FROM event_outbox)";

const SQL_FIRST_ROW_FROM: &str =
    "SELECT id, created_at FROM event_outbox WHERE id >= ?1 ORDER BY id LIMIT 1";

const SQL_CREATED_PER_MINUTE: &str = "SELECT created_at / 60000, count(*) FROM event_outbox \
     WHERE id >= ?1 AND created_at >= ?2 GROUP BY 1";

const SQL_ENQUEUED_TOTAL: &str = "SELECT seq FROM sqlite_sequence WHERE name = 'event_outbox'";

/// Rows ever inserted into the outbox (its AUTOINCREMENT sequence).
pub fn enqueued_total(conn: &Connection) -> Result<u64> {
    let seq: Option<i64> = conn
        .prepare_cached(SQL_ENQUEUED_TOTAL)
        .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
        .map_err(Error::db("read the outbox's row-id sequence"))?;
    Ok(seq.map_or(0, |s| u64::try_from(s).unwrap_or(0)))
}

/// Per minute since `since` (ms), oldest first: rows inserted, delivered
/// and dead-lettered. Inserts are counted from the first row created since
/// then, found by a binary search on the row id (ids follow commit order,
/// so creation times rise with them), which needs no index on `created_at`.
pub fn minute_counts(conn: &Connection, since: i64) -> Result<Vec<MinuteCounts>> {
    count_minutes(conn, since).map_err(Error::db("count events per minute"))
}

fn count_minutes(conn: &Connection, since: i64) -> rusqlite::Result<Vec<MinuteCounts>> {
    let mut by_minute = BTreeMap::<i64, MinuteCounts>::new();
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let mut finished = conn.prepare_cached(SQL_FINISHED_PER_MINUTE)?;
    for status in ["delivered", "dead"] {
        let rows = finished.query_map(params![status, since], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (m, n) = row?;
            let c = minute(&mut by_minute, m);
            if status == "dead" {
                c.dead = count(n);
            } else {
                c.delivered = count(n);
            }
        }
    }
    if let Some(first) = first_row_from(conn, since)? {
        let mut created = conn.prepare_cached(SQL_CREATED_PER_MINUTE)?;
        let rows = created.query_map(params![first, since], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (m, n) = row?;
            minute(&mut by_minute, m).enqueued = count(n);
        }
    }
    Ok(by_minute.into_values().collect())
}

fn minute(by_minute: &mut BTreeMap<i64, MinuteCounts>, m: i64) -> &mut MinuteCounts {
    by_minute.entry(m).or_insert(MinuteCounts {
        minute: m,
        ..MinuteCounts::default()
    })
}

/// The first id whose row was created at or after `since` (or past the
/// last row), by a binary search over the ids; None for an empty table.
fn first_row_from(conn: &Connection, since: i64) -> rusqlite::Result<Option<i64>> {
    let (lo, hi): (Option<i64>, Option<i64>) = conn
        .prepare_cached(SQL_ID_RANGE)?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let (Some(mut lo), Some(mut hi)) = (lo, hi) else {
        return Ok(None);
    };
    let mut first = conn.prepare_cached(SQL_FIRST_ROW_FROM)?;
    hi += 1;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let found: Option<(i64, i64)> = first
            .query_row([mid], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match found {
            Some((id, created)) if created < since => lo = id + 1,
            _ => hi = mid,
        }
    }
    Ok(Some(lo))
}

#[cfg(test)]
pub(super) const STATEMENTS: [(&str, &str); 5] = [
    ("finished per minute", SQL_FINISHED_PER_MINUTE),
    ("id range", SQL_ID_RANGE),
    ("first row from", SQL_FIRST_ROW_FROM),
    ("created per minute", SQL_CREATED_PER_MINUTE),
    ("enqueued total", SQL_ENQUEUED_TOTAL),
];
