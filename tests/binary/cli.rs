//! Runs the real `outboxd` binary in temporary directories: the commands
//! work, and every bad input gets a one-line error, the documented exit code,
//! and leaves the database as it was.

use crate::common;

use std::path::Path;

use common::bin::code::{DATABASE, INPUT, OK, PROBLEMS, SCHEMA, USAGE};
use common::bin::{assert_one_line_error, drop_root, Sandbox};
use rusqlite::Connection;

fn outbox_rows(db: &Path) -> i64 {
    Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
        .unwrap()
}

/// A database of another application: its own table, rows and user_version,
/// in the default rollback-journal mode.
fn host_database(path: &Path) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE articles (id INTEGER PRIMARY KEY, title TEXT NOT NULL);
         INSERT INTO articles (title) VALUES ('Hello'), ('World');
         PRAGMA user_version = 42;",
    )
    .unwrap();
}

#[test]
fn migrate_twice() {
    let sb = Sandbox::new();
    assert_eq!(
        sb.ok(&["migrate"]),
        format!("migrated from v0 to v{}\n", outboxd::schema::LATEST_VERSION)
    );
    assert_eq!(
        sb.ok(&["migrate"]),
        format!("already at v{}\n", outboxd::schema::LATEST_VERSION)
    );
}

#[test]
fn enqueue_then_status_shows_one_pending_due() {
    let sb = Sandbox::migrated();
    let id = sb.ok(&[
        "enqueue",
        "--type",
        "article.created.v1",
        "--payload",
        r#"{"id": 7}"#,
    ]);
    let id = id.trim();
    outboxd::EventId::parse(id).expect("enqueue prints the event id");

    let s = sb.status_json();
    assert_eq!(s["counts"]["pending_due"], 1, "{s}");
    assert_eq!(s["counts"]["pending_delayed"], 0, "{s}");
    assert!(s["oldest_due_age_ms"].is_u64(), "{s}");
    assert_eq!(s["schema_version"], outboxd::schema::LATEST_VERSION);

    let text = sb.ok(&["status"]);
    assert!(text.contains("pending due:      1"), "{text}");

    // The row is a valid envelope, payload stored as given.
    let conn = Connection::open(sb.db()).unwrap();
    let (event_id, payload): (String, String) = conn
        .query_row("SELECT event_id, payload FROM event_outbox", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((event_id.as_str(), payload.as_str()), (id, r#"{"id": 7}"#));
}

#[test]
fn enqueue_fills_every_option() {
    let sb = Sandbox::migrated();
    sb.ok(&[
        "enqueue",
        "--type",
        "invoice.paid.v2",
        "--tenant",
        "acme",
        "--key",
        "inv-1",
        "--ordering-key",
        "invoice-1",
        "--causation-id",
        "cmd-9",
        "--correlation-id",
        "req-42",
        "--delay",
        "1h",
    ]);
    sb.ok(&[
        "enqueue",
        "--type",
        "invoice.paid.v2",
        "--available-at",
        "2020-01-01T00:00:00Z",
    ]);
    let s = sb.status_json();
    assert_eq!(s["counts"]["pending_delayed"], 1, "{s}");
    assert_eq!(s["counts"]["pending_due"], 1, "{s}");

    let conn = Connection::open(sb.db()).unwrap();
    let row: (
        String,
        i64,
        String,
        String,
        String,
        String,
        String,
        i64,
        i64,
    ) = conn
        .query_row(
            "SELECT event_type, event_version, tenant_id, idempotency_key, ordering_key,
                    causation_id, correlation_id, available_at - created_at, payload = 'null'
             FROM event_outbox WHERE tenant_id IS NOT NULL",
            [],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                ))
            },
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "invoice.paid.v2".into(),
            2,
            "acme".into(),
            "inv-1".into(),
            "invoice-1".into(),
            "cmd-9".into(),
            "req-42".into(),
            3_600_000,
            1
        )
    );
    let at: i64 = conn
        .query_row(
            "SELECT available_at FROM event_outbox WHERE tenant_id IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(at, 1_577_836_800_000);
}

#[test]
fn enqueue_reads_the_payload_from_a_file_or_stdin() {
    let sb = Sandbox::migrated();
    std::fs::write(sb.path("p.json"), r#"{"from": "file"}"#).unwrap();
    let file = sb.path("p.json");
    let out = sb.run(&[
        "enqueue",
        "--type",
        "a.b.v1",
        "--payload-file",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let out = sb.outboxd().run_with_stdin(
        &["enqueue", "--type", "a.b.v1", "--payload-file", "-"],
        br#"{"from": "stdin"}"#,
    );
    assert!(out.status.success(), "{out:?}");
    let conn = Connection::open(sb.db()).unwrap();
    let payloads: Vec<String> = conn
        .prepare("SELECT payload FROM event_outbox ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(payloads, [r#"{"from": "file"}"#, r#"{"from": "stdin"}"#]);
}

#[test]
fn a_repeated_key_prints_the_same_id() {
    let sb = Sandbox::migrated();
    let args = [
        "enqueue",
        "--type",
        "article.created.v1",
        "--key",
        "article-7",
    ];
    let first = sb.ok(&args);
    let again = sb.ok(&args);
    assert_eq!(again, format!("duplicate of {first}"));
    assert_eq!(outbox_rows(&sb.db()), 1);
}

#[test]
fn tenant_scoped_keys_do_not_collide() {
    let sb = Sandbox::migrated();
    let enqueue = |scope: &[&str]| {
        let mut args = vec!["enqueue", "--type", "a.b.v1"];
        args.extend_from_slice(scope);
        sb.ok(&args)
    };
    let ids = [
        enqueue(&["--tenant", "a:b", "--key", "c"]),
        enqueue(&["--tenant", "a", "--key", "b:c"]),
        enqueue(&["--key", "a:b:c"]),
        enqueue(&["--key", "c"]),
        enqueue(&["--tenant", "other", "--key", "c"]),
    ];
    for (i, id) in ids.iter().enumerate() {
        assert!(!id.starts_with("duplicate"), "event {i}: {id}");
    }
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len());
    // The same (tenant, key) again is a duplicate of the right event.
    assert_eq!(
        enqueue(&["--tenant", "a", "--key", "b:c"]),
        format!("duplicate of {}", ids[1])
    );
    assert_eq!(outbox_rows(&sb.db()), 5);
}

#[test]
fn db_comes_from_the_environment_or_defaults_to_outboxd_db() {
    let sb = Sandbox::new();
    let out = sb
        .outboxd()
        .without_db()
        .command(&["migrate"])
        .env("OUTBOXD_DB", sb.path("env.db"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(sb.path("env.db").is_file());
    let out = sb.outboxd().without_db().run(&["migrate"]);
    assert!(out.status.success());
    assert!(sb.path("outboxd.db").is_file());
}

#[test]
fn help_documents_exit_codes_and_examples() {
    let sb = Sandbox::new();
    let help = sb.ok(&["--help"]);
    for code in [
        "0  success",
        "2  usage",
        "3  database",
        "4  schema",
        "5  invalid input",
    ] {
        assert!(help.contains(code), "--help lacks {code:?}: {help}");
    }
    for cmd in ["migrate", "enqueue", "status"] {
        let help = sb.ok(&[cmd, "--help"]);
        assert!(help.contains("Example"), "{cmd} --help has no example");
    }
    // A command's own options come first, the global ones under their heading.
    let help = sb.ok(&["status", "--help"]);
    let at = |needle: &str| {
        help.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {help}"))
    };
    let global = at("Global options:");
    assert!(at("--json") < global, "{help}");
    for flag in ["--db <PATH>", "--log-format", "--log-level"] {
        assert!(
            at(flag) > global,
            "{flag} is not under Global options: {help}"
        );
    }
}

#[test]
fn unknown_flags_are_usage_errors() {
    let sb = Sandbox::new();
    sb.fails(&["migrate", "--frobnicate"], USAGE, "--frobnicate");
    sb.fails(&["enqueue", "--tpye", "a.b.v1"], USAGE, "--tpye");
    sb.fails(&["enqueue"], USAGE, "--type");
    sb.fails(&["status", "--yaml"], USAGE, "--yaml");
    // 10.16: a log level that is no level is refused, not taken as a target.
    let err = sb.fails(&["--log-level", "verbose", "status"], USAGE, "verbose");
    assert!(err.contains("allowed: error, warn"), "{err}");
    assert_eq!(err.matches("verbose").count(), 1, "said once: {err}");
    sb.fails(
        &["--log-level", "info,outboxd=loud", "status"],
        USAGE,
        "loud",
    );
    sb.fails(&["launch"], USAGE, "launch");
    sb.fails(
        &[
            "enqueue",
            "--type",
            "a.b.v1",
            "--payload",
            "1",
            "--payload-file",
            "-",
        ],
        USAGE,
        "cannot be used with",
    );
    let err = sb.fails(
        &["enqueue", "--type", "a.b.v1", "--delay", "5min"],
        USAGE,
        "5min",
    );
    assert!(err.contains("500ms, 30s, 5m, 2h or 1d"), "{err}");
    assert!(!sb.db().exists(), "no database is created");
}

/// Regression: `--delay 99999999d` reached the database, whose trigger
/// refused it as a time "in microseconds" with exit 3; a delay or a time
/// further off than `outboxd status` finds plausible is bad input, named.
#[test]
fn a_delay_beyond_a_year_is_refused_naming_the_flag() {
    let sb = Sandbox::migrated();
    for delay in ["99999999d", "366d"] {
        let err = sb.fails(
            &["enqueue", "--type", "a.b.v1", "--delay", delay],
            INPUT,
            "--delay",
        );
        assert!(err.contains("longer than 365d"), "{err}");
    }
    let err = sb.fails(
        &[
            "enqueue",
            "--type",
            "a.b.v1",
            "--available-at",
            "9000-01-01T00:00:00Z",
        ],
        INPUT,
        "--available-at",
    );
    assert!(err.contains("more than 365d from now"), "{err}");
    // A year is still plausible.
    sb.ok(&["enqueue", "--type", "a.b.v1", "--delay", "365d"]);
}

#[test]
fn invalid_json_is_refused() {
    let sb = Sandbox::migrated();
    let args = ["enqueue", "--type", "a.b.v1", "--payload", "{\"id\": 7"];
    sb.fails(&args, INPUT, "not valid JSON");
    sb.fails_with_stdin(
        &["enqueue", "--type", "a.b.v1", "--payload-file", "-"],
        b"not json",
        INPUT,
        "not valid JSON",
    );
    sb.fails(
        &[
            "enqueue",
            "--type",
            "a.b.v1",
            "--payload-file",
            "missing.json",
        ],
        INPUT,
        "missing.json",
    );
    assert_eq!(outbox_rows(&sb.db()), 0);
    // Nothing is created either when the database does not exist yet.
    let fresh = Sandbox::new();
    fresh.fails(&args, INPUT, "not valid JSON");
}

#[test]
fn an_invalid_event_type_is_refused() {
    let sb = Sandbox::migrated();
    for t in ["Article.created.v1", "article.v1", "article.created.v0", ""] {
        sb.fails(&["enqueue", "--type", t], INPUT, "invalid event type");
    }
    assert_eq!(outbox_rows(&sb.db()), 0);
}

#[test]
fn an_oversized_payload_is_refused() {
    let sb = Sandbox::migrated();
    let err = sb.fails(
        &[
            "enqueue",
            "--type",
            "a.b.v1",
            "--payload",
            "\"0123456789\"",
            "--max-payload-bytes",
            "8",
        ],
        INPUT,
        "larger than the limit of 8 bytes",
    );
    assert!(err.contains("--max-payload-bytes"), "{err}");
    // From a file: its size.
    let file = sb.write("big.json", "\"0123456789abcdef\"");
    sb.fails(
        &[
            "enqueue",
            "--type",
            "a.b.v1",
            "--payload-file",
            file.to_str().unwrap(),
            "--max-payload-bytes",
            "8",
        ],
        INPUT,
        "payload is 18 bytes, larger than the limit of 8 bytes",
    );
    // The default limit is 1 MiB, from stdin too.
    let big = format!("\"{}\"", "x".repeat(1024 * 1024));
    sb.fails_with_stdin(
        &["enqueue", "--type", "a.b.v1", "--payload-file", "-"],
        big.as_bytes(),
        INPUT,
        // 10.16: the actual size, not "more than the limit".
        "payload is 1048578 bytes, larger than the limit of 1048576 bytes",
    );
    assert_eq!(outbox_rows(&sb.db()), 0);
    // Just under the limit is fine.
    sb.ok(&[
        "enqueue",
        "--type",
        "a.b.v1",
        "--payload",
        "\"012345\"",
        "--max-payload-bytes",
        "8",
    ]);
}

#[test]
fn a_file_that_is_not_a_database_is_refused() {
    let sb = Sandbox::new();
    let junk = sb.path("notes.txt");
    std::fs::write(&junk, "these are my notes, not a database\n".repeat(200)).unwrap();
    for args in [
        &["migrate"][..],
        &["enqueue", "--type", "a.b.v1"],
        &["status"],
    ] {
        sb.fails_on(&junk, args, DATABASE, "not an SQLite database");
    }
}

#[test]
fn a_directory_as_db_is_refused() {
    let sb = Sandbox::new();
    let dir = sb.path("data");
    std::fs::create_dir(&dir).unwrap();
    for args in [
        &["migrate"][..],
        &["enqueue", "--type", "a.b.v1"],
        &["status"],
    ] {
        sb.fails_on(&dir, args, DATABASE, "is a directory");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn a_missing_database_is_not_created_by_enqueue_or_status() {
    let sb = Sandbox::new();
    sb.fails(&["status"], DATABASE, "no such file");
    let err = sb.fails(&["enqueue", "--type", "a.b.v1"], DATABASE, "no such file");
    assert!(err.contains("migrate"), "{err}");
    assert!(!sb.db().exists());
}

#[test]
fn a_database_in_a_missing_directory_says_so_rather_than_suggest_migrate() {
    let sb = Sandbox::new();
    let db = sb.path("no-such-dir").join("x.db");
    for args in [
        vec!["enqueue", "--type", "a.b.v1"],
        vec!["status"],
        vec!["dead", "list"],
    ] {
        let err = sb.fails_on(&db, &args, DATABASE, "does not exist");
        assert!(err.contains("the directory"), "{err}");
        assert!(!err.contains("migrate"), "{args:?}: {err}");
    }
    let err = sb.fails_on(&db, &["migrate"], DATABASE, "does not exist");
    assert!(err.contains("create it first"), "{err}");
}

#[test]
fn an_empty_outboxd_db_is_named_and_ignored_beside_db() {
    let sb = Sandbox::migrated();
    let out = sb
        .outboxd()
        .without_db()
        .command(&["status"])
        .env("OUTBOXD_DB", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_one_line_error(&stderr, "OUTBOXD_DB is set but empty");
    assert!(!stderr.contains("'--db"), "{stderr}");
    // With --db on the command line an empty variable is beside the point.
    let out = sb
        .command(&["status"])
        .env("OUTBOXD_DB", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(OK), "{out:?}");
    let out = sb
        .command(&["check-config"])
        .env("OUTBOXD_CONFIG", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE));
    assert_one_line_error(
        &String::from_utf8_lossy(&out.stderr),
        "OUTBOXD_CONFIG is set but empty",
    );
}

/// A small tmpfs, unmounted when dropped; None where this process may not
/// mount one (not root, or a container without the capability).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_disk_is_named_as_such() {
    let Some(fs) = Tmpfs::mount("2m") else {
        eprintln!("a_full_disk_is_named_as_such: skipped: cannot mount a tmpfs here");
        return;
    };
    let db = fs.0.path().join("app.db");
    let outboxd = common::bin::Outboxd::on(&db);
    outboxd.ok(&["migrate"]);
    outboxd.ok(&["enqueue", "--type", "a.b.v1"]);
    // Fill the file system to the last block.
    let mut fill = std::fs::File::create(fs.0.path().join("fill")).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut fill, &block).is_ok() {}
    drop(fill);
    for args in [
        vec!["run"],
        vec!["enqueue", "--type", "a.b.v1"],
        vec!["status"],
    ] {
        let err = outboxd.fails(&args, DATABASE, "no space left on device");
        assert!(!err.contains("disk I/O error"), "{args:?}: {err}");
    }

    // Room to open the database, not to commit a large event: the commit's
    // "database or disk is full" gets the file system's word.
    std::fs::remove_file(fs.0.path().join("fill")).unwrap();
    std::fs::write(fs.0.path().join("fill"), vec![0u8; 1536 << 10]).unwrap();
    let payload = format!("{{\"x\": \"{}\"}}", "y".repeat(900 << 10));
    let out = outboxd.run_with_stdin(
        &["enqueue", "--type", "a.b.v1", "--payload-file", "-"],
        payload.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(DATABASE), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no space left on device: the file system holding"),
        "{stderr}"
    );
}

#[test]
fn a_read_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let mut sb = Sandbox::migrated();
    sb.ok(&["enqueue", "--type", "a.b.v1"]);
    std::fs::set_permissions(sb.db(), std::fs::Permissions::from_mode(0o444)).unwrap();

    if std::fs::OpenOptions::new()
        .write(true)
        .open(sb.db())
        .is_ok()
    {
        // Running as root: the bits alone refuse nothing.
        match drop_root() {
            Some(runner) => {
                // nobody must reach the directory (status creates SQLite's
                // -shm index there) but owns nothing in it.
                std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o777))
                    .unwrap();
                sb.run_through(runner);
            }
            None => {
                eprintln!(
                    "a_read_only_file: skipped: running as root, where chmod 0444 does not \
                     stop writes, and setpriv cannot run outboxd as nobody"
                );
                return;
            }
        }
    }

    // status only reads, so it works on a read-only file.
    assert_eq!(sb.status_json()["counts"]["pending_due"], 1);
    sb.fails(&["migrate"], DATABASE, "read-only");
    sb.fails(&["enqueue", "--type", "a.b.v1"], DATABASE, "read-only");
    assert_eq!(outbox_rows(&sb.db()), 1);
}

/// Issue 10.11: an operator who may read a service's database but not
/// write its directory inspects it with status, doctor, dead list, purge
/// --dry-run and intents list. SQLite's read-only WAL readers need the -shm
/// index beside the database: with no writer running it is missing and
/// cannot be created, so outboxd reads the file as immutable and says so.
#[test]
fn inspection_works_in_a_directory_this_user_cannot_write() {
    use std::os::unix::fs::PermissionsExt;
    let mut sb = Sandbox::migrated();
    sb.ok(&["enqueue", "--type", "a.b.v1"]);
    sb.ok(&[
        "enqueue",
        "--type",
        "order.paid.v1",
        "--payload",
        "{\"n\": 1}",
    ]);
    let dead_id: String = sb.scalar("SELECT event_id FROM event_outbox ORDER BY id DESC LIMIT 1");
    sb.conn()
        .execute(
            "UPDATE event_outbox SET status = 'dead', last_error = 'poison: no such order', \
             finished_at = 1 WHERE event_id = ?1",
            [&dead_id],
        )
        .unwrap();
    let dir = sb.dir.path().to_path_buf();
    for sidecar in ["app.db-wal", "app.db-shm"] {
        assert!(
            !dir.join(sidecar).exists(),
            "{sidecar} is left: no writer has it open"
        );
    }

    // Who may read but not write the directory: nobody (as root, whom
    // permission bits do not stop), else this user in a directory made 0555.
    if common::bin::is_root() {
        let Some(runner) = drop_root() else {
            eprintln!("skipped: running as root and setpriv cannot run outboxd as nobody");
            return;
        };
        sb.run_through(runner);
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    struct Restore(std::path::PathBuf);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
        }
    }
    let _restore = Restore(dir.clone());

    // The test exercises the failure: this user cannot create a file there,
    // so SQLite cannot create the -shm index.
    let probe = sb.on(&dir.join("probe.db")).run(&["migrate"]);
    assert!(!probe.status.success(), "this user can write the directory");
    assert!(!dir.join("probe.db").exists());

    // (One dead letter: status exits 1.)
    let s = sb.json(&["status", "--json"], PROBLEMS);
    assert_eq!(s["counts"]["pending_due"], 1, "{s}");
    assert_eq!(s["counts"]["dead"], 1, "{s}");
    assert!(s["note"].as_str().unwrap().contains("immutable"), "{s}");
    let text = sb.expect(&["status"], PROBLEMS);
    assert!(
        text.contains("note:") && text.contains("immutable"),
        "{text}"
    );

    let d = sb.json(&["doctor", "--json"], OK);
    let find = |check: &str| {
        d["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {d}"))
    };
    assert_eq!(find("journal-mode")["severity"], "ok", "{d}");
    assert_eq!(find("integrity")["severity"], "ok", "{d}");
    assert_eq!(find("read-mode")["severity"], "note", "{d}");

    let list = sb.ok(&["dead", "list"]);
    assert!(
        list.contains(&dead_id) && list.contains("no such order"),
        "{list}"
    );
    sb.ok(&["dead", "show", &dead_id]);
    let dry = sb.ok(&["purge", "--dry-run"]);
    assert!(dry.contains("would delete 0 delivered events"), "{dry}");
    sb.ok(&["intents", "list"]);
    // Commands that write say why they cannot, and change nothing.
    sb.fails(&["enqueue", "--type", "a.b.v1"], DATABASE, "read-only");
    sb.fails(&["dead", "requeue", &dead_id], DATABASE, "read-only");
    for sidecar in ["app.db-wal", "app.db-shm"] {
        assert!(!dir.join(sidecar).exists(), "{sidecar} was created");
    }

    // While a writer (here: root) has the database open, its -shm index
    // exists and readers share it, as any SQLite reader would.
    if common::bin::is_root() {
        let writer = sb.conn();
        writer
            .execute("UPDATE event_outbox SET attempts = 0", [])
            .unwrap();
        assert!(dir.join("app.db-shm").exists());
        let s = sb.json(&["status", "--json"], PROBLEMS);
        assert!(s.get("note").is_none(), "read through the index: {s}");
        // A -wal file whose index is gone cannot be read without writing
        // one: the error names the cause.
        std::fs::remove_file(dir.join("app.db-shm")).unwrap();
        let err = sb.fails(&["status"], DATABASE, "app.db-shm");
        assert!(err.contains("cannot create"), "{err}");
        drop(writer);
    }
}

#[test]
fn a_database_of_another_application() {
    let sb = Sandbox::new();
    host_database(&sb.db());

    // Before migrating, outboxd says so and touches nothing.
    let err = sb.fails(&["status"], SCHEMA, "no outboxd schema");
    assert!(err.contains("run `outboxd migrate`"), "{err}");
    sb.fails(&["enqueue", "--type", "a.b.v1"], SCHEMA, "outboxd migrate");

    // migrate adds outboxd's tables beside the host's and keeps its user_version.
    sb.ok(&["migrate"]);
    let conn = Connection::open(sb.db()).unwrap();
    let user_version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, 42);
    let articles: i64 = conn
        .query_row("SELECT count(*) FROM articles", [], |r| r.get(0))
        .unwrap();
    assert_eq!(articles, 2);
    drop(conn);
    sb.ok(&["enqueue", "--type", "article.created.v1"]);
    assert_eq!(sb.status_json()["counts"]["pending_due"], 1);
}

#[test]
fn a_newer_schema_is_refused() {
    let sb = Sandbox::migrated();
    sb.ok(&["enqueue", "--type", "a.b.v1"]);
    Connection::open(sb.db())
        .unwrap()
        .execute(
            "INSERT INTO outboxd_schema (version, name, applied_at) VALUES (999, 'future', 0)",
            [],
        )
        .unwrap();
    let both = format!(
        "version 999 is newer than this outboxd supports ({})",
        outboxd::schema::LATEST_VERSION
    );
    sb.fails(&["migrate"], SCHEMA, &both);
    sb.fails(&["enqueue", "--type", "a.b.v1"], SCHEMA, &both);
    sb.fails(&["status"], SCHEMA, &both);
    assert_eq!(outbox_rows(&sb.db()), 1);
}

#[test]
fn a_newer_schema_in_a_host_database_is_left_exactly_as_it_is() {
    // A rollback-journal database: opening it for writing would switch it to
    // WAL, so the refusal must come first.
    let sb = Sandbox::new();
    host_database(&sb.db());
    Connection::open(sb.db())
        .unwrap()
        .execute_batch(
            "CREATE TABLE outboxd_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                                          applied_at INTEGER NOT NULL);
             INSERT INTO outboxd_schema VALUES (999, 'future', 0);",
        )
        .unwrap();
    for args in [
        &["migrate"][..],
        &["enqueue", "--type", "a.b.v1"],
        &["status"],
    ] {
        sb.fails(args, SCHEMA, "version 999 is newer");
    }
}

/// `check-config --offline` checks the file's syntax and values alone: a
/// NATS server nobody runs and a database whose tables do not exist yet pass
/// it (the systemd unit's ExecStartPre), while the full check refuses them;
/// a syntax error fails both.
#[test]
fn check_config_offline_asks_no_server_and_opens_no_database() {
    use common::bin::code::CONFIG;
    let sb = Sandbox::new();
    let config = sb.path("outboxd.toml");
    std::fs::write(
        &config,
        r#"database = "not-created-yet.db"

[[consumer]]
name = "bus"
types = ["*"]
[consumer.sink]
kind = "nats"
servers = ["nats://127.0.0.1:1"]
stream = "EVENTS"
connect_timeout = "1s"

[[consumer]]
name = "stats"
types = ["*"]
[consumer.sink]
kind = "sql"
statements = ["INSERT INTO article_events (event_id) VALUES (:event_id)"]
"#,
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let out = sb
        .outboxd()
        .without_db()
        .expect(&["check-config", "--offline", "--config", c], OK);
    assert!(out.contains("ok (offline"), "{out}");
    assert!(!out.contains("warning"), "no server was asked: {out}");
    assert!(
        !sb.path("not-created-yet.db").exists(),
        "the database was not opened"
    );
    let err =
        sb.outboxd()
            .without_db()
            .fails(&["check-config", "--config", c], CONFIG, "statements");
    assert!(err.contains("not-created-yet.db"), "{err}");

    std::fs::write(&config, "[[consumer]\nname = \"bus\"\n").unwrap();
    for args in [
        &["check-config", "--offline", "--config", c][..],
        &["check-config", "--config", c],
    ] {
        sb.outboxd().without_db().fails(args, CONFIG, "line 1");
    }
}

/// `check-config` reads the console's token as `run` does: an unset
/// variable fails it, and a weak token is a warning there too, so a unit's
/// ExecStartPre says so before `run` starts.
#[test]
fn check_config_reads_the_console_token_as_run_does() {
    use common::bin::code::CONFIG;
    let sb = Sandbox::new();
    let config = sb.path("outboxd.toml");
    std::fs::write(
        &config,
        "database = \"app.db\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         token_env = \"CHECK_CONSOLE_TOKEN\"\n\
         [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n",
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let args = ["check-config", "--offline", "--config", c];
    let check = |token: Option<&str>| {
        let mut cmd = sb.outboxd().without_db().command(&args);
        cmd.env_remove("CHECK_CONSOLE_TOKEN");
        if let Some(t) = token {
            cmd.env("CHECK_CONSOLE_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let unset = check(None);
    assert_eq!(unset.status.code(), Some(CONFIG));
    let err = String::from_utf8_lossy(&unset.stderr);
    assert!(err.contains("CHECK_CONSOLE_TOKEN"), "{err}");

    let weak = check(Some(&"a".repeat(16)));
    assert_eq!(weak.status.code(), Some(OK));
    let out = String::from_utf8_lossy(&weak.stdout);
    assert!(out.contains("warning: WEAK CONSOLE TOKEN"), "{out}");
    assert!(!out.contains(&"a".repeat(16)), "never the token: {out}");

    let strong = check(Some(
        "3f9c1e7a5b2d84f06c1a9e3b7d5f2c8a41e6b9d03c7f5a2e8b1d4c6f9a3e7b20",
    ));
    assert_eq!(strong.status.code(), Some(OK));
    assert!(!String::from_utf8_lossy(&strong.stdout).contains("WEAK"));
}
