//! Capture (src/capture/): the host's own writes become events through
//! triggers. Each test writes through a captured table with plain SQL, as a
//! host would, and reads every outbox row back validated as the relay
//! validates a claimed row (`common::stored_events`).

use crate::common;

use std::time::Duration;

use common::{stored_events, StoredEvent, TestDb};
use outboxd::capture::{
    self, CaptureError, CaptureSpec, Change, Columns, ConfigMatch, Operation, Removal,
    TriggerState, When,
};
use outboxd::{Error, Timestamp};
use rusqlite::Connection;
use serde_json::{json, Value};

/// A migrated database with a small CMS: pages and their comments.
fn cms() -> (TestDb, Connection) {
    let db = TestDb::new();
    let conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE pages (
             id       INTEGER PRIMARY KEY,
             slug     TEXT NOT NULL UNIQUE,
             title    TEXT NOT NULL,
             body     TEXT,
             status   TEXT NOT NULL DEFAULT 'draft',
             site     TEXT,
             password TEXT
         );
         CREATE TABLE comments (
             id      INTEGER PRIMARY KEY,
             page_id INTEGER NOT NULL REFERENCES pages (id),
             author  TEXT,
             body    TEXT NOT NULL
         );",
    )
    .unwrap();
    (db, conn)
}

fn cols(names: &[&str]) -> Columns {
    Columns::List(names.iter().map(|s| s.to_string()).collect())
}

fn pages_spec() -> CaptureSpec {
    CaptureSpec::new("pages", "page.{op}.v1", cols(&["slug", "title", "status"]))
}

fn apply(conn: &mut Connection, specs: &[CaptureSpec]) -> capture::ApplyReport {
    capture::apply(conn, specs, Timestamp::now()).unwrap()
}

fn events(conn: &Connection) -> Vec<StoredEvent> {
    stored_events(conn)
}

fn types(evs: &[StoredEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| e.envelope.event_type.to_string())
        .collect()
}

/// The installed objects whose name starts with outboxd_capture_.
fn installed(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE name LIKE 'outboxd_capture_%' AND type IN ('trigger', 'view') ORDER BY name",
        )
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn inserts_updates_and_deletes_become_events_with_before_and_after() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    let before = Timestamp::now().as_millis();
    conn.execute_batch(
        "INSERT INTO pages (slug, title, password) VALUES ('hello', 'Hello', 'secret-hash');
         UPDATE pages SET title = 'Hello, world' WHERE slug = 'hello';
         DELETE FROM pages WHERE slug = 'hello';",
    )
    .unwrap();
    let after = Timestamp::now().as_millis();
    let evs = events(&conn);
    assert_eq!(
        types(&evs),
        ["page.created.v1", "page.updated.v1", "page.deleted.v1"]
    );
    let created = json!({"slug": "hello", "title": "Hello", "status": "draft"});
    let updated = json!({"slug": "hello", "title": "Hello, world", "status": "draft"});
    assert_eq!(
        evs[0].payload,
        json!({"op": "c", "table": "pages", "key": {"id": 1}, "before": null, "after": created})
    );
    assert_eq!(
        evs[1].payload,
        json!({"op": "u", "table": "pages", "key": {"id": 1}, "before": created, "after": updated})
    );
    assert_eq!(
        evs[2].payload,
        json!({"op": "d", "table": "pages", "key": {"id": 1}, "before": updated, "after": null})
    );
    for e in &evs {
        // A fresh ULID, minted by SQL: its time is the write's. SQL's clock
        // is julianday('now') in days, a float, truncated to milliseconds,
        // so it may read one millisecond behind Rust's clock at the same
        // instant (seen once: 1796097489448 against 1796097489449).
        let ms = e.envelope.event_id.ulid().timestamp_ms() as i64;
        assert!(
            (before - 1..=after).contains(&ms),
            "{ms} outside {before}..{after}"
        );
        assert_eq!(e.envelope.occurred_at.as_millis(), ms);
        assert_eq!(e.ordering_key.as_deref(), Some("pages:1"));
        assert_eq!(e.tenant_id, None);
        // Only the captured columns: never the password hash.
        assert!(!e.envelope.payload.get().contains("secret"));
    }
    let ids: std::collections::BTreeSet<_> = evs.iter().map(|e| e.envelope.event_id).collect();
    assert_eq!(ids.len(), 3, "every event has its own id");
}

#[test]
fn a_rolled_back_write_leaves_no_event_and_a_committed_one_leaves_one() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .unwrap();
    tx.rollback().unwrap();
    assert!(events(&conn).is_empty());
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(types(&events(&conn)), ["page.created.v1"]);
}

#[test]
fn changed_only_skips_updates_that_change_no_captured_column() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    conn.execute_batch(
        "INSERT INTO pages (slug, title) VALUES ('a', 'A');
         UPDATE pages SET body = 'not captured', password = 'x';
         UPDATE pages SET title = 'A';
         UPDATE pages SET title = 'a';",
    )
    .unwrap();
    // Only the last update changed a captured column (case counts).
    assert_eq!(
        types(&events(&conn)),
        ["page.created.v1", "page.updated.v1"]
    );

    let mut spec = pages_spec();
    spec.changed_only = false;
    apply(&mut conn, &[spec]);
    conn.execute("UPDATE pages SET body = 'still not captured'", [])
        .unwrap();
    let evs = events(&conn);
    assert_eq!(evs.len(), 3);
    assert_eq!(evs[2].payload["before"], evs[2].payload["after"]);
}

#[test]
fn when_decides_which_writes_become_events() {
    let (_db, mut conn) = cms();
    let mut spec = pages_spec();
    spec.when = Some(When::PerOperation {
        insert: Some("NEW.status = 'published'".into()),
        update: Some("NEW.status = 'published' OR OLD.status = 'published'".into()),
        delete: Some("OLD.status = 'published'".into()),
    });
    apply(&mut conn, &[spec]);
    conn.execute_batch(
        "INSERT INTO pages (slug, title) VALUES ('draft', 'D');
         INSERT INTO pages (slug, title, status) VALUES ('pub', 'P', 'published');
         UPDATE pages SET title = 'D2' WHERE slug = 'draft';
         UPDATE pages SET status = 'draft' WHERE slug = 'pub';
         DELETE FROM pages;",
    )
    .unwrap();
    let evs = events(&conn);
    assert_eq!(
        types(&evs),
        ["page.created.v1", "page.updated.v1"],
        "{:#?}",
        evs.iter().map(|e| &e.payload).collect::<Vec<_>>()
    );
    assert_eq!(evs[1].payload["after"]["status"], "draft");

    // One condition for every operation must make sense for each.
    let mut spec = pages_spec();
    spec.when = Some(When::All("NEW.status = 'published'".into()));
    let e = capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture(CaptureError::DoesNotCompile {
                operation: Some(Operation::Delete),
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("NEW.status"), "{e}");
    assert!(e.to_string().contains("a delete only OLD"), "{e}");
}

#[test]
fn tenant_column_and_ordering_key_template() {
    let (_db, mut conn) = cms();
    let mut pages = pages_spec();
    pages.tenant_column = Some("site".into());
    let mut comments = CaptureSpec::new("comments", "comment.{op}.v1", cols(&["page_id", "body"]));
    comments.ordering_key = Some("page:{page_id}".into());
    comments.operations = vec![Operation::Insert];
    apply(&mut conn, &[pages, comments]);
    conn.execute_batch(
        "INSERT INTO pages (slug, title, site) VALUES ('a', 'A', 'acme');
         INSERT INTO comments (page_id, body) VALUES (1, 'first');
         INSERT INTO comments (page_id, body) VALUES (1, 'second');
         UPDATE comments SET body = 'edited';",
    )
    .unwrap();
    let evs = events(&conn);
    assert_eq!(
        types(&evs),
        [
            "page.created.v1",
            "comment.created.v1",
            "comment.created.v1"
        ]
    );
    assert_eq!(evs[0].tenant_id.as_deref(), Some("acme"));
    assert_eq!(evs[1].ordering_key.as_deref(), Some("page:1"));
    assert_eq!(evs[2].ordering_key.as_deref(), Some("page:1"));
    assert_eq!(evs[2].tenant_id, None);
}

/// What a single value of each SQLite type becomes in the payload.
#[test]
fn every_sqlite_value_renders_as_json() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v)")
        .unwrap();
    apply(
        &mut conn,
        &[CaptureSpec::new("t", "t.{op}.v1", cols(&["v"]))],
    );
    use rusqlite::types::Value as V;
    let cases: Vec<(V, Value)> = vec![
        (V::Null, json!(null)),
        (V::Integer(0), json!(0)),
        (V::Integer(i64::MAX), json!(i64::MAX)),
        (V::Integer(i64::MIN), json!(i64::MIN)),
        (V::Real(0.1), json!(0.1)),
        (V::Real(-2.5e-300), json!(-2.5e-300)),
        (V::Real(1.0 / 3.0), json!(1.0 / 3.0)),
        (V::Real(1e300), json!(1e300)),
        (V::Real(f64::INFINITY), json!({"$real": "Inf"})),
        (V::Real(f64::NEG_INFINITY), json!({"$real": "-Inf"})),
        (V::Text("plain".into()), json!("plain")),
        (
            V::Text("é “quoted” 日本 🎉".into()),
            json!("é “quoted” 日本 🎉"),
        ),
        (
            V::Text(r#"back\slash "quote" 'single'"#.into()),
            json!(r#"back\slash "quote" 'single'"#),
        ),
        (
            V::Text("tab\tline\nreturn\rff\u{c}bs\u{8}".into()),
            json!("tab\tline\nreturn\rff\u{c}bs\u{8}"),
        ),
        (V::Text("\u{7f} del".into()), json!("\u{7f} del")),
        (V::Text(String::new()), json!("")),
        (V::Blob(vec![]), json!({"$blob": ""})),
        (V::Blob(vec![0, 0xff, 0x10]), json!({"$blob": "00FF10"})),
    ];
    for (i, (v, want)) in cases.iter().enumerate() {
        conn.execute(
            "INSERT INTO t (id, v) VALUES (?1, ?2)",
            rusqlite::params![i as i64, v],
        )
        .unwrap();
        let evs = events(&conn);
        let got = &evs.last().unwrap().payload["after"]["v"];
        assert_eq!(got, want, "{v:?}");
    }
    // Reals read back exactly.
    let evs = events(&conn);
    assert_eq!(evs[6].payload["after"]["v"].as_f64(), Some(1.0 / 3.0));
}

/// Text JSON cannot hold: bytes that are not UTF-8, NUL, a control
/// character outside the five escaped. The change is sent as hex (the
/// JSON text's bytes), and nothing is lost.
#[test]
fn text_json_cannot_hold_sends_the_change_as_hex() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        .unwrap();
    apply(
        &mut conn,
        &[CaptureSpec::new("t", "t.{op}.v1", cols(&["v"]))],
    );
    let cases: Vec<&[u8]> = vec![
        b"caf\xe9 in latin-1",
        b"nul\x00inside",
        b"escape \x1b[1m",
        b"\xc2\x80\x80 one continuation too many",
        b"\xed\xa0\x80 a surrogate",
    ];
    for (i, bytes) in cases.iter().enumerate() {
        conn.execute(
            "INSERT INTO t (id, v) VALUES (?1, CAST(?2 AS TEXT))",
            rusqlite::params![i as i64, bytes],
        )
        .unwrap();
        let evs = events(&conn);
        let p = &evs.last().unwrap().payload;
        assert_eq!(p["op"], "c", "{p}");
        assert_eq!(p["table"], "t");
        let hex = p["payload_hex"].as_str().unwrap_or_else(|| panic!("{p}"));
        let original: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        // The change as JSON text, with the value's bytes as they were
        // (after escaping: quotes, backslashes, five control characters).
        let needle: Vec<u8> = bytes.to_vec();
        assert!(
            original
                .windows(needle.len())
                .any(|w| w == needle.as_slice()),
            "{:?} not in {:?}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&original)
        );
        assert!(original.starts_with(br#"{"op":"c","table":"t","key":{"id":"#));
    }
}

/// A change whose values could make a payload over the capture's
/// `max_payload_bytes` (issue 33, item 4) is sent without its values, its
/// key (and so its ordering key) kept and the columns left out named; a
/// BLOB counts at its hex size and more, text at six bytes a byte, so even
/// the hex form stays under the bound.
#[test]
fn a_change_too_large_to_carry_keeps_its_key_and_names_what_it_left_out() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch("CREATE TABLE files (id INTEGER PRIMARY KEY, name TEXT, data BLOB)")
        .unwrap();
    let mut spec = CaptureSpec::new("files", "file.{op}.v1", cols(&["name", "data"]));
    spec.max_payload_bytes = Some(1_000_000);
    apply(&mut conn, &[spec]);
    // 200 KB of blob is 400 KB of hex: it fits. 300 KB could not (its
    // estimate, 1.2 MB, is over the bound).
    conn.execute(
        "INSERT INTO files (name, data) VALUES ('fits', zeroblob(200000))",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO files (name, data) VALUES ('big', zeroblob(300000))",
        [],
    )
    .unwrap();
    conn.execute("UPDATE files SET name = 'bigger' WHERE id = 2", [])
        .unwrap();
    let evs = events(&conn);
    assert_eq!(
        evs[0].payload["after"]["data"]["$blob"]
            .as_str()
            .unwrap()
            .len(),
        400_000
    );
    assert!(evs[0].payload.get("too_large").is_none());
    assert_eq!(
        evs[1].payload,
        json!({"op": "c", "table": "files", "key": {"id": 2}, "before": null,
               "after": null, "too_large": true, "dropped": ["name", "data"]})
    );
    assert_eq!(evs[1].ordering_key.as_deref(), Some("files:2"));
    assert_eq!(
        evs[2].payload,
        json!({"op": "u", "table": "files", "key": {"id": 2}, "before": null,
               "after": null, "too_large": true, "dropped": ["name", "data"]})
    );
    // Text the fix trigger sends as hex (a NUL) stays under the bound too.
    conn.execute(
        "INSERT INTO files (name) VALUES (CAST(zeroblob(150000) AS TEXT))",
        [],
    )
    .unwrap();
    let stored: Vec<i64> = conn
        .prepare("SELECT length(payload) FROM event_outbox ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(stored.iter().all(|n| *n <= 1_000_000), "{stored:?}");
    // A bound too small for even the too_large form (the columns' names)
    // is refused when applied, naming it.
    let mut tiny = CaptureSpec::new("files", "file.{op}.v1", Columns::All);
    tiny.max_payload_bytes = Some(4096);
    let mut wide = String::from("CREATE TABLE wide (id INTEGER PRIMARY KEY");
    for i in 0..60 {
        wide.push_str(&format!(", column_with_a_rather_long_name_{i} TEXT"));
    }
    conn.execute_batch(&format!("{wide})")).unwrap();
    tiny.table = "wide".into();
    let e = capture::apply(&mut conn, &[tiny], Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("max_payload_bytes"), "{e}");
}

#[test]
fn insert_or_replace_is_a_delete_then_a_create_with_or_without_recursive_triggers() {
    for recursive in [false, true] {
        let (_db, mut conn) = cms();
        apply(&mut conn, &[pages_spec()]);
        conn.pragma_update(None, "recursive_triggers", recursive)
            .unwrap();
        conn.execute_batch(
            "INSERT INTO pages (id, slug, title) VALUES (1, 'a', 'A');
             INSERT INTO pages (id, slug, title) VALUES (2, 'b', 'B');
             INSERT OR REPLACE INTO pages (id, slug, title) VALUES (1, 'a', 'A2');
             REPLACE INTO pages (id, slug, title) VALUES (3, 'b', 'B by slug');",
        )
        .unwrap();
        let evs = events(&conn);
        let summary: Vec<(String, String)> = evs
            .iter()
            .map(|e| {
                (
                    e.payload["op"].as_str().unwrap().to_string(),
                    e.payload["key"]["id"].to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = [
            ("c", "1"),
            ("c", "2"),
            ("d", "1"),
            ("c", "1"),
            ("d", "2"),
            ("c", "3"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(summary, want, "recursive_triggers={recursive}");
        assert_eq!(evs[2].payload["before"]["title"], "A");
        assert_eq!(evs[4].payload["before"]["title"], "B");
        // Each row's events keep its order: the delete before the create.
        assert_eq!(evs[2].ordering_key, evs[3].ordering_key);
        let scratch: i64 = conn
            .query_row("SELECT count(*) FROM outboxd_capture_replaced", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(scratch, 0, "nothing is left behind");
    }
}

#[test]
fn a_write_that_replaces_nothing_makes_only_its_own_event() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    conn.execute_batch(
        "INSERT INTO pages (id, slug, title) VALUES (1, 'a', 'A');
         INSERT OR IGNORE INTO pages (id, slug, title) VALUES (1, 'a', 'ignored');
         INSERT INTO pages (slug, title) VALUES ('b', 'B')
             ON CONFLICT (slug) DO UPDATE SET title = excluded.title;
         INSERT INTO pages (slug, title) VALUES ('a', 'A by upsert')
             ON CONFLICT (slug) DO UPDATE SET title = excluded.title;",
    )
    .unwrap();
    // A plain INSERT that conflicts fails, and leaves no event either.
    assert!(conn
        .execute(
            "INSERT INTO pages (id, slug, title) VALUES (1, 'x', 'X')",
            []
        )
        .is_err());
    let evs = events(&conn);
    let ops: Vec<&str> = evs
        .iter()
        .map(|e| e.payload["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        ["c", "c", "u"],
        "{:#?}",
        evs.iter().map(|e| &e.payload).collect::<Vec<_>>()
    );
    assert_eq!(evs[2].payload["after"]["title"], "A by upsert");
    // The stale note of the ignored insert is not turned into an event by
    // a later write.
    conn.execute("INSERT INTO pages (slug, title) VALUES ('c', 'C')", [])
        .unwrap();
    assert_eq!(events(&conn).len(), 4);
}

#[test]
fn update_or_replace_reports_the_row_it_deletes() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    conn.execute_batch(
        "INSERT INTO pages (id, slug, title) VALUES (1, 'a', 'A'), (2, 'b', 'B');
         UPDATE OR REPLACE pages SET slug = 'b' WHERE id = 1;",
    )
    .unwrap();
    let evs = events(&conn);
    let ops: Vec<(String, Value)> = evs
        .iter()
        .map(|e| {
            (
                e.payload["op"].as_str().unwrap().to_string(),
                e.payload["key"]["id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            ("c".into(), json!(1)),
            ("c".into(), json!(2)),
            ("d".into(), json!(2)),
            ("u".into(), json!(1))
        ]
    );
}

#[test]
fn bulk_deletes_and_updates_make_one_event_per_row() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    let tx = conn.transaction().unwrap();
    for i in 0..200 {
        tx.execute(
            "INSERT INTO pages (slug, title) VALUES (?1, 'T')",
            [format!("p{i}")],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    conn.execute("UPDATE pages SET status = 'published' WHERE id % 2 = 0", [])
        .unwrap();
    conn.execute("DELETE FROM pages", []).unwrap();
    let evs = events(&conn);
    let count = |op: &str| evs.iter().filter(|e| e.payload["op"] == op).count();
    assert_eq!((count("c"), count("u"), count("d")), (200, 100, 200));
}

#[test]
fn without_rowid_composite_keys_and_generated_columns() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE tags (
             page_id INTEGER NOT NULL,
             tag     TEXT NOT NULL COLLATE NOCASE,
             weight  REAL,
             label   TEXT GENERATED ALWAYS AS (upper(tag)) VIRTUAL,
             score   REAL GENERATED ALWAYS AS (weight * 2) STORED,
             PRIMARY KEY (page_id, tag)
         ) WITHOUT ROWID;
         CREATE TABLE log (msg TEXT);",
    )
    .unwrap();
    apply(
        &mut conn,
        &[
            CaptureSpec::new("tags", "tag.{op}.v1", Columns::All),
            CaptureSpec::new("log", "log.{op}.v1", Columns::All),
        ],
    );
    conn.execute_batch(
        "INSERT INTO tags (page_id, tag, weight) VALUES (1, 'news', 0.5);
         UPDATE tags SET weight = 1.5;
         INSERT OR REPLACE INTO tags (page_id, tag, weight) VALUES (1, 'NEWS', 2.0);
         DELETE FROM tags;
         INSERT INTO log (msg) VALUES ('a'), ('b');
         DELETE FROM log WHERE msg = 'a';",
    )
    .unwrap();
    let evs = events(&conn);
    let p: Vec<&Value> = evs.iter().map(|e| &e.payload).collect();
    assert_eq!(
        p[0],
        &json!({"op": "c", "table": "tags", "key": {"page_id": 1, "tag": "news"}, "before": null,
                "after": {"page_id": 1, "tag": "news", "weight": 0.5, "label": "NEWS", "score": 1.0}})
    );
    assert_eq!(p[1]["after"]["score"], 3.0);
    // The REPLACE matched 'news' through the NOCASE key: a delete, then a create.
    assert_eq!(
        (p[2]["op"].as_str(), &p[2]["key"]["tag"]),
        (Some("d"), &json!("news"))
    );
    assert_eq!(
        (p[3]["op"].as_str(), &p[3]["key"]["tag"]),
        (Some("c"), &json!("NEWS"))
    );
    assert_eq!(p[4]["op"], "d");
    assert_eq!(evs[0].ordering_key.as_deref(), Some("tags:1:news"));
    // A table without a primary key is keyed by its rowid.
    assert_eq!(
        p[5],
        &json!({"op": "c", "table": "log", "key": {"rowid": 1}, "before": null, "after": {"msg": "a"}})
    );
    assert_eq!(p[7]["op"], "d");
    assert_eq!(p[7]["key"], json!({"rowid": 1}));
}

#[test]
fn names_that_do_not_exist_are_errors_naming_them_and_nothing_changes() {
    let (_db, mut conn) = cms();
    let mut bad = Vec::new();
    bad.push((CaptureSpec::new("nope", "x.{op}.v1", Columns::All), "nope"));
    bad.push((
        CaptureSpec::new("pages", "page.{op}.v1", cols(&["title", "titel"])),
        "titel",
    ));
    let mut s = pages_spec();
    s.key = Some(vec!["slugg".into()]);
    bad.push((s, "slugg"));
    let mut s = pages_spec();
    s.tenant_column = Some("tenant".into());
    bad.push((s, "tenant"));
    let mut s = pages_spec();
    s.ordering_key = Some("{nope_col}".into());
    bad.push((s, "nope_col"));
    let mut s = pages_spec();
    s.when = Some(When::All("NEW.nope = 1".into()));
    s.operations = vec![Operation::Insert];
    bad.push((s, "nope"));
    let mut s = pages_spec();
    s.key = Some(vec!["title".into()]);
    bad.push((s, "not unique"));
    bad.push((
        CaptureSpec::new("pages", "Page.{op}.v1", Columns::All),
        "Page.created.v1",
    ));
    bad.push((
        CaptureSpec::new("event_outbox", "x.{op}.v1", Columns::All),
        "outboxd's own",
    ));
    for (spec, needle) in bad {
        // A good capture first in the same call: it must not be installed.
        let e = capture::apply(
            &mut conn,
            &[
                CaptureSpec::new("comments", "comment.{op}.v1", Columns::All),
                spec.clone(),
            ],
            Timestamp::now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains(needle), "{spec:?}: {e}");
        assert!(
            installed(&conn).is_empty(),
            "{spec:?} left {:?}",
            installed(&conn)
        );
        assert!(capture::inspect(&conn).unwrap().is_empty());
    }
    let mut named = pages_spec();
    named.name = Some("x".into());
    let e = capture::apply(&mut conn, &[named.clone(), named], Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("the name \"x\" is taken"), "{e}");
}

/// A `when` is pasted into trigger SQL: text that is not one condition
/// (it ends the trigger and adds statements of its own) is refused before
/// anything runs, and no statement of it ever runs.
#[test]
fn a_when_that_is_not_one_condition_is_refused_and_runs_nothing() {
    let (_db, mut conn) = cms();
    conn.execute_batch("CREATE TABLE victim (x); INSERT INTO victim VALUES (1);")
        .unwrap();
    let hostile = [
        // Ends the WHEN, finishes a trigger, drops a table, and starts a
        // trigger that the generated rest of the SQL completes.
        "1) BEGIN SELECT 1; END; DROP TABLE victim; \
         CREATE TRIGGER sneaky AFTER INSERT ON pages WHEN (1",
        // Valid as the SELECT the check compiles, followed by a statement.
        "1) FROM pages AS new; DROP TABLE victim; SELECT (1",
        "NEW.id > 0; DELETE FROM victim",
        // Swallows the closing parenthesis the trigger adds.
        "NEW.id > 0 /*",
        "NEW.id > 0 -- a note",
        "NEW.slug = 'a",
        "NEW.id) OR (1",
    ];
    for when in hostile {
        let mut spec = pages_spec();
        spec.operations = vec![Operation::Insert];
        spec.when = Some(When::PerOperation {
            insert: Some(when.into()),
            update: None,
            delete: None,
        });
        let e = capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Capture(CaptureError::Invalid {
                    field: "when.insert",
                    ..
                })
            ),
            "{when:?}: {e}"
        );
        assert!(e.to_string().contains("when.insert"), "{e}");
        assert!(
            installed(&conn).is_empty(),
            "{when:?} left {:?}",
            installed(&conn)
        );
        let victims: i64 = conn
            .query_row("SELECT count(*) FROM victim", [], |r| r.get(0))
            .unwrap();
        assert_eq!(victims, 1, "{when:?} ran a statement of its own");
    }
    // The same text for an operation that is not captured is refused too:
    // it is recorded with the capture and would be installed by a later
    // change of `operations`.
    let mut spec = pages_spec();
    spec.operations = vec![Operation::Insert];
    spec.when = Some(When::PerOperation {
        insert: None,
        update: None,
        delete: Some(hostile[0].into()),
    });
    let e = capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("when.delete"), "{e}");
    // Parentheses, semicolons and comment marks inside strings, quoted
    // names and closed comments are fine.
    let mut spec = pages_spec();
    spec.when = Some(When::All(
        "/* ; ) */ (SELECT count(*) FROM victim WHERE x <> ';)--') >= 0".into(),
    ));
    apply(&mut conn, &[spec]);
    conn.execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .unwrap();
    assert_eq!(types(&events(&conn)), ["page.created.v1"]);
}

/// Every name capture writes into SQL comes from the host's schema, so a
/// table or column may be called anything: each is quoted as an
/// identifier or a string, never pasted raw.
#[test]
fn hostile_table_and_column_names_are_quoted_everywhere() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let table = "we\"ird'; DROP TABLE victim; --";
    let col = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let key = "k\"; DROP TABLE victim; --";
    let tenant = "t'); DROP TABLE victim; --";
    let value = "v]) /* ; */ --";
    conn.execute_batch(&format!(
        "CREATE TABLE victim (x); INSERT INTO victim VALUES (1);
         CREATE TABLE {} ({} TEXT PRIMARY KEY, {} TEXT, {} TEXT, UNIQUE ({}));",
        col(table),
        col(key),
        col(tenant),
        col(value),
        col(value),
    ))
    .unwrap();
    let mut spec = CaptureSpec::new(table, "thing.{op}.v1", Columns::All);
    spec.tenant_column = Some(tenant.into());
    spec.ordering_key = Some(format!("it's {{{value}}}; --"));
    spec.when = Some(When::PerOperation {
        insert: Some(format!("NEW.{} <> 'x'", col(value))),
        update: None,
        delete: Some(format!("OLD.{} <> 'x'", col(value))),
    });
    apply(&mut conn, &[spec]);
    conn.execute_batch(&format!(
        "INSERT INTO {t} VALUES ('a', 'acme', 'one');
         UPDATE {t} SET {v} = 'two';
         INSERT OR REPLACE INTO {t} VALUES ('b', 'acme', 'two');
         DELETE FROM {t};",
        t = col(table),
        v = col(value),
    ))
    .unwrap();
    let evs = events(&conn);
    assert_eq!(
        types(&evs),
        [
            "thing.created.v1",
            "thing.updated.v1",
            "thing.deleted.v1",
            "thing.created.v1",
            "thing.deleted.v1"
        ]
    );
    assert_eq!(evs[0].payload["table"], table);
    assert_eq!(evs[0].payload["key"], json!({ key: "a" }));
    assert_eq!(evs[0].payload["after"][value], "one");
    assert_eq!(evs[0].tenant_id.as_deref(), Some("acme"));
    assert_eq!(evs[0].ordering_key.as_deref(), Some("it's one; --"));
    let victims: i64 = conn
        .query_row("SELECT count(*) FROM victim", [], |r| r.get(0))
        .unwrap();
    assert_eq!(victims, 1);
    assert!(capture::inspect(&conn).unwrap()[0].is_intact());
    capture::remove(&mut conn, &Removal::Table(table.into())).unwrap();
    assert!(installed(&conn).is_empty());
}

/// Regression (review of issue 14): with names `outboxd_capture_<table>_<kind>`
/// the REPLACE trigger of `pages` (`…_pages_before_insert`) was the insert
/// trigger of `pages_before`.
#[test]
fn two_tables_never_share_a_trigger_name() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT);
         CREATE TABLE pages_before (id INTEGER PRIMARY KEY, title TEXT);",
    )
    .unwrap();
    let pages = CaptureSpec::new("pages", "page.{op}.v1", Columns::All);
    let mut before = CaptureSpec::new("pages_before", "before.{op}.v1", Columns::All);
    before.operations = vec![Operation::Insert];
    apply(&mut conn, &[pages, before]);
    let names = installed(&conn);
    let mut unique = names.clone();
    unique.dedup();
    assert_eq!(names, unique);
    assert!(capture::inspect(&conn)
        .unwrap()
        .iter()
        .all(|c| c.is_intact()));
    conn.execute_batch(
        "INSERT INTO pages (title) VALUES ('p');
         INSERT INTO pages_before (title) VALUES ('b');
         INSERT OR REPLACE INTO pages (id, title) VALUES (1, 'p2');",
    )
    .unwrap();
    assert_eq!(
        types(&events(&conn)),
        [
            "page.created.v1",
            "before.created.v1",
            "page.deleted.v1",
            "page.created.v1"
        ]
    );
}

/// A host trigger that has the name a capture trigger would get is named
/// in the error, and nothing is installed.
#[test]
fn a_host_trigger_with_a_capture_triggers_name_is_an_error() {
    let (_db, mut conn) = cms();
    conn.execute_batch(
        "CREATE TRIGGER outboxd_capture_insert_pages AFTER INSERT ON comments BEGIN SELECT 1; END",
    )
    .unwrap();
    let e = capture::apply(&mut conn, &[pages_spec()], Timestamp::now()).unwrap_err();
    assert!(
        matches!(&e, Error::Capture(CaptureError::NameTaken { name, on, .. })
            if name == "outboxd_capture_insert_pages" && on == "comments"),
        "{e}"
    );
    assert_eq!(
        installed(&conn),
        ["outboxd_capture_insert_pages"],
        "only the host's"
    );
    assert!(capture::inspect(&conn).unwrap().is_empty());
}

/// Triggers recorded under the names an earlier build gave them
/// (`outboxd_capture_<table>_<kind>`) are still checked for drift by the
/// names recorded, are reported as differing from the config, and `capture
/// apply` replaces them with the current names.
#[test]
fn triggers_installed_under_the_earlier_names_are_checked_and_renamed_by_apply() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    // Rename every trigger of pages as the earlier naming had it.
    let objects: Vec<(String, String)> = {
        let mut stmt = conn
            .prepare("SELECT name, sql FROM outboxd_capture_object WHERE capture_name = 'pages'")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(objects.len(), 5);
    for (name, sql) in &objects {
        let kind = name
            .strip_prefix("outboxd_capture_")
            .unwrap()
            .strip_suffix("_pages")
            .unwrap();
        let old = format!("outboxd_capture_pages_{kind}");
        let old_sql = sql.replacen(&format!("\"{name}\""), &format!("\"{old}\""), 1);
        assert_ne!(&old_sql, sql);
        conn.execute_batch(&format!("DROP TRIGGER \"{name}\""))
            .unwrap();
        conn.execute(&old_sql, []).unwrap();
        conn.execute(
            "UPDATE outboxd_capture_object SET name = ?1, sql = ?2 WHERE name = ?3",
            [&old, &old_sql, name],
        )
        .unwrap();
    }
    let status = capture::inspect(&conn).unwrap();
    assert!(status[0].is_intact(), "{status:?}");
    conn.execute_batch("DROP TRIGGER outboxd_capture_pages_update")
        .unwrap();
    let status = capture::inspect(&conn).unwrap();
    assert_eq!(status[0].missing(), ["outboxd_capture_pages_update"]);
    assert!(matches!(
        capture::compare(&conn, &[pages_spec()]).unwrap()[0].state,
        ConfigMatch::Differs { .. }
    ));
    let report = apply(&mut conn, &[pages_spec()]);
    assert_eq!(report.tables[0].change, Change::Updated);
    let names = installed(&conn);
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with("outboxd_capture_pages_")),
        "{names:?}"
    );
    assert!(
        names.contains(&"outboxd_capture_update_pages".to_string()),
        "{names:?}"
    );
    assert!(capture::inspect(&conn).unwrap()[0].is_intact());
}

#[test]
fn views_and_virtual_tables_cannot_be_captured() {
    let (_db, mut conn) = cms();
    conn.execute_batch(
        "CREATE VIEW published AS SELECT * FROM pages WHERE status = 'published';
         CREATE VIRTUAL TABLE search USING fts5(body);",
    )
    .unwrap();
    for (table, needle) in [("published", "view"), ("search", "virtual")] {
        let e = capture::apply(
            &mut conn,
            &[CaptureSpec::new(table, "x.{op}.v1", Columns::All)],
            Timestamp::now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn apply_is_idempotent_updates_in_place_and_remove_takes_everything_away() {
    let (_db, mut conn) = cms();
    let report = apply(&mut conn, &[pages_spec()]);
    assert_eq!(report.tables[0].change, Change::Installed);
    let first = installed(&conn);
    assert!(first.contains(&"outboxd_capture_event".to_string()));
    let report = apply(&mut conn, &[pages_spec()]);
    assert!(report.unchanged());
    assert_eq!(installed(&conn), first);

    let mut spec = pages_spec();
    spec.operations = vec![Operation::Insert, Operation::Update];
    let report = apply(
        &mut conn,
        &[
            spec,
            CaptureSpec::new("comments", "comment.{op}.v1", Columns::All),
        ],
    );
    assert_eq!(report.tables[0].change, Change::Updated);
    assert_eq!(report.tables[1].change, Change::Installed);
    assert!(!installed(&conn).contains(&"outboxd_capture_delete_pages".to_string()));
    conn.execute_batch("INSERT INTO pages (slug, title) VALUES ('a', 'A'); DELETE FROM pages;")
        .unwrap();
    assert_eq!(types(&events(&conn)), ["page.created.v1"]);

    let removed = capture::remove(&mut conn, &Removal::Table("PAGES".into())).unwrap();
    assert_eq!(removed.tables, ["pages"]);
    assert!(installed(&conn).iter().all(|n| !n.contains("pages")));
    assert!(installed(&conn).contains(&"outboxd_capture_event".to_string()));
    let e = capture::remove(&mut conn, &Removal::Table("pages".into())).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    capture::remove(&mut conn, &Removal::All).unwrap();
    assert!(installed(&conn).is_empty());
    conn.execute_batch(
        "INSERT INTO pages (id, slug, title) VALUES (1, 'b', 'B');
         INSERT INTO comments (page_id, body) VALUES (1, 'x');",
    )
    .unwrap();
    assert_eq!(events(&conn).len(), 1, "no capture left");
}

#[test]
fn a_table_rebuilt_by_a_migration_is_reported_and_apply_restores_it() {
    let (_db, mut conn) = cms();
    let verified_early = Timestamp::now();
    apply(&mut conn, &[pages_spec()]);
    conn.execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .unwrap();
    assert!(capture::inspect(&conn).unwrap()[0].is_intact());
    // What Django, Rails and Alembic do to alter a SQLite table.
    conn.execute_batch(
        "CREATE TABLE new_pages (id INTEGER PRIMARY KEY, slug TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
             body TEXT, status TEXT NOT NULL DEFAULT 'draft', site TEXT, password TEXT, views INTEGER NOT NULL DEFAULT 0);
         INSERT INTO new_pages (id, slug, title, body, status, site, password)
             SELECT id, slug, title, body, status, site, password FROM pages;
         DROP TABLE pages;
         ALTER TABLE new_pages RENAME TO pages;",
    )
    .unwrap();
    conn.execute("INSERT INTO pages (slug, title) VALUES ('lost', 'L')", [])
        .unwrap();
    let status = &capture::inspect(&conn).unwrap()[0];
    assert!(!status.is_intact());
    assert!(!status.breaks_writes());
    assert!(status
        .objects
        .iter()
        .any(|o| o.name == "outboxd_capture_insert_pages" && o.state == TriggerState::Missing));
    let problem = status
        .problem(Timestamp::now().plus(Duration::from_secs(90)))
        .unwrap();
    assert!(problem.contains("missing"), "{problem}");
    assert!(problem.contains("were not captured"), "{problem}");
    assert!(
        problem.contains("capture snapshot --capture pages"),
        "{problem}"
    );
    assert!(
        problem.contains("(1m") || problem.contains("(9"),
        "{problem}"
    );
    assert!(status.verified_at >= verified_early);
    assert_eq!(
        status.newest_event_at.map(|t| t.as_millis()),
        Some(events(&conn)[0].envelope.occurred_at.as_millis())
    );
    // mark_verified records an observation: forward only, and nothing for
    // a table without a capture.
    let earlier = status.verified_at.minus(Duration::from_secs(60));
    let later = status.verified_at.plus(Duration::from_secs(60));
    let seen = |t: Timestamp| vec![("pages".to_string(), t), ("nope".to_string(), t)];
    assert_eq!(
        capture::mark_verified(&mut conn, &seen(earlier)).unwrap(),
        0
    );
    assert_eq!(
        capture::inspect(&conn).unwrap()[0].verified_at,
        status.verified_at
    );
    assert_eq!(capture::mark_verified(&mut conn, &seen(later)).unwrap(), 1);
    assert_eq!(capture::inspect(&conn).unwrap()[0].verified_at, later);

    // The config still matches what was installed, but it is not installed.
    let report = apply(&mut conn, &[pages_spec()]);
    assert_eq!(report.tables[0].change, Change::Updated);
    assert!(capture::inspect(&conn).unwrap()[0].is_intact());
    conn.execute("INSERT INTO pages (slug, title) VALUES ('next', 'N')", [])
        .unwrap();
    let evs = events(&conn);
    assert_eq!(
        evs.len(),
        2,
        "the write made while missing is lost; the next is captured"
    );
    assert_eq!(evs[1].payload["after"]["slug"], "next");
}

#[test]
fn alter_table_renames_are_reported_as_changed_not_lost() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    conn.execute_batch("ALTER TABLE pages RENAME COLUMN title TO heading")
        .unwrap();
    let status = &capture::inspect(&conn).unwrap()[0];
    let problem = status.problem(Timestamp::now()).unwrap();
    assert!(problem.contains("rewritten"), "{problem}");
    assert!(problem.contains("still capture"), "{problem}");
    conn.execute_batch("ALTER TABLE pages RENAME TO articles")
        .unwrap();
    let problem = capture::inspect(&conn).unwrap()[0]
        .problem(Timestamp::now())
        .unwrap();
    assert!(problem.contains("renamed to articles"), "{problem}");
    // Dropping a captured column fails while the capture is installed
    // (SQLite checks the triggers): the docs say to drop the capture first.
    let e = conn
        .execute_batch("ALTER TABLE articles DROP COLUMN status")
        .unwrap_err();
    assert!(e.to_string().contains("_pages after drop column"), "{e}");
}

#[test]
fn a_missing_event_view_is_reported_as_breaking_the_hosts_writes() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    conn.execute_batch("DROP VIEW outboxd_capture_event")
        .unwrap();
    let status = &capture::inspect(&conn).unwrap()[0];
    assert!(status.breaks_writes());
    assert!(status.problem(Timestamp::now()).unwrap().contains("FAIL"));
    // As the report says: the host's write fails.
    assert!(conn
        .execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .is_err());
    apply(&mut conn, &[pages_spec()]);
    conn.execute("INSERT INTO pages (slug, title) VALUES ('a', 'A')", [])
        .unwrap();
}

#[test]
fn compare_says_how_a_config_differs_from_what_is_installed() {
    let (_db, mut conn) = cms();
    apply(&mut conn, &[pages_spec()]);
    let mut changed = pages_spec();
    changed.columns = cols(&["title"]);
    let star = CaptureSpec::new("comments", "comment.{op}.v1", Columns::All);
    let missing_col = CaptureSpec::new("pages", "page.{op}.v1", cols(&["nope"]));
    let by_table = |conn: &Connection, specs: &[CaptureSpec]| -> Vec<(String, ConfigMatch)> {
        capture::compare(conn, specs)
            .unwrap()
            .into_iter()
            .map(|c| (c.table, c.state))
            .collect()
    };
    assert_eq!(
        by_table(&conn, &[pages_spec()]),
        [("pages".into(), ConfigMatch::Matches)]
    );
    assert!(matches!(
        by_table(&conn, &[changed])[0].1,
        ConfigMatch::Differs { .. }
    ));
    assert!(
        matches!(by_table(&conn, &[missing_col])[0].1, ConfigMatch::Invalid { ref error } if error.contains("nope"))
    );
    let both = by_table(&conn, std::slice::from_ref(&star));
    assert_eq!(both[0], ("comments".into(), ConfigMatch::NotInstalled));
    assert_eq!(both[1], ("pages".into(), ConfigMatch::NotInConfig));
    // "*" follows the table: a column added later makes the config differ.
    apply(&mut conn, std::slice::from_ref(&star));
    conn.execute_batch("ALTER TABLE comments ADD COLUMN rating INTEGER")
        .unwrap();
    let c = by_table(&conn, &[star]);
    assert!(
        matches!(&c[0].1, ConfigMatch::Differs { reason } if reason.contains("table changed")),
        "{c:?}"
    );
}

#[test]
fn foreign_key_cascades_are_captured_like_any_delete() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "PRAGMA foreign_keys = ON;
         CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT);
         CREATE TABLE comments (id INTEGER PRIMARY KEY,
             page_id INTEGER REFERENCES pages (id) ON DELETE CASCADE, body TEXT);",
    )
    .unwrap();
    apply(
        &mut conn,
        &[CaptureSpec::new(
            "comments",
            "comment.{op}.v1",
            cols(&["body"]),
        )],
    );
    conn.execute_batch(
        "INSERT INTO pages (id, title) VALUES (1, 'P');
         INSERT INTO comments (page_id, body) VALUES (1, 'a'), (1, 'b');
         DELETE FROM pages;",
    )
    .unwrap();
    assert_eq!(
        types(&events(&conn)),
        [
            "comment.created.v1",
            "comment.created.v1",
            "comment.deleted.v1",
            "comment.deleted.v1"
        ]
    );
}
