//! The relay's claim: due rows taken under a lease, read for the workers.
//! The fenced writes that end, extend or release a claim are in
//! [`fenced`](super::fenced). All functions run on the writer thread's
//! connection, inside its transaction.

use std::rc::Rc;

use rusqlite::config::DbConfig;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{params, Connection};

use crate::clock::Timestamp;
use crate::connection::id_list;
use crate::envelope::{row_columns, trace_columns, OwnedRow, RawRow};

use super::fenced::lenient_count;

/// One claimed row, not checked yet: [`check_row`](crate::envelope::check_row)
/// runs on the worker that delivers it (or on the writer, for a row it
/// finishes without a delivery).
#[derive(Debug)]
pub(crate) struct ClaimedRow {
    pub row_id: i64,
    /// The dedup ledger key ([`dedup`](crate::dedup)), as the claim computed it.
    pub event_key: String,
    pub legacy: bool,
    /// The columns the envelope is made of.
    pub raw: OwnedRow,
    pub ordering_key: Option<String>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// The consumers that already succeeded for this event (the ledger).
    pub delivered_to: Vec<String>,
    /// The consumers a replay asked for (None: every routed consumer).
    pub replay_consumers: Option<Vec<String>>,
    /// The payload's size in bytes, as stored.
    pub payload_bytes: u64,
}

/// How many payload bytes one claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Payload bytes the claimed rows may carry in all...
    pub bytes: u64,
    /// ...except that the first row is taken whatever its size.
    pub one_anyway: bool,
    /// A row whose payload is larger is not claimed at all: not even the
    /// claim's UPDATE may touch it, since SQLite rewrites a row whole (see
    /// [`dead_letter_oversized`]).
    pub max_payload: u64,
}

/// Sets up the writer's connection for the statements here: SQLite's
/// query-planner stability guarantee (QPSG). Without it SQLite reads a
/// bound LIMIT while planning and marks the statement to be prepared again
/// whenever the value is bound anew, so the claim (and every other
/// statement with `LIMIT ?`) was compiled afresh on each execution, most of
/// an event's pick-up time (BENCHMARKS.md). With it the plan is the one for an unknown limit, which for these
/// statements is the same index walk.
pub(crate) fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
}

/// Claims up to `limit` due rows: pending, `available_at <= now`, not held
/// back by an earlier pending row with the same ordering key, nor by another
/// pending row with the same event id that is earlier or leased. The claim
/// stamps the token and moves `available_at` to the end of the lease, so a
/// leased row is simply not due; it also reads each row's ledger key and
/// the consumers that already have its event, rather than one more
/// statement per row. Rows come back in id order.
///
/// The event-id rule keeps two rows of one event (a foreign producer that
/// wrote it twice) out of delivery at the same time, in one batch or in
/// two relays' batches: the second is claimed only once the first is
/// finished, and then finds the first's consumers in the ledger. Ids are
/// matched in any letter case (ASCII letters, which the ledger key's
/// `upper()` folds too), with one probe of `event_outbox_event_id`, which
/// compares under NOCASE since schema version 6.
///
/// The rows taken are the longest prefix, in due order, whose payloads fit
/// in the [`Budget`]; rows over its maximum are passed over. Sizes come
/// from `octet_length(payload)`, which SQLite answers from the record header
/// without reading the payload, so a row too large to load is measured
/// without being loaded, and no payload past the budget is read.
///
/// Three statements in the caller's transaction: [`CLAIMABLE`] lists the
/// claimable rows with their sizes, the prefix that fits is chosen here,
/// [`STAMP`] stamps those rows and [`READ_CLAIMED`] reads them, both by row
/// id. One `UPDATE … RETURNING` over a sub-select did the same at a
/// higher cost per event, more so the larger the payloads (BENCHMARKS.md):
/// SQLite buffers every returned row, payload included, before it hands
/// out the first, and the budget needed the rows gathered once more to add
/// their sizes up.
///
/// A claim that finds nothing stops after the first statement, which then
/// reads one entry of the due index: most of an idle relay's claims are
/// such, since the writer claims after every finish (a finished row may
/// release the next of its ordering key). A look-up ahead of the claim
/// would save little there and cost more on every claim that finds rows
/// (BENCHMARKS.md), so there is none.
///
/// A row whose lease ran out is taken only when its owner's lease does not
/// stand ([`Standing`]): rows of the members it lists are passed over in
/// the SQL, and a token of any other member is judged as it is met.
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim(
    conn: &Connection,
    token: &str,
    now: Timestamp,
    lease_until: Timestamp,
    limit: usize,
    budget: Budget,
    standing: &mut dyn Standing,
) -> rusqlite::Result<Vec<ClaimedRow>> {
    let now = now.as_millis();
    // A member judged live as it was met is in the list the second time.
    let mut ids = fitting_prefix(conn, now, limit, budget, standing)?;
    if ids.1 {
        ids = fitting_prefix(conn, now, limit, budget, standing)?;
    }
    let ids = ids.0;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = id_list(ids.iter().copied());
    // Stamped before they are read: SQLite rewrites a row whole, so the
    // stamp needs twice a payload's size for a moment, which is then free
    // again for the copies the read makes.
    let lease_until = lease_until.as_millis();
    let stamped = match ids[..] {
        [id] => conn
            .prepare_cached(STAMP_ONE)?
            .execute(params![token, lease_until, id])?,
        _ => conn
            .prepare_cached(STAMP)?
            .execute(params![token, lease_until, list])?,
    };
    let mut claimed = Vec::with_capacity(limit);
    let mut stmt = conn.prepare_cached(READ_CLAIMED)?;
    let mut rows = stmt.query([&list])?;
    while let Some(r) = rows.next()? {
        claimed.push(read_claimed(r)?);
    }
    drop(rows);
    // The same ids in the same transaction: every row stamped is read.
    debug_assert_eq!(stamped, claimed.len());
    claimed.sort_by_key(|c| c.row_id);
    Ok(claimed)
}

/// Whose leases stand whatever their end time (the relay's liveness view,
/// [`crate::liveness`]).
pub(crate) trait Standing {
    /// The members whose leases stand, by name.
    fn live(&self) -> Vec<String>;
    /// Whether a row whose lease ran out, leased under `token` by a member
    /// not in [`live`](Self::live), may be taken.
    fn may_take(&mut self, token: &str) -> bool;
}

/// No lease stands past its end: the time rule alone.
pub(crate) struct TimeRule;

impl Standing for TimeRule {
    fn live(&self) -> Vec<String> {
        Vec::new()
    }
    fn may_take(&mut self, _: &str) -> bool {
        true
    }
}

/// The ids of the claimable rows the claim takes: the longest prefix
/// of [`CLAIMABLE`]'s rows whose sizes add up to at most the budget, or the
/// first row whatever its size when none fits and the budget says
/// `one_anyway`. Only ids and sizes are read here, never a payload. Also
/// true when a row was passed over for a member met live here.
fn fitting_prefix(
    conn: &Connection,
    now: i64,
    limit: usize,
    budget: Budget,
    standing: &mut dyn Standing,
) -> rusqlite::Result<(Vec<i64>, bool)> {
    let max_payload = i64::try_from(budget.max_payload).unwrap_or(i64::MAX);
    let mut ids = Vec::with_capacity(limit.min(1024));
    let mut running = 0u64;
    let mut passed_over = false;
    let live: Rc<Vec<Value>> = Rc::new(standing.live().into_iter().map(Value::Text).collect());
    let mut stmt = conn.prepare_cached(CLAIMABLE)?;
    let mut rows = stmt.query(params![now, limit as i64, max_payload, live])?;
    while let Some(r) = rows.next()? {
        if let ValueRef::Text(t) = r.get_ref(2)? {
            if !standing.may_take(&String::from_utf8_lossy(t)) {
                passed_over = true;
                continue;
            }
        }
        running = running.saturating_add(lenient_count(r.get_ref(1)?));
        if running > budget.bytes && !(ids.is_empty() && budget.one_anyway) {
            break;
        }
        ids.push(r.get(0)?);
    }
    Ok((ids, passed_over))
}

/// The claimable rows in due order, up to the limit, with their payload
/// sizes and claim tokens: ?1 now, ?2 the limit, ?3 the payload maximum,
/// ?4 the members whose leases stand (their names, a token's first 26
/// characters). A row is held back by an earlier pending row with its
/// ordering key, and by another pending row with its event id (in any
/// letter case) that is earlier or leased.
const CLAIMABLE: &str = "SELECT o.id, octet_length(o.payload), o.claim_token
      FROM event_outbox o
     WHERE o.status = 'pending' AND o.available_at <= ?1
       AND octet_length(o.payload) <= ?3
       AND (o.claim_token IS NULL OR substr(o.claim_token, 1, 26) NOT IN rarray(?4))
       AND (o.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM event_outbox p
             WHERE p.ordering_key = o.ordering_key
               AND p.status = 'pending' AND p.id < o.id))
       AND (o.event_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM event_outbox p
             WHERE p.event_id = o.event_id COLLATE NOCASE
               AND p.event_id IS NOT NULL AND p.id <> o.id
               AND p.status = 'pending'
               AND (p.id < o.id OR p.claim_token IS NOT NULL)))
     ORDER BY o.available_at, o.id
     LIMIT ?2";

/// The columns of the rows of the id list ?1 ([`IdList`]), as
/// [`read_claimed`] reads them, in the list's order. A join driven by the
/// list (`CROSS JOIN` keeps it the outer loop) seeks each row by id; the
/// `id IN rarray(?1)` form first copies the ids into a temporary index,
/// which costs more per row (BENCHMARKS.md). The list's ids are distinct,
/// so the join returns each row once.
///
/// [`IdList`]: crate::connection::IdList
const READ_CLAIMED: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", ordering_key, attempts, ",
    crate::dedup::delivered_to_sql!(),
    ", replay_consumers, octet_length(payload), ",
    trace_columns!(),
    " FROM rarray(?1) AS c CROSS JOIN event_outbox ON id = c.value"
);

/// Stamps the claim: ?1 the token, ?2 the lease's end, which is also when
/// the row is next due.
macro_rules! stamp_sql {
    () => {
        "UPDATE event_outbox SET claim_token = ?1, lease_until = ?2, available_at = ?2"
    };
}

/// [`stamp_sql!`] on the rows of the id list ?3. (`UPDATE … FROM
/// rarray(?3)` costs more: an UPDATE collects the rows it changes first
/// whatever the form.)
const STAMP: &str = concat!(stamp_sql!(), " WHERE id IN rarray(?3)");

/// [`stamp_sql!`] on the one row ?3. An UPDATE over `IN rarray(?)` builds
/// two temporary b-trees (the list's values and the rows it changes)
/// whatever the list's length, which for one row costs several times what
/// `id = ?` does, and one row is every claim of a relay that keeps up with
/// its producers (BENCHMARKS.md).
const STAMP_ONE: &str = concat!(stamp_sql!(), " WHERE id = ?3");

fn read_claimed(r: &rusqlite::Row<'_>) -> rusqlite::Result<ClaimedRow> {
    let raw = RawRow::read(r, 0)?.with_trace(r, 15)?;
    Ok(ClaimedRow {
        row_id: raw.row_id,
        event_key: event_key(raw.event_id, raw.row_id),
        legacy: matches!(raw.event_id, ValueRef::Null),
        raw: OwnedRow::new(&raw)?,
        ordering_key: lenient_text(r.get_ref(10)?),
        attempts: u32::try_from(lenient_count(r.get_ref(11)?)).unwrap_or(u32::MAX),
        delivered_to: crate::dedup::read_delivered_to(r.get_ref(12)?),
        replay_consumers: crate::dedup::read_names(r.get_ref(13)?),
        payload_bytes: lenient_count(r.get_ref(14)?),
    })
}

/// The row's ledger key, made by [`dedup::key`](crate::dedup::key) from the
/// event id already read rather than by SQLite a second time: the same text
/// as `event_key_sql!`, under which `delivered_to_sql!` finds the entries
/// (`upper()` folds ASCII letters only, as `to_ascii_uppercase` does). An
/// event id that is not text fails the row check, so its row is
/// dead-lettered and never writes a ledger entry under this key.
fn event_key(event_id: ValueRef<'_>, row_id: i64) -> String {
    match event_id {
        ValueRef::Text(t) => crate::dedup::key(Some(&String::from_utf8_lossy(t)), row_id),
        // NULL: a legacy row's `#<row id>`.
        other => crate::dedup::key(lenient_text(other).as_deref(), row_id),
    }
}

/// Routing columns are informational: text as is, numbers as their text.
/// (The tenant is not one of them: [`check_row`](crate::envelope::check_row)
/// refuses a tenant that is not UTF-8, since a consumer would see another.)
fn lenient_text(v: ValueRef<'_>) -> Option<String> {
    match v {
        ValueRef::Null => None,
        ValueRef::Integer(i) => Some(i.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fenced::*;
    use super::*;
    use crate::{Enqueuer, Event};

    /// No byte budget to speak of: the claims of tests about other rules.
    const ANY: Budget = Budget {
        bytes: u64::MAX,
        one_anyway: true,
        max_payload: u64::MAX,
    };

    fn claim(
        conn: &Connection,
        token: &str,
        now: Timestamp,
        lease_until: Timestamp,
        limit: usize,
    ) -> rusqlite::Result<Vec<ClaimedRow>> {
        super::claim(conn, token, now, lease_until, limit, ANY, &mut TimeRule)
    }

    /// Claims up to 10 rows under `token`, a second from now (so every row
    /// enqueued so far is due), with a 30 s lease.
    fn claim_due(conn: &Connection, token: &str) -> Vec<ClaimedRow> {
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        claim(
            conn,
            token,
            now,
            now.plus(std::time::Duration::from_secs(30)),
            10,
        )
        .unwrap()
    }

    fn put(conn: &Connection, ty: &str, key: Option<&str>) {
        let mut e = Event::new(ty, &1).unwrap();
        if let Some(k) = key {
            e = e.ordering_key(k);
        }
        Enqueuer::new()
            .allow_autocommit(true)
            .enqueue(conn, &e)
            .unwrap();
    }

    #[test]
    fn a_lost_lease_fences_out_the_old_owner() {
        let (_d, conn) = crate::schema::test_db();
        put(&conn, "a.b.v1", None);
        let t0 = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let first = claim(
            &conn,
            "T1",
            t0,
            t0.plus(std::time::Duration::from_secs(30)),
            10,
        )
        .unwrap();
        assert_eq!(first.len(), 1);
        // While the lease lives, nobody else gets the row.
        assert!(claim(&conn, "T2", t0, t0, 10).unwrap().is_empty());
        // After it expires another relay takes it with a new token...
        let later = t0.plus(std::time::Duration::from_secs(31));
        let second = claim(
            &conn,
            "T2",
            later,
            later.plus(std::time::Duration::from_secs(30)),
            10,
        )
        .unwrap();
        assert_eq!(second.len(), 1);
        // ...and every write under the old token does nothing.
        let id = first[0].row_id;
        assert!(!finish_delivered(&conn, id, "T1", later).unwrap());
        assert!(!schedule_retry(&conn, id, "T1", later, "x", true).unwrap());
        assert!(!dead_letter(&conn, id, "T1", "x", later, false).unwrap());
        assert!(!extend(&conn, id, "T1", later).unwrap());
        assert!(!release(&conn, id, "T1", later).unwrap());
        assert!(finish_delivered(&conn, id, "T2", later).unwrap());
    }

    /// The grouped finish keeps the fence of the one-row finish: a row
    /// whose token changed, or that is no longer pending, is left alone and
    /// not returned; the others are finished as `finish_delivered` would.
    #[test]
    fn finishing_many_at_once_keeps_each_rows_fence() {
        let (_d, conn) = crate::schema::test_db();
        for _ in 0..4 {
            put(&conn, "a.b.v1", None);
        }
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let until = now.plus(std::time::Duration::from_secs(30));
        assert_eq!(claim(&conn, "T", now, until, 2).unwrap().len(), 2);
        assert_eq!(claim(&conn, "U", now, until, 2).unwrap().len(), 2);
        // Row 2 was finished already; row 3 is claimed by U, not T.
        assert!(finish_delivered(&conn, 2, "T", now).unwrap());
        let mut kept =
            finish_delivered_many(&conn, &[(1, "T"), (2, "T"), (3, "T"), (4, "U")], now).unwrap();
        kept.sort();
        assert_eq!(kept, [1, 4]);
        let states: Vec<(String, Option<String>)> = conn
            .prepare("SELECT status, claim_token FROM event_outbox ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            states,
            [
                ("delivered".to_string(), None),
                ("delivered".to_string(), None),
                ("pending".to_string(), Some("U".to_string())),
                ("delivered".to_string(), None),
            ]
        );
        assert!(finish_delivered_many(&conn, &[], now).unwrap().is_empty());
    }

    /// Regression (found while writing fuzz/foreign_row): one foreign row with text in
    /// `attempts` made every claim fail, so no event was delivered at all.
    #[test]
    fn a_foreign_row_with_text_attempts_does_not_block_claims() {
        let (_d, conn) = crate::schema::test_db();
        conn.execute(
            "INSERT INTO event_outbox (event_id, event_type, attempts)
             VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a.b.v1', 'many')",
            [],
        )
        .unwrap();
        put(&conn, "a.b.v1", None);
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let got = claim(&conn, "T", now, now, 10).unwrap();
        assert_eq!(got.len(), 2, "both rows are claimed");
        assert_eq!(got[0].attempts, 0);
    }

    #[test]
    fn the_schema_refuses_a_time_that_is_not_an_integer() {
        let (_d, conn) = crate::schema::test_db();
        for value in ["1500000000000.5", "'tomorrow'"] {
            let e = conn
                .execute(
                    &format!("INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', {value})"),
                    [],
                )
                .unwrap_err();
            assert!(
                e.to_string().contains("event_outbox_times_are_integers"),
                "{e}"
            );
        }
    }

    /// Regression (issue 11.8): an available_at in microseconds was accepted
    /// and never delivered. The schema refuses it at INSERT, naming the
    /// trigger and the unit; milliseconds up to year 9999 go in, and a
    /// text time still meets the CHECK on types.
    #[test]
    fn the_schema_refuses_an_available_at_in_microseconds() {
        let (_d, conn) = crate::schema::test_db();
        let insert = |available_at: &str| {
            conn.execute(
                &format!(
                    "INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', {available_at})"
                ),
                [],
            )
        };
        let now_ms = Timestamp::now().as_millis();
        for wrong in [now_ms * 1000, now_ms * 1_000_000, 253_402_300_800_000] {
            let e = insert(&wrong.to_string()).unwrap_err();
            assert!(
                e.to_string().contains("event_outbox_times_in_milliseconds")
                    && e.to_string().contains("not microseconds"),
                "{wrong}: {e}"
            );
        }
        for fine in [now_ms, 0, 253_402_300_799_999] {
            insert(&fine.to_string()).unwrap();
        }
        for not_an_integer in ["'tomorrow'", "1764487080000000.5"] {
            let e = insert(not_an_integer).unwrap_err();
            assert!(
                e.to_string().contains("event_outbox_times_are_integers"),
                "{not_an_integer}: {e}"
            );
        }
    }

    /// Regression (found while writing fuzz/foreign_row): an occurred_at past year
    /// 9999 was delivered as 1970-01-01, silently; now the row is invalid
    /// (and so dead-lettered with the reason).
    #[test]
    fn a_time_outside_years_1_to_9999_makes_the_row_invalid() {
        let (_d, conn) = crate::schema::test_db();
        conn.execute_batch(&format!(
            "INSERT INTO event_outbox (event_id, event_type, occurred_at)
             VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a.b.v1', {});
             INSERT INTO event_outbox (event_id, event_type, occurred_at)
             VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5S', 'a.b.v1', 253402300799999);",
            i64::MAX
        ))
        .unwrap();
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let got = claim(&conn, "T", now, now, 10).unwrap();
        let check = |c: &ClaimedRow| crate::envelope::check_row(&c.raw.as_raw());
        let e = check(&got[0]).unwrap_err();
        assert!(e.to_string().contains("occurred_at"), "{e}");
        let env = check(&got[1]).unwrap().envelope;
        assert_eq!(env.occurred_at.to_string(), "9999-12-31T23:59:59.999Z");
    }

    /// Issue 11.4: a row is not claimed while another pending row with its
    /// event id is earlier or leased (a dead twin requeued while the later
    /// one is in flight waits too).
    #[test]
    fn a_row_waits_while_a_twin_is_earlier_or_leased() {
        let (_d, conn) = crate::schema::test_db();
        let id = crate::EventId::new().to_string();
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
             VALUES (1, ?1, 'a.b.v1', 'dead', 1)",
            [&id],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (2, lower(?1), 'a.b.v1'),
                    (3, ?1, 'a.b.v1')",
            [&id],
        )
        .unwrap();
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let later = now.plus(std::time::Duration::from_secs(30));
        let got = claim(&conn, "T", now, later, 10).unwrap();
        assert_eq!(got.iter().map(|c| c.row_id).collect::<Vec<_>>(), [2]);
        // Row 1 is requeued while row 2 is leased: neither 1 nor 3 goes.
        conn.execute_batch(
            "UPDATE event_outbox SET status = 'pending', finished_at = NULL WHERE id = 1",
        )
        .unwrap();
        assert!(claim(&conn, "U", now, later, 10).unwrap().is_empty());
        assert!(finish_delivered(&conn, 2, "T", now).unwrap());
        let got = claim(&conn, "U", now, later, 10).unwrap();
        assert_eq!(got.iter().map(|c| c.row_id).collect::<Vec<_>>(), [1]);
    }

    /// Schema version 6: the event-id rule matches an id in any letter
    /// case, mixed case too (before, only the forms as written, in upper
    /// and in lower case were probed, so a mixed-case twin went out beside
    /// its original although both share one ledger key).
    #[test]
    fn a_row_waits_for_a_twin_in_mixed_case() {
        let (_d, conn) = crate::schema::test_db();
        let (id, mixed) = ("01JDQ8F6ZC1Y0D3W9N7K2M4P5R", "01jDq8F6zc1Y0d3w9N7k2M4p5R");
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, ?1, 'a.b.v1'),
                    (2, ?2, 'a.b.v1'), (3, ?3, 'a.b.v1')",
            params![mixed, id, crate::EventId::new().to_string()],
        )
        .unwrap();
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let later = now.plus(std::time::Duration::from_secs(30));
        let ids = |rows: Vec<ClaimedRow>| rows.iter().map(|c| c.row_id).collect::<Vec<_>>();
        let first = claim(&conn, "T", now, later, 10).unwrap();
        assert_eq!(first[0].event_key, id, "the key is the canonical spelling");
        assert_eq!(ids(first), [1, 3]);
        // Row 1 is leased: its canonical twin still waits...
        assert!(claim(&conn, "U", now, later, 10).unwrap().is_empty());
        // ...until it is finished, and then shares its ledger key.
        assert!(finish_delivered(&conn, 1, "T", now).unwrap());
        let got = claim(&conn, "U", now, later, 10).unwrap();
        assert_eq!(got.iter().map(|c| c.row_id).collect::<Vec<_>>(), [2]);
        assert_eq!(got[0].event_key, id);
    }

    /// Inserts a due row whose payload (a JSON string) is `size` bytes.
    fn insert_sized(conn: &Connection, size: i64) {
        conn.execute(
            "INSERT INTO event_outbox (event_id, event_type, payload)
             VALUES (?1, 'a.b.v1', '\"' || substr(hex(zeroblob(?2)), 1, ?2 - 2) || '\"')",
            params![crate::EventId::new().to_string(), size],
        )
        .unwrap();
    }

    /// Issue 11.3: a claim takes the rows whose payloads fit in the byte
    /// budget (at least one when told to) and passes over the payloads above
    /// the maximum, which `oversized` finds and `dead_letter_oversized`
    /// ends.
    #[test]
    fn a_claim_keeps_to_its_byte_budget_and_leaves_large_payloads_unread() {
        let (_d, conn) = crate::schema::test_db();
        for size in [10, 10, 5000, 10, 10] {
            insert_sized(&conn, size);
        }
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let take = |bytes, one_anyway, max_payload| {
            let until = now.plus(std::time::Duration::from_secs(30));
            let budget = Budget {
                bytes,
                one_anyway,
                max_payload,
            };
            let got = super::claim(&conn, "T", now, until, 10, budget, &mut TimeRule).unwrap();
            conn.execute_batch(
                "UPDATE event_outbox SET claim_token = NULL, lease_until = NULL, available_at = 0",
            )
            .unwrap();
            got
        };
        let sizes = |rows: &[ClaimedRow]| rows.iter().map(|r| r.payload_bytes).collect::<Vec<_>>();
        assert_eq!(
            sizes(&take(25, false, 10_000)),
            [10, 10],
            "up to the large one"
        );
        assert_eq!(
            sizes(&take(5, false, 10_000)),
            Vec::<u64>::new(),
            "nothing fits"
        );
        assert_eq!(sizes(&take(5, true, 10_000)), [10], "one anyway");
        // Over the maximum: passed over, found, dead-lettered.
        let got = take(40, false, 1000);
        assert_eq!(sizes(&got), [10, 10, 10, 10]);
        assert!(got
            .iter()
            .all(|r| crate::envelope::check_row(&r.raw.as_raw()).is_ok()));
        assert_eq!(oversized(&conn, now, 1000, 10).unwrap(), [(3, 5000)]);
        assert!(
            oversized(&conn, now, 1000, 2).unwrap().is_empty(),
            "not among the oldest 2"
        );
        assert!(dead_letter_oversized(&conn, 3, now, "too large").unwrap());
        assert!(oversized(&conn, now, 1000, 10).unwrap().is_empty());
    }

    /// The claimable rows' look-up is a range search of the due index with
    /// index look-ups per row, never a table scan or a sort, however many
    /// rows the table holds; reading, stamping and finishing the rows taken
    /// go by row id, and the ledger by its key.
    #[test]
    fn the_claim_searches_indexes_only() {
        let (_d, conn) = crate::schema::test_db();
        stable_plans(&conn).unwrap();
        let no_scan = |plan: &[String]| {
            // A scan of an id list (at most `limit` ids) is fine; a scan
            // of a table is not.
            !plan.iter().any(|l| {
                (l.starts_with("SCAN") && !l.contains("VIRTUAL TABLE")) || l.contains("TEMP B-TREE")
            })
        };
        let plan = crate::connection::query_plan(
            &conn,
            CLAIMABLE,
            params![2, 10, 100, Rc::new(vec![Value::Text("A".into())])],
        );
        for needed in [
            "INDEX event_outbox_due",
            "INDEX event_outbox_ordering",
            "INDEX event_outbox_event_id",
        ] {
            assert!(
                plan.iter().any(|l| l.contains(needed)),
                "{needed}: {plan:?}"
            );
        }
        assert!(no_scan(&plan), "{plan:?}");
        for (sql, values) in [
            (READ_CLAIMED, params![id_list([1, 2])]),
            (STAMP, params!["T", 2, id_list([1, 2])]),
            (FINISH_DELIVERED, params![id_list([1, 2]), "T", 2]),
        ] {
            let plan = crate::connection::query_plan(&conn, sql, values);
            assert!(
                plan.iter()
                    .any(|l| l.contains("SEARCH event_outbox USING INTEGER PRIMARY KEY")),
                "{plan:?}"
            );
            assert!(no_scan(&plan), "{plan:?}");
        }
        let plan = crate::connection::query_plan(&conn, READ_CLAIMED, [id_list([1])]);
        assert!(
            plan.iter()
                .any(|l| l.contains("SEARCH d USING PRIMARY KEY")),
            "the ledger by its key: {plan:?}"
        );
    }

    /// The rows claimed are the longest prefix of the claimable rows whose
    /// sizes fit the budget (or the first, when told to take one anyway),
    /// as computed here on its own: for budgets at and around every
    /// prefix's total, with and without "one anyway", at several limits.
    /// The rows not taken stay unclaimed.
    #[test]
    fn a_claim_takes_the_prefix_that_fits() {
        let (_d, conn) = crate::schema::test_db();
        let sizes = [30_i64, 10, 50, 20, 10, 40];
        for size in sizes {
            insert_sized(&conn, size);
        }
        let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
        let until = now.plus(std::time::Duration::from_secs(30));
        // Every prefix's total, one byte under it and one over.
        let budgets: Vec<u64> = (0..=sizes.len())
            .map(|n| sizes[..n].iter().sum::<i64>() as u64)
            .flat_map(|t| [t.saturating_sub(1), t, t + 1])
            .collect();
        for limit in [1, 2, 4, 10] {
            for bytes in budgets.iter().copied() {
                for one_anyway in [false, true] {
                    let budget = Budget {
                        bytes,
                        one_anyway,
                        max_payload: 10_000,
                    };
                    let got: Vec<u64> =
                        super::claim(&conn, "T", now, until, limit, budget, &mut TimeRule)
                            .unwrap()
                            .iter()
                            .map(|r| r.payload_bytes)
                            .collect();
                    let stamped: i64 = conn
                        .query_row(
                            "SELECT count(*) FROM event_outbox WHERE claim_token = 'T'",
                            [],
                            |r| r.get(0),
                        )
                        .unwrap();
                    assert_eq!(
                        stamped as usize,
                        got.len(),
                        "only the rows taken are stamped"
                    );
                    conn.execute_batch(
                        "UPDATE event_outbox SET claim_token = NULL, lease_until = NULL, available_at = 0",
                    )
                    .unwrap();
                    let mut want = Vec::new();
                    let mut running = 0;
                    for &s in sizes.iter().take(limit) {
                        let s = s as u64;
                        running += s;
                        if running > bytes {
                            break;
                        }
                        want.push(s);
                    }
                    if want.is_empty() && one_anyway {
                        want.push(sizes[0] as u64);
                    }
                    assert_eq!(
                        got, want,
                        "limit {limit}, budget {bytes}, one anyway {one_anyway}"
                    );
                }
            }
        }
    }

    /// With [`stable_plans`] the cached claim runs as prepared whatever its
    /// limit; without it SQLite prepares it again each time the limit is
    /// bound (the cost this guards against).
    #[test]
    fn the_claim_is_not_prepared_again_for_each_limit() {
        let reprepares = |stable: bool| {
            let (_d, conn) = crate::schema::test_db();
            if stable {
                stable_plans(&conn).unwrap();
            }
            for _ in 0..3 {
                put(&conn, "a.b.v1", None);
            }
            let now = Timestamp::now().plus(std::time::Duration::from_secs(1));
            let until = now.plus(std::time::Duration::from_secs(30));
            for limit in [1, 2, 1] {
                claim(&conn, "T", now, until, limit).unwrap();
                conn.execute_batch(
                    "UPDATE event_outbox SET available_at = 0, claim_token = NULL, lease_until = NULL",
                )
                    .unwrap();
            }
            let stmt = conn.prepare_cached(CLAIMABLE).unwrap();
            stmt.get_status(rusqlite::StatementStatus::RePrepare)
        };
        assert!(reprepares(false) > 0, "the guard is needed");
        assert_eq!(reprepares(true), 0);
    }

    /// Row ids travel to the read and the stamp in an id list: the largest
    /// and the most negative ids a foreign producer can write come back
    /// exact, read and stamped.
    #[test]
    fn extreme_row_ids_are_read_and_stamped() {
        let (_d, conn) = crate::schema::test_db();
        for _ in 0..3 {
            put(&conn, "a.b.v1", None);
        }
        conn.execute_batch(&format!(
            "UPDATE event_outbox SET id = {} WHERE id = 1;
             UPDATE event_outbox SET id = {} WHERE id = 2;",
            i64::MIN,
            i64::MAX
        ))
        .unwrap();
        let ids: Vec<i64> = claim_due(&conn, "T").iter().map(|c| c.row_id).collect();
        assert_eq!(ids, [i64::MIN, 3, i64::MAX]);
        let stamped: Vec<i64> = conn
            .prepare("SELECT id FROM event_outbox WHERE claim_token = 'T' ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(stamped, ids);
    }

    #[test]
    fn ordering_keys_release_one_event_at_a_time() {
        let (_d, conn) = crate::schema::test_db();
        put(&conn, "a.b.v1", Some("k"));
        put(&conn, "a.b.v1", Some("k"));
        put(&conn, "a.b.v1", Some("other"));
        let ids: Vec<i64> = claim_due(&conn, "T").iter().map(|c| c.row_id).collect();
        assert_eq!(ids, [1, 3], "the second event of key k waits");
        assert!(finish_delivered(&conn, 1, "T", Timestamp::now()).unwrap());
        let ids: Vec<i64> = claim_due(&conn, "U").iter().map(|c| c.row_id).collect();
        assert_eq!(ids, [2]);
    }
}
