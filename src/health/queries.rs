//! The bounded reads the verdict (and the status, and the relay's stale
//! check) measure with.

use std::time::Duration;

use rusqlite::{params, Connection};

use crate::clock::Timestamp;
use crate::error::{Error, Result};

use super::IMPLAUSIBLE_DELAY;

/// A read transaction, so several reads are one consistent snapshot, when
/// the connection is in autocommit mode (otherwise the caller's holds);
/// end it with `finish`.
pub(crate) fn read_transaction(conn: &Connection) -> Result<Option<rusqlite::Transaction<'_>>> {
    if !conn.is_autocommit() {
        return Ok(None);
    }
    conn.unchecked_transaction()
        .map(Some)
        .map_err(Error::db("start a read transaction"))
}

/// The due time of the oldest due event (pending, `available_at <= now`),
/// None when nothing is due: the measure of a stuck relay, since events
/// delayed on purpose are not due. A row whose lease expired counts, since
/// it is due to be claimed again. One seek on the due index, however long
/// the queue. The status, the relay's stale check and [`check`](super::check) all
/// measure staleness with it.
pub fn oldest_due(conn: &Connection, now: Timestamp) -> Result<Option<Timestamp>> {
    conn.prepare_cached(
        "SELECT min(available_at) FROM event_outbox
         WHERE status = 'pending' AND available_at <= ?1",
    )
    .and_then(|mut s| s.query_row([now.as_millis()], |r| r.get::<_, Option<i64>>(0)))
    .map(|t| t.map(Timestamp::from_millis))
    .map_err(Error::db("find the oldest due event"))
}

/// What one pass over the pending rows measures: the status's counts and
/// the verdict's inputs, so both read the same figures.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pending {
    /// Not leased, `available_at <= now`.
    pub due: u64,
    /// Not leased, `available_at > now`.
    pub delayed: u64,
    /// Claimed (a token set), live or expired.
    pub leased: u64,
    /// Leases with `lease_until > now`.
    pub live: u64,
    /// Leases with `lease_until <= now`.
    pub expired: u64,
    pub furthest_lease: Option<Duration>,
    pub furthest_retry: Option<Duration>,
    pub implausible_delays: u64,
    /// The `created_at` of the oldest row that is due, claimed or failed
    /// before: every undelivered event but those delayed on purpose and
    /// never tried.
    pub oldest_undelivered: Option<Timestamp>,
}

/// One pass over the pending rows (the due index's partial range).
pub(crate) fn pending(conn: &Connection, now: Timestamp) -> Result<Pending> {
    conn.prepare_cached(
        "SELECT
             coalesce(sum(claim_token IS NULL AND available_at <= ?1), 0),
             coalesce(sum(claim_token IS NULL AND available_at > ?1), 0),
             coalesce(sum(claim_token IS NOT NULL), 0),
             coalesce(sum(claim_token IS NOT NULL AND lease_until > ?1), 0),
             coalesce(sum(claim_token IS NOT NULL AND lease_until <= ?1), 0),
             max(CASE WHEN claim_token IS NOT NULL THEN lease_until END),
             max(CASE WHEN claim_token IS NULL AND attempts > 0 THEN available_at END),
             coalesce(sum(claim_token IS NULL AND attempts = 0 AND available_at > ?2), 0),
             min(CASE WHEN claim_token IS NOT NULL OR attempts > 0 OR available_at <= ?1
                      THEN created_at END)
         FROM event_outbox WHERE status = 'pending'",
    )
    .and_then(|mut s| {
        s.query_row(
            params![now.as_millis(), now.plus(IMPLAUSIBLE_DELAY).as_millis()],
            |r| {
                Ok(Pending {
                    due: count_column(r, 0)?,
                    delayed: count_column(r, 1)?,
                    leased: count_column(r, 2)?,
                    live: count_column(r, 3)?,
                    expired: count_column(r, 4)?,
                    furthest_lease: ahead(r, 5, now)?,
                    furthest_retry: ahead(r, 6, now)?,
                    implausible_delays: count_column(r, 7)?,
                    oldest_undelivered: r.get::<_, Option<i64>>(8)?.map(Timestamp::from_millis),
                })
            },
        )
    })
    .map_err(Error::db("count pending events"))
}

/// The most stale events [`stale_count`] counts: beyond it the exact number
/// does not matter, and counting a huge backlog would hold a read open.
pub const STALE_COUNT_BOUND: u64 = 1_000_000;

/// How many due events have waited longer than `after` (up to
/// [`STALE_COUNT_BOUND`]).
pub fn stale_count(conn: &Connection, now: Timestamp, after: Duration) -> Result<u64> {
    conn.prepare_cached(
        "SELECT count(*) FROM (SELECT 1 FROM event_outbox
          WHERE status = 'pending' AND available_at <= ?1 LIMIT ?2)",
    )
    .and_then(|mut s| {
        s.query_row(
            params![now.minus(after).as_millis(), STALE_COUNT_BOUND as i64],
            |r| r.get::<_, i64>(0),
        )
    })
    .map(|n| n.max(0) as u64)
    .map_err(Error::db("count stale events"))
}

pub(crate) const DEAD_COUNT: &str =
    "SELECT count(*) FROM event_outbox WHERE status <> 'pending' AND status = 'dead'";

/// How many events are dead-lettered: a range of the finished-rows index,
/// so it costs the dead letters, not the table (the `status <> 'pending'`
/// term lets SQLite use that partial index).
pub fn dead_count(conn: &Connection) -> Result<u64> {
    conn.prepare_cached(DEAD_COUNT)
        .and_then(|mut s| s.query_row([], |r| count_column(r, 0)))
        .map_err(Error::db("count dead letters"))
}

/// How far ahead of `now` a time column's value is: None for NULL or a time
/// not ahead (the schema keeps these columns integers).
fn ahead(r: &rusqlite::Row<'_>, i: usize, now: Timestamp) -> rusqlite::Result<Option<Duration>> {
    Ok(r.get::<_, Option<i64>>(i)?
        .map(Timestamp::from_millis)
        .filter(|t| *t > now)
        .map(|t| t.since(now)))
}

/// Reads a count(*) or sum() column; SQLite never returns a negative one.
pub(crate) fn count_column(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(u64::try_from(r.get::<_, i64>(i)?).unwrap_or(0))
}
