//! `outboxd capture apply|list|drop`, and capture drift in `status` and
//! `doctor`, run as the real binary through the tests' one harness
//! (tests/common/bin.rs): outputs, exit codes, one-line errors.

use crate::common;

use common::bin::{code, Outboxd};
use common::TestDb;

fn cms() -> TestDb {
    let db = TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT, body TEXT)")
        .unwrap();
    db
}

fn outboxd(db: &TestDb) -> Outboxd {
    Outboxd::on(&db.path)
}

fn config(db: &TestDb, columns: &str) -> String {
    db.write(
        "capture.toml",
        &format!("[[capture]]\ntable = \"pages\"\nevent_type = \"page.{{op}}.v1\"\ncolumns = {columns}\n"),
    )
    .to_str()
    .unwrap()
    .to_string()
}

#[test]
fn apply_list_drop_and_their_exit_codes() {
    let db = cms();
    let file = config(&db, "[\"title\"]");
    let apply = ["capture", "apply", "--config", &file];
    assert_eq!(outboxd(&db).ok(&apply), "pages: installed (5 triggers)\n");
    assert_eq!(outboxd(&db).ok(&apply), "pages: unchanged (5 triggers)\n");

    let v = outboxd(&db).json(&["capture", "list", "--config", &file, "--json"], code::OK);
    assert_eq!(v["healthy"], true);
    assert_eq!(v["captures"][0]["table"], "pages");
    assert_eq!(v["captures"][0]["intact"], true);
    assert_eq!(v["captures"][0]["config"]["state"], "matches");

    // The config changed: list says so and exits 1 until apply runs.
    let file = config(&db, "[\"title\", \"body\"]");
    let out = outboxd(&db).expect(&["capture", "list", "--config", &file], code::PROBLEMS);
    // Saying what differs (issue 33).
    assert!(
        out.contains(
            r#"differs from the config: the config sets columns: ["title"] → ["title","body"]"#
        ),
        "{out}"
    );
    let out = outboxd(&db).ok(&apply);
    assert!(
        out.contains(
            r#"pages: updated (5 triggers): the config sets columns: ["title"] → ["title","body"]"#
        ),
        "{out}"
    );
    // A shared view dropped by hand: apply says it reinstalled it, not
    // "unchanged" (issue 33).
    db.conn()
        .execute_batch("DROP VIEW outboxd_capture_event")
        .unwrap();
    let out = outboxd(&db).ok(&apply);
    assert!(
        out.contains("reinstalled the shared view outboxd_capture_event"),
        "{out}"
    );
    assert!(out.contains("pages: unchanged"), "{out}");

    outboxd(&db).fails(
        &["capture", "drop", "--table", "nope"],
        code::INPUT,
        "not found; see the captures with `outboxd capture list`",
    );
    outboxd(&db).fails(&["capture", "drop"], code::USAGE, "--table");
    outboxd(&db).fails(
        &["capture", "drop", "--capture", "nope"],
        code::INPUT,
        "a capture named \"nope\"",
    );
    outboxd(&db).fails(
        &["capture", "drop", "--table", "pages", "--all"],
        code::USAGE,
        "cannot be used with",
    );
    let out = outboxd(&db).ok(&["capture", "drop", "--table", "pages"]);
    assert!(out.contains("dropped capture pages"), "{out}");
    let out = outboxd(&db).ok(&["capture", "list"]);
    assert!(out.contains("no capture installed"), "{out}");
}

#[test]
fn a_capture_that_cannot_be_installed_is_a_config_error_naming_it() {
    let db = cms();
    let cases = [
        ("[\"titel\"]", "titel"),
        ("\"*\"\nkey = \"body\"", "not unique"),
        ("\"*\"\nwhen = \"NEW.nope = 1\"", "nope"),
        ("\"*\"\nwhen = \"1); DROP TABLE pages; --\"", "invalid when"),
    ];
    for (columns, needle) in cases {
        let file = config(&db, columns);
        outboxd(&db).fails(
            &["capture", "apply", "--config", &file],
            code::CONFIG,
            needle,
        );
    }
    let bad_type = db.write(
        "bad.toml",
        "[[capture]]\ntable = \"pages\"\nevent_type = \"Page.{op}.v1\"\ncolumns = \"*\"\n",
    );
    outboxd(&db).fails(
        &["capture", "apply", "--config", bad_type.to_str().unwrap()],
        code::CONFIG,
        "capture[0].event_type",
    );
    let none = db.write("none.toml", "database = \"app.db\"\n");
    outboxd(&db).fails(
        &["capture", "apply", "--config", none.to_str().unwrap()],
        code::CONFIG,
        "no [[capture]]",
    );
    // Nothing was installed by any of them.
    let out = outboxd(&db).ok(&["capture", "list"]);
    assert!(out.contains("no capture installed"), "{out}");
}

#[test]
fn status_and_doctor_report_a_missing_trigger_and_exit_1() {
    let db = cms();
    let file = config(&db, "\"*\"");
    outboxd(&db).ok(&["capture", "apply", "--config", &file]);
    outboxd(&db).ok(&["status"]);
    db.conn()
        .execute_batch("DROP TRIGGER outboxd_capture_update_pages")
        .unwrap();
    let v = outboxd(&db).json(&["status", "--json"], code::PROBLEMS);
    assert_eq!(v["problems"][0]["threshold"], "capture");
    let message = v["problems"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("outboxd_capture_update_pages"),
        "{message}"
    );
    assert!(message.contains("were not captured"), "{message}");
    let v = outboxd(&db).json(&["doctor", "--json"], code::PROBLEMS);
    let capture = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "capture")
        .unwrap();
    assert_eq!(capture["severity"], "error");
}

/// `capture apply` on a database in rollback-journal mode says it switched
/// it to WAL; `capture drop` and `capture ack` take the database from
/// --config (issue 33).
#[test]
fn apply_says_it_switched_to_wal_and_drop_takes_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cms.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
        .unwrap();
    let file = dir.path().join("capture.toml");
    std::fs::write(
        &file,
        "database = \"cms.db\"\n[[capture]]\ntable = \"pages\"\nevent_type = \"page.{op}.v1\"\ncolumns = \"*\"\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let o = Outboxd::on(&db).without_db();
    let out = o.ok(&["capture", "apply", "--config", file]);
    assert!(out.starts_with("switched "), "{out}");
    assert!(out.contains("to WAL journal mode (it was delete)"), "{out}");
    let out = o.ok(&["capture", "apply", "--config", file]);
    assert!(!out.contains("WAL"), "said once: {out}");
    let out = o.ok(&["capture", "ack", "--config", file, "--all"]);
    assert_eq!(out, "0 gaps acknowledged\n");
    let out = o.ok(&["capture", "drop", "--config", file, "--capture", "pages"]);
    assert!(out.contains("dropped capture pages"), "{out}");
}

/// `check-config` prepares each capture against the database, with or
/// without --offline (the systemd unit's ExecStartPre): a missing table or
/// column, or a `when` that does not compile, is exit 6 naming the entry
/// (issue 33).
#[test]
fn check_config_checks_each_capture_against_the_database() {
    let db = cms();
    let sink = "[[consumer]]\nname = \"c\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n";
    let cases = [
        (
            "table = \"pagez\"\ncolumns = \"*\"",
            "capture[0].table",
            "no such table",
        ),
        (
            "table = \"pages\"\ncolumns = [\"titel\"]",
            "capture[0].columns",
            "titel",
        ),
        (
            "table = \"pages\"\ncolumns = \"*\"\nwhen = \"NEW.nope = 1\"",
            "capture[0].when",
            "nope",
        ),
    ];
    for (entry, field, needle) in cases {
        let file = db.write(
            "check.toml",
            &format!("{sink}[[capture]]\nevent_type = \"page.{{op}}.v1\"\n{entry}\n"),
        );
        let file = file.to_str().unwrap();
        for offline in [false, true] {
            let mut args = vec!["check-config", "--config", file];
            if offline {
                args.insert(1, "--offline");
            }
            let err = outboxd(&db).fails(&args, code::CONFIG, needle);
            assert!(err.contains(field), "{err}");
        }
    }
    let file = db.write(
        "check.toml",
        &format!("{sink}[[capture]]\nevent_type = \"page.{{op}}.v1\"\ntable = \"pages\"\ncolumns = \"*\"\n"),
    );
    outboxd(&db).ok(&[
        "check-config",
        "--offline",
        "--config",
        file.to_str().unwrap(),
    ]);
}
