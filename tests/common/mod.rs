//! Helpers shared by the integration tests: the one helper folder of every
//! test target (tests/README.md).
#![allow(dead_code)]

pub mod bin;
#[cfg(feature = "cli")]
pub mod console;
pub mod faultvfs;
pub mod http;
#[cfg(feature = "nats")]
pub mod nats_server;
#[cfg(feature = "nats")]
pub mod nats_versions;
pub mod peers;
pub mod tls;
pub mod venv;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxd::envelope::{check_row, RawRow, ROW_COLUMNS};
use outboxd::{Delivery, Envelope, Event, EventId, Outcome};
use rusqlite::Connection;

/// A migrated database, `app.db`, in a temp dir that lives as long as the
/// value; other files of a test (configs, logs, outputs) go beside it.
pub struct TestDb {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&path).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        TestDb { dir, path }
    }

    pub fn conn(&self) -> Connection {
        outboxd::connection::open(&self.path).unwrap()
    }

    /// The database file.
    pub fn db(&self) -> PathBuf {
        self.path.clone()
    }

    /// A file beside the database.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file beside the database and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.file(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Enqueues events in one transaction and returns their ids.
    pub fn enqueue(&self, events: &[Event]) -> Vec<EventId> {
        let mut conn = self.conn();
        let tx = conn.transaction().unwrap();
        let ids = outboxd::enqueue_many(&tx, events)
            .unwrap()
            .iter()
            .map(|e| e.event_id())
            .collect();
        tx.commit().unwrap();
        ids
    }

    pub fn count(&self, sql_where: &str) -> i64 {
        self.conn()
            .query_row(
                &format!("SELECT count(*) FROM event_outbox WHERE {sql_where}"),
                [],
                |r| r.get(0),
            )
            .unwrap()
    }

    pub fn scalar<T: rusqlite::types::FromSql>(&self, sql: &str) -> T {
        self.conn().query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

pub fn event(ty: &str, n: u64) -> Event {
    Event::new(ty, &serde_json::json!({ "n": n })).unwrap()
}

/// Polls `cond` until it holds or `timeout` passes; panics with `what`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A consumer that records every delivery it sees.
#[derive(Clone, Default)]
pub struct Recorder {
    pub seen: Arc<Mutex<Vec<(EventId, u32)>>>,
}

impl Recorder {
    pub fn consumer(&self) -> impl Fn(&Delivery) -> Outcome + Send + Sync + 'static + use<> {
        let seen = self.seen.clone();
        move |d: &Delivery| {
            seen.lock().unwrap().push((d.envelope.event_id, d.attempt));
            Outcome::Delivered
        }
    }

    pub fn ids(&self) -> Vec<EventId> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// A test cannot run because this machine lacks something (`what`: the
/// tool, and how to get it). Outside CI the caller skips its test, with
/// this message on stderr; under `.ci/run`, which exports `OUTBOXD_CI=1`,
/// the test fails instead, so a cross-process test can never pass in CI
/// without running. The one place that decides this for every test.
pub fn missing(what: &str) {
    if std::env::var_os("OUTBOXD_CI").is_some_and(|v| v == "1") {
        panic!(
            "{what}, and OUTBOXD_CI=1 requires this test to run (.ci/run installs what it needs)"
        );
    }
    eprintln!("SKIPPED: {what}; set OUTBOXD_CI=1 to make this a failure");
}

/// Whether `program probe…` runs and succeeds here (`&["--version"]`, or a
/// probe of what the test needs: `&["-c", "import sqlite3"]`). When not,
/// [`missing`] decides: skip outside CI, fail in CI.
pub fn available(program: impl AsRef<std::ffi::OsStr>, probe: &[&str]) -> bool {
    let program = program.as_ref();
    let found = std::process::Command::new(program)
        .args(probe)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        missing(&format!(
            "`{} {}` does not run here (python3, php-cli and php-sqlite3, chromium and \
             chromium-driver, nats-server, faketime are Debian packages)",
            program.to_string_lossy(),
            probe.join(" ")
        ));
    }
    found
}

/// One `event_outbox` row, validated the way the relay validates a row it
/// claims (`envelope::check_row`), with its routing columns.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub row_id: i64,
    pub envelope: Envelope,
    pub tenant_id: Option<String>,
    pub ordering_key: Option<String>,
    /// The payload, parsed.
    pub payload: serde_json::Value,
}

/// Every row of the outbox in id order, each validated as the relay would;
/// a row the relay would dead-letter fails the test with the reason.
pub fn stored_events(conn: &Connection) -> Vec<StoredEvent> {
    use rusqlite::types::ValueRef;
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {ROW_COLUMNS}, ordering_key, last_error FROM event_outbox ORDER BY id"
        ))
        .unwrap();
    let mut rows = stmt.query([]).unwrap();
    let mut out = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        let row_id: i64 = r.get(0).unwrap();
        let checked = check_row(&RawRow::read(r, 0).unwrap())
            .unwrap_or_else(|e| panic!("row {row_id} would be dead-lettered: {e}"));
        let last_error: Option<String> = r.get(11).unwrap();
        assert_eq!(last_error, None, "row {row_id} keeps a last_error");
        let payload = serde_json::from_str(checked.envelope.payload.get()).unwrap();
        // The relay reads the ordering key leniently (bytes that are not
        // UTF-8 become U+FFFD); so does this.
        let ordering_key = match r.get_ref(10).unwrap() {
            ValueRef::Null => None,
            ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
            other => panic!("row {row_id}: ordering_key is {other:?}"),
        };
        out.push(StoredEvent {
            row_id,
            envelope: checked.envelope,
            tenant_id: checked.tenant_id,
            ordering_key,
            payload,
        });
    }
    out
}

/// Mounts a tmpfs of `size` (such as "2m") on `dir`, or resizes it
/// (`remount`): a real full disk for a test. Needs root; false when the
/// mount fails, and the test skips itself.
pub fn mount_tmpfs(dir: &std::path::Path, size: &str, remount: bool) -> bool {
    let opts = if remount {
        format!("remount,size={size}")
    } else {
        format!("size={size}")
    };
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The name libtest gives test `name` of the module at `module_path` (pass
/// `module_path!()`), as `--exact` needs it to run that one test in a child
/// process: the module path without the crate's name (`relay::name`).
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// For a test that needs environment variables of its own, which it must
/// not set in the test binary's process (its other tests run in threads
/// beside it): there, runs test `name` of `module_path` again, alone, in a
/// child process with `vars` set, asserts that it passed and returns false;
/// in that child (where the first variable is set) returns true: go on.
pub fn in_child_with_env(module_path: &str, name: &str, vars: &[(&str, &str)]) -> bool {
    let (first, value) = vars[0];
    if std::env::var_os(first).is_some_and(|v| v == value) {
        return true;
    }
    let name = test_name(module_path, name);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name.as_str(), "--nocapture", "--test-threads=1"])
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" 1 passed"),
        "{name} in a child process:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Unmounts on drop, so a failing test leaves no mount behind.
pub struct Mounted(pub PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Starting relays in tests: `db.relay()…started()`, `stop`, `Gate`.
pub mod relay;

/// The `main` of a `harness = false` suite whose tests start processes
/// (process_faults.rs, exactly_once.rs): runs `tests` one at a time (the
/// machine may have two cores), with libtest's command line (a name
/// filter, `--nocapture`). A test fails by panicking, as a #[test] does;
/// libtest-mimic catches it.
pub fn run_one_at_a_time(tests: &[(&'static str, fn())]) -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
