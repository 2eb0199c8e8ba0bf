//! Snapshots (issue 33): one `r` event per existing row, in chunks, with
//! start and end markers; resumable; ordered against live changes; gaps
//! recorded by a reinstall and covered by a snapshot; several captures of
//! one table with their own conditions and types.

use crate::common;

use std::collections::BTreeMap;

use common::{stored_events, StoredEvent, TestDb};
use outboxd::capture::snapshot::{self, SnapshotOptions, SnapshotSelection, SnapshotState};
use outboxd::capture::{self, CaptureSpec, Columns, Operation, When};
use outboxd::{Error, Timestamp};
use rusqlite::Connection;
use serde_json::{json, Value};

fn pages(n: usize) -> (TestDb, Connection) {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT, live INTEGER NOT NULL DEFAULT 0)",
    )
    .unwrap();
    let tx = conn.transaction().unwrap();
    for i in 1..=n {
        tx.execute(
            "INSERT INTO pages (title, live) VALUES (?1, ?2)",
            rusqlite::params![format!("page {i}"), (i % 2) as i64],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    (db, conn)
}

fn spec() -> CaptureSpec {
    CaptureSpec::new(
        "pages",
        "page.{op}.v1",
        Columns::List(vec!["title".into(), "live".into()]),
    )
}

fn opts(chunk: usize) -> SnapshotOptions {
    SnapshotOptions {
        chunk_rows: chunk,
        ..SnapshotOptions::default()
    }
}

fn of_type<'a>(evs: &'a [StoredEvent], ty: &str) -> Vec<&'a StoredEvent> {
    evs.iter()
        .filter(|e| e.envelope.event_type.as_str() == ty)
        .collect()
}

/// r events by page id: how many each page has.
fn r_counts(evs: &[StoredEvent]) -> BTreeMap<i64, usize> {
    let mut m = BTreeMap::new();
    for e in of_type(evs, "page.snapshot.v1") {
        *m.entry(e.payload["key"]["id"].as_i64().unwrap())
            .or_default() += 1;
    }
    m
}

#[test]
fn a_snapshot_sends_each_row_once_with_markers_around() {
    let (_db, mut conn) = pages(1234);
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let mut chunks = 0;
    let s = snapshot::run(&mut conn, "pages", &opts(100), |_| {
        chunks += 1;
        true
    })
    .unwrap();
    assert_eq!(s.state, SnapshotState::Completed);
    assert_eq!((s.scanned, s.rows, s.total), (1234, 1234, Some(1234)));
    assert_eq!(chunks, 14, "13 chunks of rows and the end");
    let evs = stored_events(&conn);
    assert_eq!(evs.len(), 1236);
    let first = &evs[0];
    assert_eq!(
        first.envelope.event_type.as_str(),
        "page.snapshot_started.v1"
    );
    assert_eq!(first.payload["snapshot_id"], json!(s.id));
    assert_eq!(first.payload["table"], json!("pages"));
    let last = evs.last().unwrap();
    assert_eq!(
        last.envelope.event_type.as_str(),
        "page.snapshot_completed.v1"
    );
    assert_eq!(last.payload["rows"], json!(1234));
    assert_eq!(last.payload["snapshot_id"], json!(s.id));
    assert_eq!(first.ordering_key, last.ordering_key, "markers in order");
    assert_eq!(
        evs[1].payload,
        json!({"op": "r", "table": "pages", "snapshot_id": s.id, "key": {"id": 1}, "before": null,
               "after": {"title": "page 1", "live": 1}})
    );
    assert_eq!(
        evs[1].ordering_key.as_deref(),
        Some("pages:1"),
        "as a live change's"
    );
    let counts = r_counts(&evs);
    assert_eq!(counts.len(), 1234);
    assert!(counts.values().all(|n| *n == 1));
    // A second run is a second snapshot (the first has completed).
    let again = snapshot::run(&mut conn, "pages", &opts(1000), |_| true).unwrap();
    assert_ne!(again.id, s.id);
    assert_eq!(snapshot::snapshots(&conn, 10).unwrap().len(), 2);
}

/// A snapshot stopped after some chunks (a crash, kill -9, Ctrl-C) goes on
/// from its cursor when run again: every row once.
#[test]
fn a_stopped_snapshot_resumes_where_it_stopped() {
    let (db, mut conn) = pages(500);
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let mut n = 0;
    let s = snapshot::run(&mut conn, "pages", &opts(60), |_| {
        n += 1;
        n < 3
    })
    .unwrap();
    assert_eq!(s.state, SnapshotState::Running);
    assert_eq!(s.scanned, 180);
    drop(conn);
    let mut conn = db.conn();
    let done = snapshot::run(&mut conn, "pages", &opts(60), |_| true).unwrap();
    assert_eq!(done.id, s.id, "the same snapshot, resumed");
    assert_eq!((done.scanned, done.rows), (500, 500));
    let evs = stored_events(&conn);
    let counts = r_counts(&evs);
    assert_eq!(counts.len(), 500);
    assert!(counts.values().all(|n| *n == 1));
    assert_eq!(of_type(&evs, "page.snapshot_started.v1").len(), 1);
    assert_eq!(of_type(&evs, "page.snapshot_completed.v1").len(), 1);
}

/// Live changes between chunks: a row changed before its chunk has its
/// live event first and its r event shows the change; one changed after
/// has its r event first; a row deleted before its chunk has none, one
/// inserted meanwhile has its live event only (the snapshot reads up to the
/// last key it found at its start, so inserts cannot keep it from ending).
/// The sequence per key is a valid history.
#[test]
fn live_changes_are_ordered_against_the_snapshot() {
    let (_db, mut conn) = pages(300);
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let s = snapshot::start(&mut conn, "pages", &opts(50), Timestamp::now()).unwrap();
    let mut i = 0;
    loop {
        // Between chunks: edit a row behind the cursor and one ahead,
        // delete one ahead, insert one.
        i += 1;
        conn.execute_batch(&format!(
            "UPDATE pages SET title = 'edit {i}' WHERE id IN ({}, {});
             DELETE FROM pages WHERE id = {};
             INSERT INTO pages (title) VALUES ('new {i}');",
            (i * 37) % 300 + 1,
            (i * 53) % 300 + 1,
            (i * 71) % 300 + 1
        ))
        .unwrap();
        let now = snapshot::step(&mut conn, &s.id, &opts(50), Timestamp::now()).unwrap();
        assert!(i < 100, "the snapshot ends");
        if now.state != SnapshotState::Running {
            break;
        }
    }
    let evs = stored_events(&conn);
    let existing: Vec<i64> = conn
        .prepare("SELECT id FROM pages ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let counts = r_counts(&evs);
    for id in &existing {
        let want = if *id <= 300 { Some(&1) } else { None };
        assert_eq!(
            counts.get(id),
            want,
            "page {id} exists: one r event unless inserted meanwhile"
        );
    }
    // Per key, replay the events: the state after the last event is the
    // row as it is, and an r event is never followed by a c event nor
    // preceded by a d event (a row is read only while it exists).
    let mut by_key: BTreeMap<i64, Vec<&StoredEvent>> = BTreeMap::new();
    for e in evs.iter().filter(|e| e.payload["key"].is_object()) {
        by_key
            .entry(e.payload["key"]["id"].as_i64().unwrap())
            .or_default()
            .push(e);
    }
    for (id, list) in &by_key {
        let ops: Vec<&str> = list
            .iter()
            .map(|e| e.payload["op"].as_str().unwrap())
            .collect();
        let seq = ops.join("");
        assert!(
            !seq.contains("dr") && !seq.contains("rc"),
            "page {id}: {seq}"
        );
        let keys: Vec<_> = list.iter().map(|e| e.ordering_key.clone()).collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "one ordering key");
        let title: Option<String> = conn
            .query_row("SELECT title FROM pages WHERE id = ?1", [id], |r| r.get(0))
            .ok();
        let last = list.last().unwrap();
        match title {
            Some(t) => assert_eq!(last.payload["after"]["title"], json!(t), "page {id}: {seq}"),
            None => assert_eq!(last.payload["op"], json!("d"), "page {id}: {seq}"),
        }
    }
}

/// Several captures of one table, each with its own condition and type:
/// semantic events (page.published.v1 when live goes from 0 to 1) beside
/// the plain ones; a capture whose condition reads OLD is not snapshotted,
/// and a capture's insert condition filters its snapshot.
#[test]
fn several_captures_of_a_table_make_semantic_events() {
    let (_db, mut conn) = pages(10);
    let mut published = CaptureSpec::new(
        "pages",
        "page.published.v1",
        Columns::List(vec!["title".into()]),
    );
    published.name = Some("page-published".into());
    // The event is about `live` changing, which it does not copy.
    published.changed_only = false;
    published.operations = vec![Operation::Insert, Operation::Update];
    published.when = Some(When::PerOperation {
        insert: Some("NEW.live = 1".into()),
        update: Some("NEW.live = 1 AND (OLD.live IS NULL OR OLD.live = 0)".into()),
        delete: None,
    });
    let mut live = CaptureSpec::new(
        "pages",
        "page.live.{op}.v1",
        Columns::List(vec!["title".into()]),
    );
    live.operations = vec![Operation::Insert];
    live.when = Some(When::All("NEW.live = 1".into()));
    let report = capture::apply(
        &mut conn,
        &[spec(), published.clone(), live],
        Timestamp::now(),
    )
    .unwrap();
    let names: Vec<&str> = report.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["pages", "page-published", "pages-2"]);
    conn.execute_batch(
        "UPDATE pages SET live = 1 WHERE id = 2;
         UPDATE pages SET title = 'still live' WHERE id = 2;
         UPDATE pages SET live = 0 WHERE id = 1;
         INSERT OR REPLACE INTO pages (id, title, live) VALUES (3, 'replaced', 1);",
    )
    .unwrap();
    let evs = stored_events(&conn);
    // Each capture's events in statement order; the captures of one row
    // written by one statement come in the order SQLite fires their
    // triggers (docs/capture.md).
    let of = |prefix: &str| -> Vec<String> {
        evs.iter()
            .map(|e| format!("{}:{}", e.envelope.event_type, e.payload["key"]["id"]))
            .filter(|t| t.starts_with(prefix))
            .collect()
    };
    assert_eq!(
        of("page.updated.v1")
            .into_iter()
            .chain(of("page.deleted"))
            .chain(of("page.created"))
            .collect::<Vec<_>>(),
        [
            "page.updated.v1:2",
            "page.updated.v1:2",
            "page.updated.v1:1",
            "page.deleted.v1:3",
            "page.created.v1:3"
        ]
    );
    assert_eq!(
        of("page.published.v1"),
        ["page.published.v1:2", "page.published.v1:3"]
    );
    assert_eq!(of("page.live."), ["page.live.created.v1:3"]);
    assert_eq!(evs.len(), 8);
    let statuses = capture::inspect(&conn).unwrap();
    assert_eq!(statuses.len(), 3);
    assert!(statuses.iter().all(|s| s.is_intact()));
    assert_eq!(
        snapshot::snapshottable(&conn, "pages").unwrap(),
        ["pages", "pages-2"]
    );
    let e = snapshot::start(&mut conn, "page-published", &opts(10), Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("reads OLD"), "{e}");
    let before = evs.len();
    let s = snapshot::run(&mut conn, "pages-2", &opts(3), |_| true).unwrap();
    let live_rows: i64 = conn
        .query_row("SELECT count(*) FROM pages WHERE live = 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        (s.scanned, s.rows as i64),
        (10, live_rows),
        "every row read, the live ones sent"
    );
    let evs = stored_events(&conn);
    assert!(of_type(&evs[before..], "page.live.snapshot.v1").len() as i64 == live_rows);
    // Dropping one capture leaves the others.
    capture::remove(
        &mut conn,
        &capture::Removal::Capture("page-published".into()),
    )
    .unwrap();
    let left: Vec<String> = capture::inspect(&conn)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(left, ["pages", "pages-2"]);
    assert!(capture::inspect(&conn)
        .unwrap()
        .iter()
        .all(|s| s.is_intact()));
}

/// A --where filter; a filtered snapshot covers no gap, a full one does.
#[test]
fn a_gap_is_recorded_by_apply_and_covered_by_a_later_full_snapshot() {
    let (_db, mut conn) = pages(20);
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    conn.execute_batch(
        "DROP TRIGGER outboxd_capture_update_pages; UPDATE pages SET title = 'lost' WHERE id = 5",
    )
    .unwrap();
    let report = capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    assert_eq!(report.gaps.len(), 1);
    assert_eq!(
        report.tables[0].reinstalled,
        ["outboxd_capture_update_pages"]
    );
    assert_eq!(capture::open_gaps(&conn).unwrap().len(), 1);
    let filtered = SnapshotOptions {
        filter: Some("id <= 5".into()),
        ..opts(100)
    };
    let s = snapshot::run(&mut conn, "pages", &filtered, |_| true).unwrap();
    assert_eq!(s.rows, 5);
    assert_eq!(
        capture::open_gaps(&conn).unwrap().len(),
        1,
        "a filtered snapshot covers none"
    );
    let s = snapshot::run(&mut conn, "pages", &opts(100), |_| true).unwrap();
    assert_eq!(s.rows, 20);
    assert!(capture::open_gaps(&conn).unwrap().is_empty());
    let g = &capture::gaps(&conn, 10).unwrap()[0];
    assert_eq!(
        g.resolved_by.as_deref(),
        Some(format!("snapshot {}", s.id).as_str())
    );
    let lost = stored_events(&conn)
        .into_iter()
        .filter(|e| e.payload["op"] == "r" && e.payload["key"]["id"] == 5)
        .map(|e| e.payload["after"]["title"].clone())
        .collect::<Vec<Value>>();
    assert_eq!(
        lost,
        [json!("lost"), json!("lost")],
        "the lost edit reached the consumers"
    );
    let bad = SnapshotOptions {
        filter: Some("1); DROP TABLE pages; --".into()),
        ..opts(100)
    };
    assert!(snapshot::start(&mut conn, "pages", &bad, Timestamp::now()).is_err());
    let bad = SnapshotOptions {
        filter: Some("no_such_column = 1".into()),
        ..opts(100)
    };
    let e = snapshot::start(&mut conn, "pages", &bad, Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("no_such_column"), "{e}");
}

/// A table rebuilt mid-snapshot (a migration: its triggers go with the old
/// table) stops the snapshot with a message; a cancelled one stops too, and
/// neither writes a completed marker.
#[test]
fn a_table_rebuilt_mid_snapshot_stops_it_and_cancel_stops_it() {
    let (_db, mut conn) = pages(100);
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let s = snapshot::start(&mut conn, "pages", &opts(10), Timestamp::now()).unwrap();
    snapshot::step(&mut conn, &s.id, &opts(10), Timestamp::now()).unwrap();
    conn.execute_batch(
        "CREATE TABLE pages_new (id INTEGER PRIMARY KEY, title TEXT, live INTEGER NOT NULL DEFAULT 0);
         INSERT INTO pages_new SELECT * FROM pages; DROP TABLE pages;
         ALTER TABLE pages_new RENAME TO pages;",
    )
    .unwrap();
    let e = snapshot::drive(&mut conn, &s.id, &opts(10), &mut |_| true).unwrap_err();
    assert!(e.to_string().contains("rebuilt"), "{e}");
    let s = &snapshot::snapshots(&conn, 1).unwrap()[0];
    assert_eq!(s.state, SnapshotState::Failed);
    // Reinstalled, a new snapshot starts; cancelled, it stops.
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let s = snapshot::start(&mut conn, "pages", &opts(10), Timestamp::now()).unwrap();
    let cancelled = snapshot::cancel(
        &conn,
        &SnapshotSelection::Capture("pages".into()),
        Timestamp::now(),
    )
    .unwrap();
    assert_eq!(cancelled, std::slice::from_ref(&s.id));
    let after = snapshot::step(&mut conn, &s.id, &opts(10), Timestamp::now()).unwrap();
    assert_eq!(after.state, SnapshotState::Cancelled);
    assert_eq!(after.scanned, 0);
    assert!(of_type(&stored_events(&conn), "page.snapshot_completed.v1").is_empty());
    assert!(matches!(
        snapshot::start(&mut conn, "nope", &opts(10), Timestamp::now()),
        Err(Error::NotFound { .. })
    ));
}

/// A WITHOUT ROWID table with a composite key is read in key order, and
/// resumes by its key.
#[test]
fn a_without_rowid_table_is_read_by_its_primary_key() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE tags (site TEXT, slug BLOB, n INTEGER, PRIMARY KEY (site, slug)) WITHOUT ROWID",
    )
    .unwrap();
    for i in 0..77 {
        conn.execute(
            "INSERT INTO tags VALUES (?1, ?2, ?3)",
            rusqlite::params![format!("s{}", i % 3), vec![i as u8, 0xFF], i],
        )
        .unwrap();
    }
    capture::apply(
        &mut conn,
        &[CaptureSpec::new("tags", "tag.{op}.v1", Columns::All)],
        Timestamp::now(),
    )
    .unwrap();
    let s = snapshot::run(&mut conn, "tags", &opts(7), |_| true).unwrap();
    assert_eq!(s.rows, 77);
    let ns: Vec<i64> = stored_events(&conn)
        .iter()
        .filter(|e| e.payload["op"] == "r")
        .map(|e| e.payload["after"]["n"].as_i64().unwrap())
        .collect();
    let mut sorted = ns.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 77, "each row once");
}

/// The sweep recipe of docs/capture.md ("Reconciling after a gap"), run by
/// a `sql` sink with four workers: an index that missed a gap (an orphan
/// for a page deleted meanwhile, a stale title, a page missing) is exact
/// once a snapshot's events are delivered, live changes included.
#[test]
#[cfg(feature = "sinks")]
fn the_sweep_recipe_makes_a_stale_index_exact() {
    let (db, mut conn) = pages(400);
    conn.execute_batch(
        "CREATE TABLE page_index (id INTEGER PRIMARY KEY, title TEXT, snapshot TEXT, touched_at INTEGER);
         CREATE TABLE page_snapshots (id TEXT PRIMARY KEY, started_at INTEGER, expected INTEGER,
                                      seen INTEGER NOT NULL DEFAULT 0, swept INTEGER NOT NULL DEFAULT 0);
         -- What the index held before the gap: every page, two orphans, a
         -- stale title; page 7 missing.
         INSERT INTO page_index (id, title, touched_at) SELECT id, title, 0 FROM pages WHERE id <> 7;
         INSERT INTO page_index (id, title, touched_at) VALUES (9001, 'orphan', 0), (9002, 'orphan', 0);
         UPDATE page_index SET title = 'stale' WHERE id = 5;",
    )
    .unwrap();
    capture::apply(&mut conn, &[spec()], Timestamp::now()).unwrap();
    let statements = [
        "INSERT INTO page_index (id, title, snapshot, touched_at)
         SELECT json_extract(:payload, '$.key.id'), json_extract(:payload, '$.after.title'),
                json_extract(:payload, '$.snapshot_id'), :occurred_at_ms
         WHERE json_extract(:payload, '$.op') IN ('c', 'u', 'r')
         ON CONFLICT (id) DO UPDATE SET title = excluded.title, snapshot = excluded.snapshot,
                                        touched_at = excluded.touched_at",
        "DELETE FROM page_index
         WHERE json_extract(:payload, '$.op') = 'd' AND id = json_extract(:payload, '$.key.id')",
        "INSERT INTO page_snapshots (id, started_at, expected, seen)
         SELECT json_extract(:payload, '$.snapshot_id'), json_extract(:payload, '$.started_at'),
                json_extract(:payload, '$.rows'), json_extract(:payload, '$.op') = 'r'
         WHERE json_extract(:payload, '$.op') IN ('r', 'snapshot_completed')
           AND json_extract(:payload, '$.where') IS NULL
         ON CONFLICT (id) DO UPDATE SET seen = seen + excluded.seen,
             expected = coalesce(excluded.expected, expected),
             started_at = coalesce(excluded.started_at, started_at)",
        "DELETE FROM page_index WHERE EXISTS (
             SELECT 1 FROM page_snapshots s WHERE s.seen = s.expected AND NOT s.swept
                AND page_index.snapshot IS NOT s.id AND page_index.touched_at < s.started_at)",
        "UPDATE page_snapshots SET swept = 1 WHERE seen = expected AND NOT swept",
    ];
    let relay = outboxd::Relay::builder(&db.path)
        .transactional_consumer(
            "index",
            ["page.*.v1"],
            outboxd::sinks::SqlSink::new(statements).unwrap(),
        )
        .workers(4)
        .build()
        .unwrap()
        .start()
        .unwrap();
    let s = snapshot::start(&mut conn, "pages", &opts(25), Timestamp::now()).unwrap();
    let mut i = 0;
    while snapshot::step(&mut conn, &s.id, &opts(25), Timestamp::now())
        .unwrap()
        .state
        == SnapshotState::Running
    {
        i += 1;
        conn.execute_batch(&format!(
            "UPDATE pages SET title = 'live {i}' WHERE id = {};
             DELETE FROM pages WHERE id = {};
             INSERT INTO pages (title) VALUES ('new {i}');",
            (i * 41) % 400 + 1,
            (i * 67) % 400 + 1
        ))
        .unwrap();
    }
    let total: i64 = conn
        .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
        .unwrap();
    common::wait_until(
        "every event delivered",
        std::time::Duration::from_secs(60),
        || {
            conn.query_row(
                "SELECT count(*) FROM delivered_events WHERE consumer = 'index'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                == total
        },
    );
    relay.shutdown(std::time::Duration::from_secs(10)).unwrap();
    let rows = |sql: &str| -> Vec<(i64, String)> {
        conn.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        rows("SELECT id, title FROM page_index ORDER BY id"),
        rows("SELECT id, title FROM pages ORDER BY id"),
        "the index is the table"
    );
}
