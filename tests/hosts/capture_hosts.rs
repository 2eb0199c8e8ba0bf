//! Capture with real hosts that know nothing of outboxd: Python's sqlite3
//! and PHP's PDO write to their own tables with the system's SQLite (3.40
//! on Debian 12, not the SQLite outboxd embeds), and the triggers turn the
//! writes into events; three writer processes at once while `outboxd run`
//! delivers. (Django: tests/hosts/capture_django.rs.)
//!
//! python3 and php (php-sqlite3) must be installed; `.ci/run` installs php.
//! Outside CI a missing interpreter skips its test.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::bin::Outboxd;
use common::{available, stored_events, wait_until, TestDb};
use outboxd::capture::{self, CaptureSpec, Columns};
use outboxd::Timestamp;
use serde_json::{json, Value};

fn script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/contract")
        .join(name)
}

fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("no JSON report ({e}): {text}"))
}

#[test]
fn python_on_the_systems_sqlite_writes_every_kind_of_value() {
    if !available("python3", &["--version"]) {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch("CREATE TABLE things (id INTEGER PRIMARY KEY, v)")
        .unwrap();
    capture::apply(
        &mut conn,
        &[CaptureSpec::new("things", "thing.{op}.v1", Columns::All)],
        Timestamp::now(),
    )
    .unwrap();
    let before = Timestamp::now().as_millis();
    let r = report(&run(
        "python3",
        &[
            script("capture_host.py").to_str().unwrap(),
            db.path.to_str().unwrap(),
            "values",
        ],
    ));
    let after = Timestamp::now().as_millis();
    eprintln!("python's SQLite: {}", r["sqlite_version"]);
    // Every event is one the relay accepts (stored_events checks).
    let evs = stored_events(&conn);
    let inserts = r["inserts"].as_u64().unwrap() as usize;
    let deleted = r["deleted"].as_u64().unwrap() as usize;
    let ops: Vec<&str> = evs
        .iter()
        .map(|e| e.payload["op"].as_str().unwrap())
        .collect();
    let mut want = vec!["c"; inserts];
    want.extend(["u", "u", "u", "d", "c", "u"]);
    want.extend(vec!["d"; deleted]);
    assert_eq!(ops, want);
    let after_v = |i: usize| &evs[i].payload["after"]["v"];
    assert_eq!(after_v(0), &json!(null));
    assert_eq!(after_v(2), &json!(i64::MIN));
    assert_eq!(after_v(6), &json!({"$real": "Inf"}));
    assert_eq!(after_v(9), &json!("é “quoted” 日本 🎉"));
    assert_eq!(after_v(11), &json!("tab\tline\nreturn\r"));
    assert_eq!(after_v(12), &json!({"$blob": "00FF20626C6F62"}));
    for e in &evs[inserts - 3..inserts] {
        assert!(e.payload["payload_hex"].is_string(), "{}", e.payload);
    }
    // The ULIDs were minted by the host's SQLite, at the time of the write.
    for e in &evs {
        let ms = e.envelope.event_id.ulid().timestamp_ms() as i64;
        assert!((before..=after).contains(&ms), "{ms}");
    }
    let ids: BTreeSet<_> = evs.iter().map(|e| e.envelope.event_id).collect();
    assert_eq!(ids.len(), evs.len());
}

#[test]
fn php_pdo_a_rolled_back_transaction_leaves_no_event_a_committed_one_leaves_one() {
    if !available("php", &["--version"]) {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE pages (id INTEGER PRIMARY KEY, slug TEXT UNIQUE, title TEXT, body TEXT)",
    )
    .unwrap();
    let spec = CaptureSpec::new(
        "pages",
        "page.{op}.v1",
        Columns::List(vec!["slug".into(), "title".into(), "body".into()]),
    );
    capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap();
    let r = report(&run(
        "php",
        &[
            script("capture_host.php").to_str().unwrap(),
            db.path.to_str().unwrap(),
        ],
    ));
    eprintln!("PHP's SQLite: {}", r["sqlite_version"]);
    assert_eq!(r["pages"], 1);
    let evs = stored_events(&conn);
    assert_eq!(
        evs.len(),
        1,
        "{:?}",
        evs.iter().map(|e| &e.payload).collect::<Vec<_>>()
    );
    assert_eq!(evs[0].envelope.event_type.as_str(), "page.created.v1");
    assert_eq!(
        evs[0].payload["after"],
        json!({"slug": "hello", "title": "Hello from PHP", "body": "Grüße, \"quoted\"\nand a new line"})
    );
}

#[test]
fn three_writer_processes_every_committed_change_delivered_once_in_order_per_row() {
    if !available("python3", &["--version"]) {
        return;
    }
    let db = TestDb::new();
    db.conn()
        .execute_batch(
            "CREATE TABLE pages (slug TEXT PRIMARY KEY, title TEXT, rev INTEGER);
             CREATE TABLE comments (id INTEGER PRIMARY KEY, page_slug TEXT, body TEXT);",
        )
        .unwrap();
    let out = db.file("events.jsonl");
    let config = db.write(
        "outboxd.toml",
        &format!(
            r#"database = "app.db"
[relay]
poll_interval = "5ms"

[[consumer]]
name = "feed"
types = ["*"]
[consumer.sink]
kind = "jsonl"
path = "{}"

[[capture]]
table = "pages"
event_type = "page.{{op}}.v1"
columns = ["title", "rev"]

[[capture]]
table = "comments"
operations = ["insert"]
event_type = "comment.{{op}}.v1"
columns = ["page_slug", "body"]
ordering_key = "page:{{page_slug}}"
"#,
            out.display()
        ),
    );
    let config = config.to_str().unwrap();
    let outboxd = Outboxd::on(&db.path);
    outboxd.ok(&["capture", "apply", "--config", config]);
    let mut run = outboxd.spawn(&["run", "--config", config]);
    run.wait_started();
    const PER_WRITER: usize = 60;
    let writers: Vec<Child> = (0..3)
        .map(|n| {
            Command::new("python3")
                .arg(script("capture_host.py"))
                .arg(&db.path)
                .args(["writer", &n.to_string(), &PER_WRITER.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // What each writer committed, in its commit order, per page.
    let mut committed: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let mut comments = 0;
    for w in writers {
        let o = w.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for line in String::from_utf8(o.stdout).unwrap().lines() {
            let c: Value = serde_json::from_str(line).unwrap();
            let op = c["op"].as_str().unwrap().to_string();
            if op == "c" {
                comments += 1;
            }
            committed
                .entry(c["slug"].as_str().unwrap().to_string())
                .or_default()
                .push((op, c["rev"].as_i64().unwrap()));
        }
    }
    let total = 3 * PER_WRITER + comments;
    let delivered = || -> Vec<Value> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    wait_until(
        "every captured change delivered",
        Duration::from_secs(60),
        || {
            run.assert_alive();
            delivered().len() >= total
        },
    );
    let envelopes = delivered();
    assert_eq!(envelopes.len(), total, "no change delivered twice");
    let ids: BTreeSet<&str> = envelopes
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), total, "every event id once");
    // Per page, the delivered changes are the committed ones, in order.
    let mut seen: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let mut comment_pages = BTreeSet::new();
    for e in &envelopes {
        let p = &e["payload"];
        match e["event_type"].as_str().unwrap() {
            "comment.created.v1" => {
                comment_pages.insert(p["after"]["page_slug"].as_str().unwrap().to_string());
            }
            _ => {
                let slug = p["key"]["slug"].as_str().unwrap().to_string();
                let image = if p["op"] == "d" {
                    &p["before"]
                } else {
                    &p["after"]
                };
                seen.entry(slug).or_default().push((
                    p["op"].as_str().unwrap().to_string(),
                    image["rev"].as_i64().unwrap(),
                ));
            }
        }
    }
    assert_eq!(seen, committed);
    assert_eq!(comment_pages.len(), comments);
}

/// Issue 30, item 8: a host that lowers SQLITE_LIMIT_LENGTH (here Python's
/// sqlite3 to 1,000,000 bytes) updates a 400 KB blob in a captured table.
/// The trigger's payload would be twice that in hex, twice again with
/// `before` and `after`: with the capture's `max_payload_bytes` set below
/// the host's limit, as docs/capture.md tells such hosts, the trigger sends
/// the key without the values (`too_large`, naming the columns) and the
/// host's own write succeeds.
#[test]
fn a_host_with_a_lowered_length_limit_keeps_its_writes_under_capture() {
    if !available("python3", &["--version"]) {
        return;
    }
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE files (id INTEGER PRIMARY KEY, name TEXT, data BLOB);
         INSERT INTO files (name, data) VALUES ('f', zeroblob(10));",
    )
    .unwrap();
    let mut spec = CaptureSpec::new(
        "files",
        "file.{op}.v1",
        Columns::List(vec!["name".into(), "data".into()]),
    );
    spec.max_payload_bytes = Some(900_000);
    capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap();
    let code = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000000)
c.execute("UPDATE files SET data = zeroblob(400000), name = 'g' WHERE id = 1")
c.execute("UPDATE files SET name = 'h' WHERE id = 1")
print("ok")
"#;
    let out = run("python3", &["-c", code, db.path.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let evs = stored_events(&conn);
    assert_eq!(evs.len(), 2);
    for e in &evs {
        assert_eq!(e.payload["too_large"], json!(true), "{}", e.payload);
        assert_eq!(e.payload["dropped"], json!(["name", "data"]));
        assert_eq!(e.payload["key"], json!({"id": 1}));
        assert_eq!(e.ordering_key.as_deref(), Some("files:1"));
    }
    let longest: i64 = conn
        .query_row("SELECT max(length(payload)) FROM event_outbox", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(longest <= 900_000, "{longest}");
}
