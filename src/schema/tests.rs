//! Tests of the migrations: upgrades from each older version keep every row.

use super::*;

#[test]
fn migrations_are_numbered_like_their_files() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    files.sort();
    assert_eq!(files.len(), MIGRATIONS.len(), "every file is embedded");
    for (i, (file, m)) in files.iter().zip(MIGRATIONS).enumerate() {
        assert_eq!(m.version as usize, i + 1, "versions have no gaps");
        assert_eq!(file, &format!("{:04}_{}.sql", m.version, m.name));
        let on_disk = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        assert_eq!(on_disk, m.sql);
        let upper = m.sql.to_uppercase();
        let code: Vec<&str> = upper
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("--"))
            .collect();
        for banned in ["COMMIT", "PRAGMA", "STRICT", "UNIXEPOCH("] {
            let in_code = code.iter().any(|l| l.contains(banned));
            assert!(!in_code, "{file} must not use {banned}");
        }
        // A transaction's BEGIN, not a trigger body's (a line of its own).
        let begins = code
            .iter()
            .any(|l| (l.starts_with("BEGIN") && *l != "BEGIN") || l.contains(" BEGIN "));
        assert!(!begins, "{file} must not begin a transaction");
    }
}

fn migrated_to(version: u32) -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = crate::connection::open(dir.path().join("app.db")).unwrap();
    migrate_up_to(&mut conn, version).unwrap();
    (dir, conn)
}

/// Every row of a table, every column, in id order.
fn rows(conn: &Connection, table: &str) -> Vec<Vec<rusqlite::types::Value>> {
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM {table} ORDER BY 1"))
        .unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// `before`'s rows as they read after a migration that added columns
/// at the end (version 9's trace context): NULL in each of them.
fn widened(
    mut before: Vec<Vec<rusqlite::types::Value>>,
    conn: &Connection,
    table: &str,
) -> Vec<Vec<rusqlite::types::Value>> {
    let width = conn
        .prepare(&format!("SELECT * FROM {table}"))
        .unwrap()
        .column_count();
    for row in &mut before {
        row.resize(width, rusqlite::types::Value::Null);
    }
    before
}

/// A database at version 4, with rows in every state, migrates to the
/// latest version keeping every row as it was; only a pending row due
/// after year 9999 (which version 4 let an UPDATE write) is moved to the
/// bound, where it is still never due.
#[test]
fn a_version_4_database_upgrades_keeping_its_rows() {
    let (_dir, mut conn) = migrated_to(4);
    let micros = 1_764_487_080_000_000_i64;
    conn.execute_batch(&format!(
        "INSERT INTO event_outbox (event_id, event_type, payload, idempotency_key, ordering_key)
              VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a.b.v1', '{{\"n\":1}}', 'k', 'o');
         INSERT INTO event_outbox (event_type, payload, status, finished_at)
              VALUES ('a.b.v1', '2', 'delivered', 5);
         INSERT INTO event_outbox (event_type, payload, status, finished_at, last_error)
              VALUES ('a.b.v1', '3', 'dead', 6, 'refused');
         INSERT INTO event_outbox (event_type, payload, claim_token, lease_until)
              VALUES ('a.b.v1', '4', 'T', 9);
         INSERT INTO event_outbox (event_type, payload) VALUES ('a.b.v1', '5');
         INSERT INTO event_outbox (event_type, payload, status, finished_at)
              VALUES ('a.b.v1', '6', 'dead', 7);
         UPDATE event_outbox SET available_at = {micros} WHERE payload IN ('5', '6');
         INSERT INTO delivered_events VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'c', 1, 8);"
    ))
    .unwrap();
    let outbox = rows(&conn, "event_outbox");
    let ledger = rows(&conn, "delivered_events");

    let report = migrate(&mut conn).unwrap();
    assert_eq!((report.from, report.to), (4, LATEST_VERSION));
    let mut expected = widened(outbox, &conn, "event_outbox");
    let available_at = conn
        .prepare("SELECT * FROM event_outbox")
        .unwrap()
        .column_index("available_at")
        .unwrap();
    // The pending row past the bound, and only it.
    expected[4][available_at] = rusqlite::types::Value::Integer(253_402_300_799_999);
    assert_eq!(rows(&conn, "event_outbox"), expected);
    assert_eq!(rows(&conn, "delivered_events"), ledger);
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .map(|ok| assert_eq!(ok, "ok"))
        .unwrap();

    // The bound still holds for new rows, with its explanation.
    let e = conn
        .execute(
            &format!(
                "INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', {micros})"
            ),
            [],
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("event_outbox_times_in_milliseconds") && e.contains("not microseconds"),
        "{e}"
    );
}

/// A database at version 5, with rows in every state, migrates to the
/// latest version keeping every row as it was, and its event-id index
/// (rebuilt with NOCASE in version 6) finds every spelling of an id
/// with one probe, finished rows too.
#[test]
fn a_version_5_database_upgrades_and_finds_event_ids_in_any_case() {
    let (_dir, mut conn) = migrated_to(5);
    conn.execute_batch(
        "INSERT INTO event_outbox (event_id, event_type, payload)
              VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a.b.v1', '1'),
                     ('01jdq8f6zc1y0d3w9n7k2m4p5r', 'a.b.v1', '2'),
                     ('01JdQ8f6Zc1Y0D3W9N7K2M4P5R', 'a.b.v1', '3');
         INSERT INTO event_outbox (event_type, payload) VALUES ('a.b.v1', '4');
         INSERT INTO event_outbox (event_id, event_type, payload, claim_token, lease_until)
              VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5T', 'a.b.v1', '5', 'T', 9);
         INSERT INTO event_outbox (event_id, event_type, payload, status, finished_at)
              VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'a.b.v1', '6', 'delivered', 5),
                     ('01JDQ8F6ZC1Y0D3W9N7K2M4P5W', 'a.b.v1', '7', 'dead', 6);
         INSERT INTO delivered_events VALUES ('01JDQ8F6ZC1Y0D3W9N7K2M4P5R', 'c', 6, 8);",
    )
    .unwrap();
    let outbox = rows(&conn, "event_outbox");
    let ledger = rows(&conn, "delivered_events");

    let report = migrate(&mut conn).unwrap();
    assert_eq!((report.from, report.to), (5, LATEST_VERSION));
    assert_eq!(
        rows(&conn, "event_outbox"),
        widened(outbox, &conn, "event_outbox")
    );
    assert_eq!(rows(&conn, "delivered_events"), ledger);
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .map(|ok| assert_eq!(ok, "ok"))
        .unwrap();
    let same_id: Vec<String> = conn
        .prepare(
            "SELECT payload FROM event_outbox INDEXED BY event_outbox_event_id
              WHERE event_id = ?1 COLLATE NOCASE ORDER BY id",
        )
        .unwrap()
        .query_map(["01jDq8F6zc1y0d3w9n7k2m4p5R"], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(same_id, ["1", "2", "3", "6"], "every spelling, one probe");
    let entries: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_outbox INDEXED BY event_outbox_event_id
              WHERE event_id >= '' COLLATE NOCASE",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(entries, 6, "every row with an event id, none without");
}

/// No trigger on event_outbox. Any INSERT trigger, whatever its WHEN
/// clause, makes SQLite run a program per row, journal every statement
/// and buffer multi-row INSERTs in a temporary table, which costs every
/// enqueue (BENCHMARKS.md has the figure). A rule about a row belongs in
/// a CHECK.
#[test]
fn the_outbox_table_has_no_trigger() {
    let (_dir, conn) = migrated_to(LATEST_VERSION);
    let triggers: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'event_outbox'",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(triggers.is_empty(), "{triggers:?}");
}

/// Version 6 restates three CHECKs without function calls (so that a
/// multi-row INSERT needs no statement journal). Foreign producers must
/// see no difference: each value below, written into each checked
/// column, gets the same verdict (written, or refused naming the same
/// constraint) from version 5 and from the latest schema.
#[test]
fn the_checks_without_functions_refuse_exactly_what_version_5_refused() {
    let (_d5, v5) = migrated_to(5);
    let (_d6, latest) = migrated_to(LATEST_VERSION);
    let verdict = |conn: &Connection, column: &str, value: &str| {
        let sql = if column == "event_type" {
            format!("INSERT INTO event_outbox (event_type) VALUES ({value})")
        } else {
            format!("INSERT INTO event_outbox (event_type, {column}) VALUES ('a.b.v1', {value})")
        };
        match conn.execute(&sql, []) {
            Ok(_) => "written".to_string(),
            Err(e) => e.to_string(),
        }
    };
    let times = [
        "0",
        "1",
        "-1",
        "1764487080123",
        "253402300799999",
        "253402300800000",
        "9223372036854775807",
        "-9223372036854775807",
        "-9223372036854775807 - 1",
        "1764487080123.0",
        "1764487080123.5",
        "-0.0",
        "0.5",
        "1e15",
        "1e300",
        "-1e300",
        "9223372036854775807.0",
        "9223372036854775808.0",
        "-9223372036854775808.0",
        "-9223372036854777856.0",
        "'1764487080123'",
        "' 42 '",
        "'4.0'",
        "'4.5'",
        "'2026-11-30T07:18:00Z'",
        "''",
        "'-9223372036854775808'",
        "'-9.22337203685478e+18'",
        "x''",
        "x'31'",
        "x'0000'",
        "NULL",
    ];
    let mut compared = 0;
    for column in ["occurred_at", "created_at", "available_at"] {
        for value in times {
            let (old, new) = (verdict(&v5, column, value), verdict(&latest, column, value));
            assert_eq!(old, new, "{column} = {value}");
            compared += 1;
        }
    }
    for value in [
        "''", "'a'", "' '", "'a.b.v1'", "x''", "x'00'", "x'61'", "0", "1.5", "-0.0", "NULL",
    ] {
        let (old, new) = (
            verdict(&v5, "event_type", value),
            verdict(&latest, "event_type", value),
        );
        assert_eq!(old, new, "event_type = {value}");
        compared += 1;
    }
    // Both schemas did refuse some of them, for each reason.
    for name in [
        "event_outbox_type_not_empty",
        "event_outbox_times_are_integers",
        "event_outbox_times_in_milliseconds",
    ] {
        assert!(
            times
                .iter()
                .chain(["''"].iter())
                .any(|v| ["available_at", "event_type"]
                    .iter()
                    .any(|c| verdict(&latest, c, v).contains(name))),
            "{name} never fired"
        );
    }
    assert!(compared > 100);
    // And the latest table calls no function in a CHECK.
    let sql: String = latest
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'event_outbox'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    for f in ["typeof(", "length("] {
        assert!(!sql.contains(f), "{f} in {sql}");
    }
}

/// Version 6 alters event_outbox's CHECKs in place. The objects change
/// capture installs beside it (a view, its INSTEAD OF trigger writing
/// event_outbox rows, a trigger on event_outbox itself) come through
/// the migration word for word, so capture's drift check stays quiet,
/// and still write events.
#[test]
fn capture_objects_survive_version_7_unchanged() {
    let (_dir, mut conn) = migrated_to(5);
    let objects = crate::capture::generate::event_objects();
    for o in &objects {
        conn.execute_batch(&o.sql).unwrap();
    }
    let sql_of = |conn: &Connection, name: &str| -> String {
        conn.query_row(
            "SELECT sql FROM sqlite_master WHERE name = ?1",
            [name],
            |r| r.get(0),
        )
        .unwrap()
    };
    let before: Vec<String> = objects.iter().map(|o| sql_of(&conn, &o.name)).collect();
    migrate(&mut conn).unwrap();
    let after: Vec<String> = objects.iter().map(|o| sql_of(&conn, &o.name)).collect();
    assert_eq!(before, after);
    conn.execute(
        "INSERT INTO outboxd_capture_event (event_type, payload) VALUES ('page.insert.v1', '{}')",
        [],
    )
    .unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

/// Version 8 keys captures by name. A capture recorded by version 7 (by
/// its table) keeps its triggers' names and records: it is intact after
/// the upgrade, a dropped trigger is still reported missing, and apply
/// reinstalls it, recording the gap.
#[test]
fn a_version_7_capture_keeps_its_drift_check_across_version_8() {
    use crate::capture::{self, CaptureSpec, Columns};
    let (_dir, mut conn) = migrated_to(7);
    conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
        .unwrap();
    let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::All);
    for (name, kind, sql) in capture::objects_of(&conn, &spec) {
        conn.execute(&sql, []).unwrap();
        let owner = if name.ends_with("_pages") {
            "pages"
        } else {
            ""
        };
        conn.execute(
            "INSERT INTO outboxd_capture_object (name, type, table_name, sql)
             SELECT name, ?2, ?3, sql FROM sqlite_master WHERE name = ?1",
            rusqlite::params![name, kind, owner],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO outboxd_capture (table_name, spec, installed_at, verified_at) VALUES ('pages', ?1, 5, 7)",
        [serde_json::to_string(&spec).unwrap()],
    )
    .unwrap();
    migrate(&mut conn).unwrap();
    let status = capture::inspect(&conn).unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(
        (status[0].name.as_str(), status[0].table.as_str()),
        ("pages", "pages")
    );
    assert!(status[0].is_intact(), "{status:?}");
    assert_eq!(status[0].verified_at, Timestamp::from_millis(7));
    conn.execute_batch("DROP TRIGGER outboxd_capture_update_pages")
        .unwrap();
    let status = capture::inspect(&conn).unwrap();
    assert_eq!(status[0].missing(), ["outboxd_capture_update_pages"]);
    let report = capture::apply(&mut conn, &[spec], Timestamp::from_millis(9)).unwrap();
    assert_eq!(
        report.tables[0].reinstalled,
        ["outboxd_capture_update_pages"]
    );
    assert_eq!(report.gaps.len(), 1);
    assert_eq!(report.gaps[0].lost_after, Timestamp::from_millis(7));
    assert!(capture::inspect(&conn).unwrap()[0].is_intact());
}

/// The look-up of an event's ledger entries that the claim makes for
/// each row it takes ([`crate::dedup`]'s `delivered_to_sql!`) searches
/// the ledger's primary key; a scan would read the whole ledger per row.
#[test]
fn the_claims_ledger_look_up_searches_its_key() {
    let (_dir, conn) = migrated_to(LATEST_VERSION);
    let sql = format!(
        "EXPLAIN QUERY PLAN SELECT id, {} FROM event_outbox WHERE id = ?1",
        crate::dedup::delivered_to_sql!()
    );
    let plan: Vec<String> = conn
        .prepare(&sql)
        .unwrap()
        .query_map([1], |r| r.get(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        plan.iter()
            .any(|l| l.starts_with("SEARCH d USING PRIMARY KEY")),
        "{plan:?}"
    );
    assert!(!plan.iter().any(|l| l.starts_with("SCAN")), "{plan:?}");
}
