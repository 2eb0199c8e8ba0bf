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
    assert!(out.contains("differs from the config"), "{out}");

    outboxd(&db).fails(
        &["capture", "drop", "--table", "nope"],
        code::INPUT,
        "not found; see the captures with `outboxd capture list`",
    );
    outboxd(&db).fails(&["capture", "drop"], code::USAGE, "--table");
    outboxd(&db).fails(
        &["capture", "drop", "--table", "pages", "--all"],
        code::USAGE,
        "cannot be used with",
    );
    let out = outboxd(&db).ok(&["capture", "drop", "--table", "pages"]);
    assert!(out.contains("dropped the capture of pages"), "{out}");
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
    assert!(message.contains("cannot be recovered"), "{message}");
    let v = outboxd(&db).json(&["doctor", "--json"], code::PROBLEMS);
    let capture = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "capture")
        .unwrap();
    assert_eq!(capture["severity"], "error");
}
