//! The dedup ledger, `delivered_events`: one entry per (event, consumer)
//! that succeeded. It is two things at once:
//!
//! - the **progress** of a row: a retry runs only the consumers without an
//!   entry, so a consumer that succeeded is never run again for that row;
//! - the **dedup window**: a second row carrying an event id a consumer
//!   already received is not delivered to that consumer again.
//!
//! Every read and write of the table is here: the key, the claim's look-up,
//! the relay's record of a success (made by the writer, or for a
//! transactional consumer inside that consumer's own transaction), the
//! purge, the counts `status` shows, replay's selection and forgetting, and
//! the look-ups the console's pages make (a row's progress).
//!
//! ## The key
//!
//! An entry's key is the row's event id in its canonical (upper-case) ULID
//! spelling, or `#<row id>` for a legacy row without an event id (a ULID
//! never contains `#`, so the two never collide). SQL computes it as the
//! `event_key_sql!` expression, which every look-up of entries uses and the
//! relay's grouped record of successes ([`record_many`]) writes; Rust as
//! [`key`], from an event id already read: the relay's claim makes the key
//! of each row it reads that way (one `upper()` less per row) for a
//! transactional consumer, which looks up and writes its own entry inside
//! its own transaction. The two agree on any text, since SQLite's `upper()`
//! folds ASCII letters only, as `to_ascii_uppercase` does (a test holds
//! them to it); a valid ULID differs from its canonical spelling only in
//! letter case.

use std::collections::BTreeMap;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection};

use crate::clock::Timestamp;
use crate::connection::id_list;

/// The ledger key of the `event_outbox` row in scope, as an SQL expression.
macro_rules! event_key_sql {
    () => {
        "coalesce(upper(event_outbox.event_id), '#' || event_outbox.id)"
    };
}
pub(crate) use event_key_sql;

/// The consumers that already have the event of the `event_outbox` row in
/// scope, as an SQL expression: their names joined by `,` (a character no
/// consumer name may contain), or NULL. Read it with [`read_delivered_to`].
macro_rules! delivered_to_sql {
    () => {
        concat!(
            "(SELECT group_concat(d.consumer, ',') FROM delivered_events d WHERE d.event_key = ",
            $crate::dedup::event_key_sql!(),
            ")"
        )
    };
}
pub(crate) use delivered_to_sql;

/// Reads a [`delivered_to_sql!`] column.
pub(crate) fn read_delivered_to(v: ValueRef<'_>) -> Vec<String> {
    read_names(v).unwrap_or_default()
}

/// Reads consumer names joined by `,` (a [`delivered_to_sql!`] column, or a
/// replay's `replay_consumers`); None for NULL.
pub(crate) fn read_names(v: ValueRef<'_>) -> Option<Vec<String>> {
    match v {
        ValueRef::Text(names) => Some(
            String::from_utf8_lossy(names)
                .split(',')
                .map(str::to_string)
                .collect(),
        ),
        _ => None,
    }
}

/// The routed consumers (by index) that have no entry yet: the ones a
/// delivery of the row must still run. `name` gives a consumer's name.
pub(crate) fn missing<'a>(
    routed: &[usize],
    delivered_to: &[String],
    name: impl Fn(usize) -> &'a str,
) -> Vec<usize> {
    routed
        .iter()
        .copied()
        .filter(|&i| !delivered_to.iter().any(|d| d == name(i)))
        .collect()
}

/// Records that a consumer succeeded for an event (idempotent).
pub(crate) fn record(
    conn: &Connection,
    event_key: &str,
    consumer: &str,
    row_id: i64,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.prepare_cached(RECORD)?
        .execute(params![event_key, consumer, row_id, now.as_millis()])?;
    Ok(())
}

const RECORD: &str =
    "INSERT OR IGNORE INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
     VALUES (?1, ?2, ?3, ?4)";

/// Records many successes, each as [`record`] does: (consumer, row id) of
/// rows still in the table, each entry under its row's key as
/// [`event_key_sql!`] makes it. One [`RECORD_ROWS`] per consumer, since
/// one statement over a list costs much less than one execution per entry
/// (BENCHMARKS.md).
pub(crate) fn record_many(
    conn: &Connection,
    entries: &[(&str, i64)],
    now: Timestamp,
) -> rusqlite::Result<()> {
    let mut by_consumer: Vec<(&str, Vec<i64>)> = Vec::new();
    for &(consumer, row_id) in entries {
        match by_consumer.iter_mut().find(|(c, _)| *c == consumer) {
            Some((_, ids)) => ids.push(row_id),
            None => by_consumer.push((consumer, vec![row_id])),
        }
    }
    if by_consumer.is_empty() {
        return Ok(());
    }
    let mut stmt = conn.prepare_cached(RECORD_ROWS)?;
    for (consumer, ids) in by_consumer {
        stmt.execute(params![id_list(ids), consumer, now.as_millis()])?;
    }
    Ok(())
}

/// One entry for consumer ?2 as of ?3 for each row of the id list ?1
/// ([`IdList`](crate::connection::IdList)).
const RECORD_ROWS: &str = concat!(
    "INSERT OR IGNORE INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
     SELECT ",
    event_key_sql!(),
    ", ?2, event_outbox.id, ?3
       FROM rarray(?1) AS c CROSS JOIN event_outbox ON event_outbox.id = c.value"
);

/// True when the ledger has an entry for the event and consumer (a
/// transactional consumer checks it inside its own transaction).
pub(crate) fn is_recorded(
    conn: &Connection,
    event_key: &str,
    consumer: &str,
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM delivered_events WHERE event_key = ?1 AND consumer = ?2)",
    )?
    .query_row(params![event_key, consumer], |r| r.get(0))
}

/// Removes one consumer's entry for an event, so the next delivery of the
/// row runs that consumer again (replay). Returns how many were removed.
pub(crate) fn forget(
    conn: &Connection,
    event_key: &str,
    consumer: &str,
) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM delivered_events WHERE event_key = ?1 AND consumer = ?2")?
        .execute(params![event_key, consumer])
}

/// The condition on a `delivered_events d` entry that may be purged by age:
/// no row carrying its event stays, where a row for which the SQL condition
/// `going` holds (on `o`) is about to be purged itself.
///
/// While a row exists the entry is its progress, whatever the row's status:
/// a pending row may retry, a dead one may be requeued, and a delivered one
/// may be replayed for another consumer; deleting the entry would run a
/// consumer that already succeeded again. So an entry is never purged ahead
/// of its row (nor of a second row with the same event id), however old it
/// is. The key is the canonical upper-case id; a row may spell it in any
/// letter case, and one probe of the event-id index (NOCASE since schema
/// version 6) finds every spelling.
fn no_row_stays(going: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM event_outbox o WHERE o.id = d.outbox_id AND NOT ({going}))
         AND NOT EXISTS (SELECT 1 FROM event_outbox o
              WHERE o.event_id = d.event_key COLLATE NOCASE AND o.event_id IS NOT NULL
                AND NOT ({going}))"
    )
}

/// [`purge_batch`]'s statement: ?1 the cutoff, ?2 the limit.
fn purge_batch_sql() -> String {
    format!(
        "DELETE FROM delivered_events WHERE (event_key, consumer) IN (
             SELECT event_key, consumer FROM delivered_events d
              WHERE delivered_at < ?1 AND {} LIMIT ?2)",
        no_row_stays("0")
    )
}

/// Deletes up to `limit` entries recorded before `cutoff` whose rows are
/// gone.
pub(crate) fn purge_batch(
    conn: &Connection,
    cutoff: Timestamp,
    limit: usize,
) -> rusqlite::Result<u64> {
    conn.prepare_cached(&purge_batch_sql())?
        .execute(params![
            cutoff.as_millis(),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ])
        .map(|n| n as u64)
}

/// How many entries [`purge_batch`] would delete in all, once the purge has
/// deleted the delivered rows finished before `delivered_before` and the
/// dead ones finished before `dead_before` (None: no dead row goes).
pub(crate) fn count_purgeable(
    conn: &Connection,
    cutoff: Timestamp,
    delivered_before: Timestamp,
    dead_before: Option<Timestamp>,
) -> rusqlite::Result<u64> {
    let going = "o.status <> 'pending' AND (o.status = 'delivered' AND o.finished_at < ?2
                  OR o.status = 'dead' AND ?3 IS NOT NULL AND o.finished_at < ?3)";
    conn.query_row(
        &format!(
            "SELECT count(*) FROM delivered_events d WHERE delivered_at < ?1 AND {}",
            no_row_stays(going)
        ),
        params![
            cutoff.as_millis(),
            delivered_before.as_millis(),
            dead_before.map(Timestamp::as_millis)
        ],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

/// Entries per consumer name, in name order.
pub(crate) fn count_by_consumer(conn: &Connection) -> rusqlite::Result<BTreeMap<String, u64>> {
    let mut stmt =
        conn.prepare_cached("SELECT consumer, count(*) FROM delivered_events GROUP BY consumer")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
    })?;
    rows.collect()
}

/// True when the ledger holds at least one entry of the consumer.
pub(crate) fn knows(conn: &Connection, consumer: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM delivered_events WHERE consumer = ?1)")?
        .query_row([consumer], |r| r.get(0))
}

/// Every consumer name in the ledger, sorted (a whole scan: for messages).
pub(crate) fn consumer_names(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT DISTINCT consumer FROM delivered_events ORDER BY 1")?;
    let names = stmt.query_map([], |r| r.get(0))?;
    names.collect()
}

// ---------------------------------------------------------------------------
// Reads for operators: what a replay selects, and a row's progress as the
// console shows it.

/// Which of a consumer's entries a replay selects: those whose rows still
/// exist and pass every filter given (they combine with AND).
pub(crate) struct Selection<'a> {
    /// The consumer whose entries are selected.
    pub consumer: &'a str,
    /// Only these keys (canonical event ids); empty: any.
    pub keys: &'a [String],
    /// Only rows whose event type, as text, matches this GLOB. The text of
    /// a [`Pattern`](crate::router::Pattern) is a GLOB with its meaning.
    pub type_glob: Option<&'a str>,
    /// Only rows that occurred at or after this time.
    pub since: Option<Timestamp>,
    /// Only rows that occurred before this time.
    pub until: Option<Timestamp>,
}

/// The entries a [`Selection`] takes, `d` joined with their rows `o`; its
/// parameters are [`Selection::params`].
const SELECTED: &str = "FROM delivered_events d JOIN event_outbox o ON o.id = d.outbox_id
     WHERE d.consumer = ?1
       AND (?2 IS NULL OR o.occurred_at >= ?2)
       AND (?3 IS NULL OR o.occurred_at < ?3)
       AND (?4 IS NULL OR CAST(o.event_type AS TEXT) GLOB ?4)
       AND (?5 IS NULL OR d.event_key IN (SELECT value FROM json_each(?5)))";

impl Selection<'_> {
    fn params(&self) -> rusqlite::Result<[rusqlite::types::Value; 5]> {
        use rusqlite::types::Value;
        let keys = if self.keys.is_empty() {
            Value::Null
        } else {
            // A JSON array, read back by json_each: one parameter for any
            // number of keys.
            Value::Text(
                serde_json::to_string(self.keys)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
            )
        };
        let time = |t: Option<Timestamp>| t.map_or(Value::Null, |t| Value::Integer(t.as_millis()));
        Ok([
            Value::Text(self.consumer.to_string()),
            time(self.since),
            time(self.until),
            self.type_glob
                .map_or(Value::Null, |g| Value::Text(g.to_string())),
            keys,
        ])
    }
}

/// How many entries the selection takes (a count in SQL: nothing is
/// loaded).
pub(crate) fn count_selected(conn: &Connection, s: &Selection<'_>) -> rusqlite::Result<u64> {
    conn.prepare_cached(&format!("SELECT count(*) {SELECTED}"))?
        .query_row(s.params()?, |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
}

/// (row id, key) of each entry the selection takes, in row order.
pub(crate) fn selected(
    conn: &Connection,
    s: &Selection<'_>,
) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT o.id, d.event_key {SELECTED} ORDER BY o.id"
    ))?;
    let rows = stmt.query_map(s.params()?, |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// The ledger key of a row, from its event id as stored (None for a legacy
/// row) and its row id: what `event_key_sql!` computes in SQL, for a caller
/// that read the row already.
///
/// ```
/// assert_eq!(outboxd::dedup::key(Some("01jdq7x6zb5n4q2w8v1k3m9t0r"), 7), "01JDQ7X6ZB5N4Q2W8V1K3M9T0R");
/// assert_eq!(outboxd::dedup::key(None, 7), "#7");
/// ```
pub fn key(event_id: Option<&str>, row_id: i64) -> String {
    match event_id {
        Some(id) => id.to_ascii_uppercase(),
        None => format!("#{row_id}"),
    }
}

/// True when the consumer has the event whose ledger key is `event_key`
/// (see [`key`]).
pub fn has(conn: &Connection, event_key: &str, consumer: &str) -> rusqlite::Result<bool> {
    is_recorded(conn, event_key, consumer)
}

/// The entries under `event_key` in SQL (a look-up on the primary key).
const SQL_PROGRESS: &str =
    "SELECT consumer, delivered_at FROM delivered_events WHERE event_key = ?1 ORDER BY consumer";

/// Every consumer that has the event whose ledger key is `event_key`, with
/// when it succeeded, in name order: the row's progress.
pub fn progress(conn: &Connection, event_key: &str) -> rusqlite::Result<Vec<(String, Timestamp)>> {
    let mut stmt = conn.prepare_cached(SQL_PROGRESS)?;
    let rows = stmt.query_map([event_key], |r| {
        Ok((r.get(0)?, Timestamp::from_millis(r.get(1)?)))
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Schema version 6: an entry stays while a row carrying its event id
    /// stays, whatever the letter case the row spells it in (mixed case
    /// too: before, only the key and its lower case were looked up, and
    /// this entry was purged), and the purge finds such rows on the
    /// event-id index, never by a scan.
    #[test]
    fn the_purge_keeps_an_entry_while_a_row_spells_its_id_in_any_case() {
        let (_d, conn) = crate::schema::test_db();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_id, event_type)
                  VALUES (7, '01jDq8F6zc1Y0d3w9N7k2M4p5R', 'a.b.v1');
             INSERT INTO delivered_events VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a', 1, 5),
                  ('01JDQ8F6ZC1Y0D3W9N7K2M4P5S', 'a', 2, 5);",
        )
        .unwrap();
        assert_eq!(
            purge_batch(&conn, Timestamp::from_millis(10), 100).unwrap(),
            1
        );
        let kept: Vec<String> = conn
            .prepare("SELECT event_key FROM delivered_events")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(kept, ["01JDQ8F6ZC1Y0D3W9N7K2M4P5R"]);
        let plan = crate::connection::query_plan(&conn, &purge_batch_sql(), params![10, 100]);
        assert!(
            plan.iter()
                .any(|l| l.starts_with("SEARCH o USING")
                    && l.contains("INDEX event_outbox_event_id")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|l| l.starts_with("SCAN o")), "{plan:?}");
    }

    #[test]
    fn the_key_is_the_canonical_id_or_the_row_for_a_legacy_row_in_sql_and_rust() {
        let (_d, conn) = crate::schema::test_db();
        let id = crate::EventId::new().to_string();
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, lower(?1), 'a.b.v1'),
                    (2, NULL, 'a.b.v1'), (3, 'Straße-ǆ-01jd', 'a.b.v1')",
            [&id],
        )
        .unwrap();
        let rows: Vec<(Option<String>, i64, String)> = conn
            .prepare(concat!(
                "SELECT event_id, id, ",
                event_key_sql!(),
                " FROM event_outbox ORDER BY id"
            ))
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let sql_keys: Vec<&str> = rows.iter().map(|(_, _, k)| k.as_str()).collect();
        assert_eq!(sql_keys, [id.as_str(), "#2", "STRAßE-ǆ-01JD"]);
        for (event_id, row_id, sql_key) in &rows {
            assert_eq!(&key(event_id.as_deref(), *row_id), sql_key);
        }
    }

    #[test]
    fn the_claims_look_up_reads_what_record_wrote() {
        let (_d, conn) = crate::schema::test_db();
        let id = crate::EventId::new().to_string();
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, lower(?1), 'a.b.v1')",
            [&id],
        )
        .unwrap();
        let read = |conn: &Connection| {
            conn.query_row(
                concat!("SELECT ", delivered_to_sql!(), " FROM event_outbox"),
                [],
                |r| Ok(read_delivered_to(r.get_ref(0)?)),
            )
            .unwrap()
        };
        assert!(read(&conn).is_empty());
        record(&conn, &id, "a", 1, Timestamp::from_millis(5)).unwrap();
        record(&conn, &id, "b", 1, Timestamp::from_millis(5)).unwrap();
        record(&conn, &id, "b", 1, Timestamp::from_millis(6)).unwrap(); // idempotent
        let mut got = read(&conn);
        got.sort();
        assert_eq!(got, ["a", "b"]);
        assert!(knows(&conn, "b").unwrap() && !knows(&conn, "c").unwrap());
        assert_eq!(forget(&conn, &id, "a").unwrap(), 1);
        assert_eq!(read(&conn), ["b"]);
        assert_eq!(
            count_by_consumer(&conn)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            [("b".to_string(), 1)]
        );
    }

    /// The grouped record writes each entry under its row's key as
    /// `event_key_sql!` makes it (an id in any letter case in its canonical
    /// spelling, `#<row id>` for a legacy row), the key `key` makes too, and
    /// is as idempotent as `record` (a transactional consumer's own entry
    /// may be there).
    #[test]
    fn recording_many_at_once_writes_each_entry_once_under_its_rows_key() {
        let (_d, conn) = crate::schema::test_db();
        let (upper, lower) = ("01JDQ8F6ZC1Y0D3W9N7K2M4P5R", "01jdq8f6zc1y0d3w9n7k2m4p5s");
        conn.execute(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, ?1, 'a.b.v1'),
                    (2, ?2, 'a.b.v1'), (7, NULL, 'a.b.v1')",
            params![upper, lower],
        )
        .unwrap();
        record(&conn, upper, "x", 1, Timestamp::from_millis(5)).unwrap();
        let entries = [("x", 1), ("y", 1), ("x", 2), ("x", 7), ("y", 7)];
        record_many(&conn, &entries, Timestamp::from_millis(6)).unwrap();
        record_many(&conn, &[], Timestamp::from_millis(6)).unwrap();
        let rows: Vec<(String, String, i64, i64)> = conn
            .prepare("SELECT event_key, consumer, outbox_id, delivered_at FROM delivered_events ORDER BY 1, 2")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let entry = |k: String, c: &str, id, at| (k, c.to_string(), id, at);
        assert_eq!(
            rows,
            [
                entry(key(None, 7), "x", 7, 6),
                entry(key(None, 7), "y", 7, 6),
                entry(key(Some(upper), 1), "x", 1, 5),
                entry(key(Some(upper), 1), "y", 1, 6),
                entry(key(Some(lower), 2), "x", 2, 6),
            ]
        );
        assert_eq!(key(None, 7), "#7");
        assert_eq!(key(Some(lower), 2), lower.to_ascii_uppercase());
    }

    /// The grouped record reads each row by id, never the whole table.
    #[test]
    fn recording_many_reads_the_rows_by_id() {
        let (_d, conn) = crate::schema::test_db();
        let plan =
            crate::connection::query_plan(&conn, RECORD_ROWS, params![id_list([1, 2]), "x", 1]);
        assert!(
            plan.iter()
                .any(|l| l.contains("SEARCH event_outbox USING INTEGER PRIMARY KEY")),
            "{plan:?}"
        );
        assert!(
            !plan.iter().any(|l| l.starts_with("SCAN event_outbox")),
            "{plan:?}"
        );
    }

    #[test]
    fn missing_lists_the_routed_consumers_without_an_entry() {
        let names = ["a", "b", "c"];
        let done = vec!["b".to_string()];
        assert_eq!(missing(&[0, 1, 2], &done, |i| names[i]), [0, 2]);
        assert!(missing(&[1], &done, |i| names[i]).is_empty());
        assert!(missing(&[], &done, |i| names[i]).is_empty());
    }

    #[test]
    fn progress_and_has_read_what_record_wrote_on_the_primary_key() {
        let (_d, conn) = crate::schema::test_db();
        let id = crate::EventId::new().to_string();
        record(&conn, &id, "b", 1, Timestamp::from_millis(7)).unwrap();
        record(&conn, &id, "a", 1, Timestamp::from_millis(5)).unwrap();
        assert_eq!(
            progress(&conn, &id).unwrap(),
            [
                ("a".to_string(), Timestamp::from_millis(5)),
                ("b".to_string(), Timestamp::from_millis(7))
            ]
        );
        assert!(progress(&conn, "#9").unwrap().is_empty());
        assert!(has(&conn, &id, "a").unwrap() && !has(&conn, &id, "c").unwrap());
        // A page reads it per row: one look-up, never a scan.
        let plan = crate::connection::query_plan(&conn, SQL_PROGRESS, [&id]);
        assert!(plan.iter().all(|s| s.starts_with("SEARCH")), "{plan:?}");
    }

    #[test]
    fn a_selection_counts_what_it_selects() {
        let (_d, conn) = crate::schema::test_db();
        let ids: Vec<String> = (0..4).map(|_| crate::EventId::new().to_string()).collect();
        for (n, (id, ty)) in ids
            .iter()
            .zip(["a.x.v1", "a.y.v1", "b.x.v1", "a.x.v2"])
            .enumerate()
        {
            let row = n as i64 + 1;
            conn.execute(
                "INSERT INTO event_outbox (id, event_id, event_type, status, occurred_at, finished_at)
                 VALUES (?1, ?2, ?3, 'delivered', ?4, ?4)",
                params![row, id, ty, row * 10],
            )
            .unwrap();
            record(&conn, id, "c", row, Timestamp::from_millis(1)).unwrap();
        }
        // An entry whose row is gone is never selected.
        record(&conn, "GONE", "c", 99, Timestamp::from_millis(1)).unwrap();
        let all = Selection {
            consumer: "c",
            keys: &[],
            type_glob: None,
            since: None,
            until: None,
        };
        let check = |s: &Selection<'_>, want: &[i64]| {
            let got: Vec<i64> = selected(&conn, s)
                .unwrap()
                .into_iter()
                .map(|(r, _)| r)
                .collect();
            assert_eq!(got, want);
            assert_eq!(count_selected(&conn, s).unwrap(), want.len() as u64);
        };
        check(&all, &[1, 2, 3, 4]);
        check(
            &Selection {
                consumer: "other",
                ..all
            },
            &[],
        );
        check(
            &Selection {
                type_glob: Some("a.*.v1"),
                ..all
            },
            &[1, 2],
        );
        check(
            &Selection {
                since: Some(Timestamp::from_millis(20)),
                until: Some(Timestamp::from_millis(40)),
                ..all
            },
            &[2, 3],
        );
        let some = [
            ids[3].clone(),
            ids[0].clone(),
            "01JDQ7X6ZB5N4Q2W8V1K3M9T0R".into(),
        ];
        check(&Selection { keys: &some, ..all }, &[1, 4]);
        check(
            &Selection {
                keys: &some,
                type_glob: Some("*.v2"),
                ..all
            },
            &[4],
        );
    }
}
