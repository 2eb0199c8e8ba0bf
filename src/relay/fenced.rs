//! The fenced writes that end, extend or release a claim made by
//! [`claim`](super::claim): each is `WHERE id = ? AND claim_token = ?`, so a
//! relay that lost its lease can never overwrite the outcome of the row's
//! new owner. All run on the writer thread's connection, inside its
//! transaction.

use rusqlite::{params, Connection};

use crate::clock::Timestamp;
use crate::connection::id_list;

use rusqlite::types::ValueRef;

/// Marks a row delivered: its consumers have it. A replayed row returns to
/// the status it had before the replay (a dead letter stays one). False if
/// the claim was lost.
pub(crate) fn finish_delivered(
    conn: &Connection,
    row_id: i64,
    token: &str,
    now: Timestamp,
) -> rusqlite::Result<bool> {
    Ok(finish_delivered_many(conn, &[(row_id, token)], now)? == [row_id])
}

/// Marks many rows delivered, each as [`finish_delivered`] does (`rows`:
/// row id and the claim token it must still carry). Returns the ids whose
/// fence held. One [`FINISH_DELIVERED`] per run of rows with one token
/// (the rows of one claim), which costs less per row than one execution
/// per row (BENCHMARKS.md); a run of one row takes
/// [`FINISH_DELIVERED_ONE`].
pub(crate) fn finish_delivered_many(
    conn: &Connection,
    rows: &[(i64, &str)],
    now: Timestamp,
) -> rusqlite::Result<Vec<i64>> {
    let mut kept = Vec::with_capacity(rows.len());
    if rows.is_empty() {
        return Ok(kept);
    }
    let mut stmt = conn.prepare_cached(FINISH_DELIVERED)?;
    for run in rows.chunk_by(|a, b| a.1 == b.1) {
        if let [(id, token)] = *run {
            if fenced(
                conn,
                FINISH_DELIVERED_ONE,
                params![id, token, now.as_millis()],
            )? {
                kept.push(id);
            }
            continue;
        }
        let ids = id_list(run.iter().map(|&(id, _)| id));
        let mut done = stmt.query(params![ids, run[0].1, now.as_millis()])?;
        while let Some(r) = done.next()? {
            kept.push(r.get(0)?);
        }
    }
    Ok(kept)
}

/// Finishes a delivered row as of ?3.
macro_rules! finish_delivered_sql {
    () => {
        "UPDATE event_outbox
            SET status = coalesce(status_before_replay, 'delivered'), finished_at = ?3,
                claim_token = NULL, lease_until = NULL,
                replay_consumers = NULL, status_before_replay = NULL"
    };
}

/// [`finish_delivered_sql!`] on the rows of the id list ?1 that still
/// carry the token ?2 and are pending (the fence); returns the ids of the
/// rows it finished.
pub(super) const FINISH_DELIVERED: &str = concat!(
    finish_delivered_sql!(),
    " WHERE id IN rarray(?1) AND claim_token = ?2 AND status = 'pending' RETURNING id"
);

/// [`FINISH_DELIVERED`] for the one row ?1, which is finished when one row
/// changes. For one row the list's temporary b-trees and RETURNING cost
/// several times as much (BENCHMARKS.md; [`STAMP_ONE`] says why it
/// matters).
const FINISH_DELIVERED_ONE: &str = concat!(
    finish_delivered_sql!(),
    " WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'"
);

/// Schedules another attempt, due at `at`, lease released; `spend_attempt`
/// counts one more failed attempt (not for an unavailable destination).
/// False if the claim was lost.
pub(crate) fn schedule_retry(
    conn: &Connection,
    row_id: i64,
    token: &str,
    at: Timestamp,
    reason: &str,
    spend_attempt: bool,
) -> rusqlite::Result<bool> {
    fenced(
        conn,
        "UPDATE event_outbox
            SET attempts = attempts + ?5, available_at = ?3, last_error = ?4,
                claim_token = NULL, lease_until = NULL
          WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'",
        params![
            row_id,
            token,
            at.as_millis(),
            reason,
            i64::from(spend_attempt)
        ],
    )
}

/// Makes the rows of `ids` due at `at` that are pending, not leased and
/// due later: those a paused consumer held, once it resumes (or the one
/// that is to be its next probe).
pub(crate) fn release_held(
    conn: &Connection,
    ids: &[i64],
    at: Timestamp,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "UPDATE event_outbox SET available_at = ?2
          WHERE id IN rarray(?1) AND status = 'pending' AND claim_token IS NULL
            AND available_at > ?2",
    )?
    .execute(params![id_list(ids.iter().copied()), at.as_millis()])
}

/// Dead-letters a row with its reason; `spend_attempt` counts the attempt
/// (a retry that ran out) or not (poison, invalid row). False if the claim
/// was lost.
pub(crate) fn dead_letter(
    conn: &Connection,
    row_id: i64,
    token: &str,
    reason: &str,
    now: Timestamp,
    spend_attempt: bool,
) -> rusqlite::Result<bool> {
    fenced(
        conn,
        "UPDATE event_outbox
            SET status = 'dead', finished_at = ?3, last_error = ?4,
                attempts = attempts + ?5, claim_token = NULL, lease_until = NULL,
                replay_consumers = NULL, status_before_replay = NULL
          WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'",
        params![
            row_id,
            token,
            now.as_millis(),
            reason,
            i64::from(spend_attempt)
        ],
    )
}

/// Extends a lease (heartbeat). False if the claim was lost.
pub(crate) fn extend(
    conn: &Connection,
    row_id: i64,
    token: &str,
    lease_until: Timestamp,
) -> rusqlite::Result<bool> {
    fenced(
        conn,
        "UPDATE event_outbox SET lease_until = ?3, available_at = ?3
          WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'",
        params![row_id, token, lease_until.as_millis()],
    )
}

/// Gives a claimed row back, due now, attempts unchanged. False if the claim
/// was lost.
pub(crate) fn release(
    conn: &Connection,
    row_id: i64,
    token: &str,
    now: Timestamp,
) -> rusqlite::Result<bool> {
    fenced(
        conn,
        "UPDATE event_outbox SET claim_token = NULL, lease_until = NULL, available_at = ?3
          WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'",
        params![row_id, token, now.as_millis()],
    )
}

/// Takes over every lease of member `owner` (ended or stopped): its rows
/// are due now (or when they were due, if earlier), unclaimed, attempts
/// unchanged; its late writes are fenced out by the token. Walks the
/// pending rows, once for each owner that ends while leasing. Returns the
/// rows released.
pub(crate) fn release_owner(
    conn: &Connection,
    owner: &str,
    now: Timestamp,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "UPDATE event_outbox INDEXED BY event_outbox_due
            SET claim_token = NULL, lease_until = NULL, available_at = min(available_at, ?2)
          WHERE status = 'pending' AND claim_token IS NOT NULL
            AND substr(claim_token, 1, 27) = ?1 || ':'",
    )?
    .execute(params![owner, now.as_millis()])
}

/// The next time after `now` that a pending row becomes due (a delayed
/// event, a retry, or a lease running out). Rows due now but not claimed
/// wait for an ordering-key predecessor, whose outcome wakes the writer.
/// (The schema's CHECK keeps available_at an integer.)
pub(crate) fn next_due_after(
    conn: &Connection,
    now: Timestamp,
) -> rusqlite::Result<Option<Timestamp>> {
    conn.prepare_cached(
        "SELECT min(available_at) FROM event_outbox WHERE status = 'pending' AND available_at > ?1",
    )?
    .query_row([now.as_millis()], |r| r.get::<_, Option<i64>>(0))
    .map(|v| v.map(Timestamp::from_millis))
}

/// True while the row is pending and still carries `token`: the claim
/// holds. A transactional consumer checks it inside its own transaction
/// ([`super::transactional`]), which then commits only under the claim.
pub(crate) fn holds(conn: &Connection, row_id: i64, token: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM event_outbox
                         WHERE id = ?1 AND claim_token = ?2 AND status = 'pending')",
    )?
    .query_row(params![row_id, token], |r| r.get(0))
}

/// The due rows, among the oldest `window`, whose payload is larger than
/// `max_payload`: (row id, payload bytes). The claim passes them over, so
/// they gather at the head of the due order. Sizes are read from the
/// record headers, never the payloads.
pub(crate) fn oversized(
    conn: &Connection,
    now: Timestamp,
    max_payload: u64,
    window: usize,
) -> rusqlite::Result<Vec<(i64, u64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, size FROM (
             SELECT id, octet_length(payload) AS size FROM event_outbox
              WHERE status = 'pending' AND available_at <= ?1
              ORDER BY available_at, id LIMIT ?3)
          WHERE size > ?2",
    )?;
    let rows = stmt.query_map(
        params![
            now.as_millis(),
            i64::try_from(max_payload).unwrap_or(i64::MAX),
            window as i64
        ],
        |r| Ok((r.get(0)?, lenient_count(r.get_ref(1)?))),
    )?;
    rows.collect()
}

/// Dead-letters a due row whose payload is over the maximum, unclaimed,
/// with the reason; the payload is never read into outboxd's memory.
/// (SQLite itself rewrites the whole row to change its status, for which it
/// needs a few times the payload's size in memory: without it this fails
/// with SQLITE_NOMEM, and the row stays pending, passed over by every
/// claim.) False if the row was claimed or finished meanwhile.
pub(crate) fn dead_letter_oversized(
    conn: &Connection,
    row_id: i64,
    now: Timestamp,
    reason: &str,
) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached(
            "UPDATE event_outbox
                SET status = 'dead', finished_at = ?2, last_error = ?3,
                    claim_token = NULL, lease_until = NULL,
                    replay_consumers = NULL, status_before_replay = NULL
              WHERE id = ?1 AND status = 'pending' AND available_at <= ?2",
        )?
        .execute(params![row_id, now.as_millis(), reason])?
        == 1)
}

fn fenced(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<bool> {
    Ok(conn.prepare_cached(sql)?.execute(params)? == 1)
}

/// A count column (attempts, a size). A foreign producer may have written
/// anything in `attempts`; failing the read would fail the whole claim and
/// stop every delivery, so a value that is not a number counts as 0.
pub(super) fn lenient_count(v: ValueRef<'_>) -> u64 {
    let n = match v {
        ValueRef::Integer(i) => i,
        ValueRef::Real(f) if f.is_finite() => f as i64,
        ValueRef::Text(t) => std::str::from_utf8(t)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    n.max(0) as u64
}
