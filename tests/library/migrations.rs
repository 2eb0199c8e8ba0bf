//! The schema as code: migrations apply from empty, are idempotent and safe
//! to race, leave the host's data and `user_version` alone, refuse a newer
//! schema without writing, and the tables keep the invariants the relay
//! relies on (query plan of the claim, ids never reused, named CHECKs).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use outboxd::schema::{self, LATEST_VERSION, VERSION_TABLE};
use outboxd::Error;
use rusqlite::Connection;

/// A temp directory holding one database path; the directory goes away
/// with the value.
struct TempDb {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TempDb {
    fn new() -> TempDb {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        TempDb { _dir: dir, path }
    }

    fn open(&self) -> Connection {
        outboxd::connection::open(&self.path).unwrap()
    }

    fn migrated(&self) -> Connection {
        let mut conn = self.open();
        schema::migrate(&mut conn).unwrap();
        conn
    }
}

/// Every object in sqlite_master, sorted, with its SQL: a fingerprint of the
/// schema.
fn schema_objects(conn: &Connection) -> Vec<(String, String, Option<String>)> {
    let mut stmt = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn version_rows(conn: &Connection) -> Vec<(u32, String)> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT version, name FROM {VERSION_TABLE} ORDER BY version"
        ))
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn table_exists(conn: &Connection, name: &str) -> bool {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

fn user_version(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

fn insert_pending(conn: &Connection, event_type: &str) -> i64 {
    conn.execute(
        "INSERT INTO event_outbox (event_type, payload) VALUES (?1, '{}')",
        [event_type],
    )
    .unwrap();
    conn.last_insert_rowid()
}

/// The files of a database whose connections are all closed: the main file
/// and, if present, its WAL.
fn file_bytes(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    (std::fs::read(path).unwrap(), std::fs::read(wal).ok())
}

#[test]
fn migrate_from_empty_creates_every_table_and_records_the_version_once() {
    let db = TempDb::new();
    let mut conn = db.open();
    assert!(matches!(
        schema::ensure_current(&conn),
        Err(Error::NotMigrated)
    ));
    assert_eq!(schema::version(&conn).unwrap(), None);

    let report = schema::migrate(&mut conn).unwrap();
    assert_eq!(report.from, 0);
    assert_eq!(report.to, LATEST_VERSION);
    assert!(!report.was_current());
    for table in [
        "event_outbox",
        "delivered_events",
        "publish_intents",
        VERSION_TABLE,
    ] {
        assert!(table_exists(&conn, table), "{table} is missing");
    }
    let versions: Vec<u32> = version_rows(&conn).into_iter().map(|(v, _)| v).collect();
    assert_eq!(versions, (1..=LATEST_VERSION).collect::<Vec<_>>());
    assert_eq!(schema::version(&conn).unwrap(), Some(LATEST_VERSION));
    schema::ensure_current(&conn).unwrap();
}

#[test]
fn migrating_twice_is_a_no_op() {
    let db = TempDb::new();
    let mut conn = db.migrated();
    let objects = schema_objects(&conn);
    let versions = version_rows(&conn);

    let report = schema::migrate(&mut conn).unwrap();
    assert!(report.was_current(), "{report:?}");
    assert_eq!(report.to, LATEST_VERSION);
    assert_eq!(schema_objects(&conn), objects);
    assert_eq!(version_rows(&conn), versions);

    // And from a fresh connection, as a second run of `outboxd migrate` would.
    drop(conn);
    let mut again = db.open();
    assert!(schema::migrate(&mut again).unwrap().was_current());
    assert_eq!(version_rows(&again), versions);
}

#[test]
fn concurrent_migrations_all_succeed_and_apply_each_version_once() {
    const THREADS: usize = 6;
    let db = TempDb::new();
    // Create the file first, as a host would have; each thread then races
    // on its own connection.
    drop(db.open());
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let path = db.path.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut conn = outboxd::connection::open(&path)?;
                start.wait();
                schema::migrate(&mut conn)
            })
        })
        .collect();
    let reports: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("a migrating thread panicked"))
        .collect::<Result<_, _>>()
        .unwrap();

    assert!(
        reports.iter().all(|r| r.to == LATEST_VERSION),
        "{reports:?}"
    );
    let appliers = reports.iter().filter(|r| r.from == 0).count();
    assert!(appliers >= 1, "someone applied the migrations: {reports:?}");
    let conn = db.open();
    let versions: Vec<u32> = version_rows(&conn).into_iter().map(|(v, _)| v).collect();
    assert_eq!(versions, (1..=LATEST_VERSION).collect::<Vec<_>>());
    schema::ensure_current(&conn).unwrap();
}

#[test]
fn the_hosts_user_version_survives_migrate() {
    let db = TempDb::new();
    let mut conn = db.open();
    conn.execute_batch("PRAGMA user_version = 42").unwrap();
    schema::migrate(&mut conn).unwrap();
    assert_eq!(user_version(&conn), 42);
    schema::migrate(&mut conn).unwrap();
    assert_eq!(user_version(&conn), 42);
    drop(conn);
    assert_eq!(user_version(&db.open()), 42);
}

#[test]
fn another_applications_tables_are_kept() {
    let db = TempDb::new();
    let mut conn = db.open();
    conn.execute_batch(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE);
         INSERT INTO users (email) VALUES ('ada@example.com'), ('bob@example.com');
         CREATE INDEX users_email ON users (email);
         CREATE VIEW user_emails AS SELECT email FROM users;",
    )
    .unwrap();
    let before = schema_objects(&conn);

    schema::migrate(&mut conn).unwrap();

    let after = schema_objects(&conn);
    for object in &before {
        assert!(after.contains(object), "{object:?} was changed or dropped");
    }
    let emails: Vec<String> = conn
        .prepare("SELECT email FROM user_emails ORDER BY email")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(emails, ["ada@example.com", "bob@example.com"]);
    assert!(table_exists(&conn, "event_outbox"));
}

#[test]
fn a_newer_schema_is_refused_by_migrate_and_ensure_current_without_writing() {
    let db = TempDb::new();
    {
        let conn = db.migrated();
        conn.execute(
            &format!(
                "INSERT INTO {VERSION_TABLE} (version, name, applied_at) VALUES (999, 'future', 0)"
            ),
            [],
        )
        .unwrap();
    } // The last connection closes: the WAL is checkpointed into the main file.
    let files_before = file_bytes(&db.path);

    // outboxd's own open refuses it before configuring anything...
    let err = outboxd::connection::open(&db.path).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 999, .. }),
        "{err:?}"
    );
    // ...and so do migrate and ensure_current on a host's plain connection.
    let mut conn = Connection::open(&db.path).unwrap();
    let objects = schema_objects(&conn);
    let versions = version_rows(&conn);

    let err = schema::migrate(&mut conn).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 999, supported } if supported == LATEST_VERSION),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("999"), "{msg}");
    assert!(msg.contains(&format!("({LATEST_VERSION})")), "{msg}");
    assert!(err.is_schema());

    let err = schema::ensure_current(&conn).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 999, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("999"), "{err}");

    assert_eq!(conn.total_changes(), 0, "migrate wrote rows");
    assert_eq!(schema_objects(&conn), objects);
    assert_eq!(version_rows(&conn), versions);
    drop(conn);
    assert!(
        file_bytes(&db.path) == files_before,
        "the database file changed"
    );
}

#[test]
fn the_claim_query_searches_the_due_index_without_sorting() {
    let db = TempDb::new();
    let conn = db.migrated();
    let claim = "SELECT id FROM event_outbox WHERE status = 'pending' AND available_at <= ?1 \
                 ORDER BY available_at, id LIMIT ?2";
    let plan = |conn: &Connection| -> Vec<String> {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {claim}"))
            .unwrap()
            .query_map(rusqlite::params![0_i64, 100_i64], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let check = |plan: &[String]| {
        assert!(
            plan.iter()
                .any(|d| d.starts_with("SEARCH event_outbox USING")
                    && d.contains("INDEX event_outbox_due ")),
            "the claim does not search event_outbox_due: {plan:?}"
        );
        assert!(
            !plan.iter().any(|d| d.contains("TEMP B-TREE")),
            "the claim sorts: {plan:?}"
        );
        assert!(
            !plan.iter().any(|d| d.starts_with("SCAN")),
            "the claim scans: {plan:?}"
        );
    };
    check(&plan(&conn));

    // Still so when the table is mostly finished rows and statistics say so.
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
         INSERT INTO event_outbox (event_type, status, finished_at)
         SELECT 'a.b.v1', CASE WHEN i % 2 = 0 THEN 'delivered' ELSE 'dead' END, i FROM n;
         INSERT INTO event_outbox (event_type) VALUES ('a.b.v1');
         ANALYZE;",
    )
    .unwrap();
    check(&plan(&conn));
}

#[test]
fn row_ids_are_never_reused() {
    let db = TempDb::new();
    let conn = db.migrated();
    insert_pending(&conn, "a.b.v1");
    let max = insert_pending(&conn, "a.b.v1");
    conn.execute("DELETE FROM event_outbox WHERE id = ?1", [max])
        .unwrap();
    let next = insert_pending(&conn, "a.b.v1");
    assert!(next > max, "id {max} was reused as {next}");

    // Even when the table is emptied completely.
    conn.execute("DELETE FROM event_outbox", []).unwrap();
    let after_purge = insert_pending(&conn, "a.b.v1");
    assert!(after_purge > next, "id {next} was reused as {after_purge}");
}

#[test]
fn named_check_constraints_guard_the_state_machine() {
    let db = TempDb::new();
    let conn = db.migrated();
    let id = insert_pending(&conn, "a.b.v1");
    let violation = |sql: &str| -> String {
        let err = conn.execute(sql, [id]).unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::ConstraintViolation),
            "{err}"
        );
        err.to_string()
    };

    let msg = violation("UPDATE event_outbox SET status = 'done' WHERE id = ?1");
    assert!(msg.contains("event_outbox_status_valid"), "{msg}");

    let msg = violation("UPDATE event_outbox SET lease_until = 123 WHERE id = ?1");
    assert!(msg.contains("event_outbox_lease_has_token"), "{msg}");

    let msg = violation("UPDATE event_outbox SET claim_token = 'tok' WHERE id = ?1");
    assert!(msg.contains("event_outbox_lease_has_token"), "{msg}");

    let msg = violation("UPDATE event_outbox SET status = 'delivered' WHERE id = ?1");
    assert!(
        msg.contains("event_outbox_finished_at_iff_finished"),
        "{msg}"
    );

    let msg = violation(
        "UPDATE event_outbox SET status = 'delivered', finished_at = 1,
             claim_token = 'tok', lease_until = 5 WHERE id = ?1",
    );
    assert!(msg.contains("event_outbox_finished_not_leased"), "{msg}");

    let msg = violation("UPDATE event_outbox SET attempts = -1 WHERE id = ?1");
    assert!(msg.contains("event_outbox_attempts_non_negative"), "{msg}");

    let msg = violation("UPDATE event_outbox SET event_type = '' WHERE id = ?1");
    assert!(msg.contains("event_outbox_type_not_empty"), "{msg}");

    // Timestamps are INTEGER milliseconds; text or a fraction is refused
    // at INSERT time instead of leaving a row that is never due.
    for bad in ["'2026-11-30T07:18:00Z'", "1764487080.5"] {
        for column in ["available_at", "occurred_at"] {
            let err = conn
                .execute(
                    &format!(
                        "INSERT INTO event_outbox (event_type, {column}) VALUES ('a.b.v1', {bad})"
                    ),
                    [],
                )
                .unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("event_outbox_times_are_integers"),
                "{column}={bad}: {msg}"
            );
        }
    }
    // A number bound as text is stored as an INTEGER (column affinity).
    conn.execute(
        "INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', '1796023974812')",
        [],
    )
    .unwrap();

    // The legal transitions pass.
    conn.execute(
        "UPDATE event_outbox SET claim_token = 'tok', lease_until = 5 WHERE id = ?1",
        [id],
    )
    .unwrap();
    conn.execute(
        "UPDATE event_outbox SET claim_token = NULL, lease_until = NULL,
             status = 'delivered', finished_at = 6 WHERE id = ?1",
        [id],
    )
    .unwrap();
}
