//! `outboxd capture apply|list|drop`, and capture drift in `status` and
//! `doctor`, run as the real binary: outputs, exit codes, one-line errors.

mod common;

use std::process::{Command, Output};

use common::TestDb;

const PROBLEMS: i32 = 1;
const USAGE: i32 = 2;
const INPUT: i32 = 5;
const CONFIG: i32 = 6;

fn outboxd(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("--db")
        .arg(&db.path)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn cms() -> TestDb {
    let db = TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT, body TEXT)")
        .unwrap();
    db
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
    let o = outboxd(&db, &["capture", "apply", "--config", &file]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "pages: installed (5 triggers)\n");
    let o = outboxd(&db, &["capture", "apply", "--config", &file]);
    assert_eq!(stdout(&o), "pages: unchanged (5 triggers)\n");

    let o = outboxd(&db, &["capture", "list", "--config", &file, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["healthy"], true);
    assert_eq!(v["captures"][0]["table"], "pages");
    assert_eq!(v["captures"][0]["intact"], true);
    assert_eq!(v["captures"][0]["config"]["state"], "matches");

    // The config changed: list says so and exits 1 until apply runs.
    let file = config(&db, "[\"title\", \"body\"]");
    let o = outboxd(&db, &["capture", "list", "--config", &file]);
    assert_eq!(o.status.code(), Some(PROBLEMS));
    assert!(
        stdout(&o).contains("differs from the config"),
        "{}",
        stdout(&o)
    );

    for (args, code, needle) in [
        (
            vec!["capture", "drop", "--table", "nope"],
            INPUT,
            "not found",
        ),
        (vec!["capture", "drop"], USAGE, "--table"),
        (
            vec!["capture", "drop", "--table", "pages", "--all"],
            USAGE,
            "cannot be used with",
        ),
    ] {
        let o = outboxd(&db, &args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
    let o = outboxd(&db, &["capture", "drop", "--table", "pages"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("dropped the capture of pages"));
    let o = outboxd(&db, &["capture", "list"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("no capture installed"));
}

#[test]
fn a_capture_that_cannot_be_installed_is_a_config_error_naming_it() {
    let db = cms();
    let cases = [
        ("[\"titel\"]", "titel"),
        ("\"*\"\nkey = \"body\"", "not unique"),
        ("\"*\"\nwhen = \"NEW.nope = 1\"", "nope"),
    ];
    for (columns, needle) in cases {
        let file = config(&db, columns);
        let o = outboxd(&db, &["capture", "apply", "--config", &file]);
        assert_eq!(o.status.code(), Some(CONFIG), "{columns}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{columns}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1);
    }
    let bad_type = db.write(
        "bad.toml",
        "[[capture]]\ntable = \"pages\"\nevent_type = \"Page.{op}.v1\"\ncolumns = \"*\"\n",
    );
    let o = outboxd(
        &db,
        &["capture", "apply", "--config", bad_type.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(CONFIG));
    assert!(
        stderr(&o).contains("capture[0].event_type"),
        "{}",
        stderr(&o)
    );
    let none = db.write("none.toml", "database = \"app.db\"\n");
    let o = outboxd(
        &db,
        &["capture", "apply", "--config", none.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(CONFIG));
    assert!(stderr(&o).contains("no [[capture]]"), "{}", stderr(&o));
    // Nothing was installed by any of them.
    let o = outboxd(&db, &["capture", "list"]);
    assert!(
        stdout(&o).contains("no capture installed"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn status_and_doctor_report_a_missing_trigger_and_exit_1() {
    let db = cms();
    let file = config(&db, "\"*\"");
    assert!(outboxd(&db, &["capture", "apply", "--config", &file])
        .status
        .success());
    assert_eq!(outboxd(&db, &["status"]).status.code(), Some(0));
    db.conn()
        .execute_batch("DROP TRIGGER outboxd_capture_pages_update")
        .unwrap();
    let o = outboxd(&db, &["status", "--json"]);
    assert_eq!(o.status.code(), Some(PROBLEMS));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["problems"][0]["threshold"], "capture");
    let message = v["problems"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("outboxd_capture_pages_update"),
        "{message}"
    );
    assert!(message.contains("cannot be recovered"), "{message}");
    let o = outboxd(&db, &["doctor", "--json"]);
    assert_eq!(o.status.code(), Some(PROBLEMS));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let capture = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "capture")
        .unwrap();
    assert_eq!(capture["severity"], "error");
}
