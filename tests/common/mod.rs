//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod bin;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxd::{Delivery, Event, EventId, Outcome};
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
    pub fn consumer(&self) -> impl Fn(&Delivery) -> Outcome + Send + Sync + 'static {
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
