//! `run`'s watch over the captures: drift warnings, `auto_repair`, the
//! record of when captures were seen intact, and `auto_snapshot`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outboxd::capture::snapshot::{self, SnapshotOptions};
use outboxd::capture::{self, CaptureSpec, ConfigMatch, GapEnd};
use outboxd::Timestamp;
use rusqlite::Connection;

/// The most rows a second an automatic snapshot reads: it runs beside the
/// host's own writers, unattended.
const AUTO_SNAPSHOT_RATE: u32 = 1000;

/// How often `run` repeats a warning about a problem that has not changed.
const REMIND_EVERY: Duration = Duration::from_secs(600);

/// How often `run` records that intact captures are still intact
/// (`verified_at`). Between these writes the watch only reads: every write
/// is a WAL commit that wakes the relay (data_version) and costs an idle
/// machine CPU. A capture that breaks is recorded at once, with the time of
/// the last check that saw it intact, so the warning's "missing since" is
/// as precise as the check interval; only across a restart of `run` is it
/// as coarse as this.
const RECORD_INTACT_EVERY: Duration = Duration::from_secs(600);

/// `run`'s watch over the captures: at start and at every housekeeping
/// interval it checks every recorded capture (one [`capture::inspect`],
/// reading only), warns about drift (once when it appears or changes, then
/// every ten minutes), reinstalls the captures whose config entry sets
/// `auto_repair` (recording the gap, and starting a snapshot on a thread of
/// its own when the entry sets `auto_snapshot`, at most once per
/// [`capture::AUTO_SNAPSHOT_EVERY`]), and records when captures were seen
/// intact ([`capture::mark_verified`], rarely: see [`RECORD_INTACT_EVERY`]),
/// so a later warning can say since when a trigger has been missing. It
/// keeps one connection of its own (reopened after an error); the relay is
/// not involved.
pub(crate) struct Watch {
    db: PathBuf,
    conn: Option<Connection>,
    /// The config's captures, by name (lower case).
    config: BTreeMap<String, CaptureSpec>,
    interval: Duration,
    last: Option<Instant>,
    /// When `verified_at` was last written for the intact captures.
    recorded: Option<Instant>,
    /// Per capture (lower case): the last check that saw it intact, not yet
    /// written.
    seen_intact: BTreeMap<String, Timestamp>,
    /// What was last said about each capture (the problem as of the time
    /// it was last seen intact, so it does not change with the clock), and
    /// when.
    said: BTreeMap<String, (String, Instant)>,
    /// How many drift warnings were logged (for tests of the cadence).
    warned: u64,
    /// The automatic snapshots running, by capture (lower case).
    snapshots: BTreeMap<String, std::thread::JoinHandle<()>>,
    /// Set when `run` stops: the snapshots stop at their next chunk (they
    /// resume at the next start).
    stop: Arc<AtomicBool>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Watch {
    /// A watch of `db` with the config's captures; checks once at once.
    pub(crate) fn start(db: &Path, captures: &[CaptureSpec], interval: Duration) -> Watch {
        let mut w = Watch::new(db, captures, interval);
        w.compare_config();
        w.tick();
        w.resume_snapshots();
        w
    }

    fn new(db: &Path, captures: &[CaptureSpec], interval: Duration) -> Watch {
        Watch {
            db: db.to_path_buf(),
            conn: None,
            config: captures
                .iter()
                .map(|s| (s.name().to_ascii_lowercase(), s.clone()))
                .collect(),
            interval,
            last: None,
            recorded: None,
            seen_intact: BTreeMap::new(),
            said: BTreeMap::new(),
            warned: 0,
            snapshots: BTreeMap::new(),
            stop: Arc::default(),
        }
    }

    /// Checks when an interval has passed since the last check.
    pub(crate) fn tick(&mut self) {
        if self.last.is_some_and(|t| t.elapsed() < self.interval) {
            return;
        }
        self.last = Some(Instant::now());
        if let Err(e) = self.check(Timestamp::now()) {
            // Open afresh next time: the file may have been replaced.
            self.conn = None;
            tracing::warn!(error = %format!("{e:#}"), "cannot check the capture triggers");
        }
    }

    /// One check, as of `now`.
    fn check(&mut self, now: Timestamp) -> Result<()> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let conn = outboxd::connection::open(&self.db)
                    .with_context(|| format!("cannot open {}", self.db.display()))?;
                // Kept open for the life of `run`, reading a few rows
                // every housekeeping interval.
                outboxd::connection::small_cache(&conn)?;
                conn
            }
        };
        let result = self.check_on(&mut conn, now);
        self.conn = Some(conn);
        result
    }

    fn check_on(&mut self, conn: &mut Connection, now: Timestamp) -> Result<()> {
        let record_intact = self
            .recorded
            .is_none_or(|t| t.elapsed() >= RECORD_INTACT_EVERY);
        let mut record: Vec<(String, Timestamp)> = Vec::new();
        for mut s in capture::inspect(conn)? {
            let key = s.name.to_ascii_lowercase();
            if !s.is_intact() {
                // Broken now: record when it was last seen intact, which
                // the database does not know yet, and say so.
                if let Some(at) = self.seen_intact.remove(&key) {
                    record.push((s.name.clone(), at));
                    s.verified_at = s.verified_at.max(at);
                }
            }
            let Some(problem) = s.problem(now) else {
                if self.said.remove(&key).is_some() {
                    tracing::info!(capture = %s.name, table = %s.table, "capture triggers are intact again");
                }
                if record_intact {
                    record.push((s.name.clone(), now));
                    self.seen_intact.remove(&key);
                } else {
                    self.seen_intact.insert(key, now);
                }
                continue;
            };
            let repair = self.config.get(&key).filter(|c| c.auto_repair).cloned();
            if let Some(spec) = repair {
                match capture::apply_as(conn, std::slice::from_ref(&spec), now, GapEnd::Repair) {
                    Ok(report) => {
                        tracing::warn!(capture = %s.name, table = %s.table, was = %problem, "capture triggers reinstalled (capture.auto_repair)");
                        for g in &report.gaps {
                            tracing::warn!(capture = %g.capture, gap = g.id, "{}", g.describe());
                        }
                        self.said.remove(&key);
                        if spec.auto_snapshot && !report.gaps.is_empty() {
                            self.auto_snapshot(conn, &s.name, now);
                        }
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(capture = %s.name, table = %s.table, error = %e, "cannot reinstall the capture triggers (capture.auto_repair)")
                    }
                }
            }
            // The problem as of the last time it was seen intact: the same
            // text while nothing changes ("ago" in `problem` moves on).
            let signature = s.problem(s.verified_at).unwrap_or_default();
            let repeat = match self.said.get(&key) {
                Some((said, at)) => *said != signature || at.elapsed() >= REMIND_EVERY,
                None => true,
            };
            if repeat {
                tracing::warn!(capture = %s.name, table = %s.table, "{problem}; reinstall with `outboxd capture apply`, or set auto_repair = true in its [[capture]]");
                self.warned += 1;
                self.said.insert(key, (signature, Instant::now()));
            }
        }
        capture::mark_verified(conn, &record)?;
        if record_intact {
            self.recorded = Some(Instant::now());
        }
        Ok(())
    }

    /// Starts an automatic snapshot of capture `name` on a thread of its
    /// own, unless one runs or one started within
    /// [`capture::AUTO_SNAPSHOT_EVERY`].
    fn auto_snapshot(&mut self, conn: &Connection, name: &str, now: Timestamp) {
        let key = name.to_ascii_lowercase();
        if self.snapshots.get(&key).is_some_and(|h| !h.is_finished()) {
            return;
        }
        match snapshot::last_started(conn, name, "auto") {
            Ok(Some(at)) if now.since(at) < capture::AUTO_SNAPSHOT_EVERY => {
                tracing::info!(capture = %name, last = %at, "no automatic snapshot: one started less than an hour ago; run `outboxd capture snapshot` to start one");
                return;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(capture = %name, error = %e, "cannot read the snapshots");
                return;
            }
        }
        self.spawn_snapshot(name);
    }

    /// Resumes the automatic snapshots a previous `run` left running.
    fn resume_snapshots(&mut self) {
        let Some(conn) = &self.conn else { return };
        let running = match snapshot::running(conn) {
            Ok(r) => r,
            Err(_) => return, // an older schema, say: the check warned
        };
        for s in running.into_iter().filter(|s| s.origin == "auto") {
            self.spawn_snapshot(&s.capture);
        }
    }

    fn spawn_snapshot(&mut self, name: &str) {
        let (db, stop, capture) = (self.db.clone(), self.stop.clone(), name.to_string());
        let spawned = std::thread::Builder::new()
            .name("outboxd-snapshot".into())
            .spawn(move || {
                let opts = SnapshotOptions {
                    rate: Some(AUTO_SNAPSHOT_RATE),
                    origin: "auto".into(),
                    ..SnapshotOptions::default()
                };
                let result = outboxd::connection::open(&db).and_then(|mut conn| {
                    snapshot::run(&mut conn, &capture, &opts, |_| !stop.load(Ordering::Relaxed))
                });
                match result {
                    Ok(s) => tracing::info!(capture = %capture, snapshot = %s.id, state = s.state.as_str(), rows = s.rows, "automatic snapshot (capture.auto_snapshot)"),
                    Err(e) => tracing::error!(capture = %capture, error = %e, "automatic snapshot failed (capture.auto_snapshot)"),
                }
            });
        match spawned {
            Ok(h) => {
                tracing::info!(capture = %name, "starting an automatic snapshot (capture.auto_snapshot)");
                self.snapshots.insert(name.to_ascii_lowercase(), h);
            }
            Err(e) => {
                tracing::error!(capture = %name, error = %e, "cannot start a snapshot thread")
            }
        }
    }

    /// Warns at start about config captures that are not installed as
    /// configured (run does not install them: `capture apply` does).
    fn compare_config(&self) {
        if self.config.is_empty() {
            return;
        }
        let specs: Vec<CaptureSpec> = self.config.values().cloned().collect();
        let compared = outboxd::connection::open_read_only(&self.db)
            .map_err(anyhow::Error::from)
            .and_then(|conn| Ok(capture::compare(&conn, &specs)?));
        match compared {
            Ok(list) => {
                for c in list {
                    match c.state {
                        ConfigMatch::Matches => {}
                        ConfigMatch::NotInstalled => {
                            tracing::warn!(capture = %c.name, table = %c.table, "capture is in the config but not installed: run `outboxd capture apply`")
                        }
                        ConfigMatch::Differs { reason } => {
                            tracing::warn!(capture = %c.name, table = %c.table, %reason, "capture differs from the config: run `outboxd capture apply`")
                        }
                        ConfigMatch::Invalid { error } => {
                            tracing::warn!(capture = %c.name, table = %c.table, %error, "capture in the config cannot be installed")
                        }
                        ConfigMatch::NotInConfig => {}
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot compare the captures with the config")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd::capture::{CaptureStatus, Columns};

    fn captured(dir: &Path) -> (PathBuf, CaptureSpec) {
        let db = dir.join("cms.db");
        let mut conn = outboxd::connection::open(&db).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
            .unwrap();
        let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::All);
        capture::apply(&mut conn, std::slice::from_ref(&spec), Timestamp::now()).unwrap();
        (db, spec)
    }

    fn intact(db: &Path) -> bool {
        let conn = outboxd::connection::open_read_only(db).unwrap();
        capture::inspect(&conn)
            .unwrap()
            .iter()
            .all(CaptureStatus::is_intact)
    }

    fn drop_trigger(db: &Path) {
        let conn = outboxd::connection::open(db).unwrap();
        conn.execute_batch("DROP TRIGGER outboxd_capture_insert_pages")
            .unwrap();
    }

    #[test]
    fn run_repairs_at_start_and_at_every_check_only_with_auto_repair() {
        let dir = tempfile::tempdir().unwrap();
        let (db, mut spec) = captured(dir.path());
        drop_trigger(&db);
        let watch = Watch::start(&db, std::slice::from_ref(&spec), Duration::ZERO);
        assert!(!intact(&db), "without auto_repair run only warns");
        assert!(watch.said.contains_key("pages"));

        spec.auto_repair = true;
        let mut watch = Watch::start(&db, std::slice::from_ref(&spec), Duration::ZERO);
        assert!(intact(&db), "repaired at start");
        drop_trigger(&db);
        watch.tick();
        assert!(intact(&db), "repaired at the next check");
        assert!(watch.said.is_empty());
    }

    fn verified_at(db: &Path) -> Timestamp {
        let conn = outboxd::connection::open_read_only(db).unwrap();
        capture::inspect(&conn).unwrap()[0].verified_at
    }

    /// Regression (review of issue 14): every check wrote `verified_at`,
    /// one commit per table every 10 s, which woke the relay through
    /// data_version and kept an idle machine busy.
    #[test]
    fn checks_between_records_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (db, spec) = captured(dir.path());
        let mut watch = Watch::start(&db, &[spec], Duration::ZERO);
        let other = outboxd::connection::open_read_only(&db).unwrap();
        let version = || -> i64 {
            other
                .query_row("PRAGMA data_version", [], |r| r.get(0))
                .unwrap()
        };
        let before = version();
        for _ in 0..3 {
            watch.tick();
        }
        assert!(watch.said.is_empty());
        assert_eq!(version(), before, "a check committed a write");
    }

    #[test]
    fn a_capture_that_breaks_is_recorded_with_the_last_check_that_saw_it_intact() {
        let dir = tempfile::tempdir().unwrap();
        let (db, spec) = captured(dir.path());
        let hour = Duration::from_secs(3600);
        let (t0, t1, t2) = (
            Timestamp::now().plus(hour),
            Timestamp::now().plus(2 * hour),
            Timestamp::now().plus(3 * hour),
        );
        let mut watch = Watch::new(&db, &[spec], Duration::ZERO);
        watch.check(t0).unwrap();
        assert_eq!(verified_at(&db), t0, "the first check records");
        watch.check(t1).unwrap();
        assert_eq!(verified_at(&db), t0, "a later one only reads");
        drop_trigger(&db);
        watch.check(t2).unwrap();
        assert_eq!(verified_at(&db), t1, "the last check that saw it intact");
        let (said, _) = &watch.said["pages"];
        assert!(said.contains(&format!("after {t1}")), "{said}");
    }

    /// Regression (issue 33): the warning's text says how long ago the
    /// capture was last seen intact, so it changed at every 10 s check and
    /// was logged every 10 s instead of every ten minutes.
    #[test]
    fn a_lasting_drift_is_warned_once_then_every_ten_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let (db, spec) = captured(dir.path());
        let mut watch = Watch::new(&db, &[spec], Duration::ZERO);
        let t = Timestamp::now();
        watch.check(t).unwrap();
        drop_trigger(&db);
        for i in 1..=30 {
            watch.check(t.plus(Duration::from_secs(10 * i))).unwrap();
        }
        assert_eq!(watch.warned, 1, "30 checks of one lasting problem");
        // Ten minutes on (by the watch's own clock), it is said again.
        let key = "pages".to_string();
        let (said, _) = watch.said.remove(&key).unwrap();
        watch.said.insert(
            key,
            (said, Instant::now() - REMIND_EVERY - Duration::from_secs(1)),
        );
        watch.check(t.plus(Duration::from_secs(400))).unwrap();
        assert_eq!(watch.warned, 2);
    }

    /// auto_repair records the gap it ends (ended by `repair`), and with
    /// auto_snapshot starts a snapshot that covers it.
    #[test]
    fn auto_repair_records_the_gap_and_auto_snapshot_covers_it() {
        let dir = tempfile::tempdir().unwrap();
        let (db, mut spec) = captured(dir.path());
        outboxd::connection::open(&db)
            .unwrap()
            .execute_batch("INSERT INTO pages (title) VALUES ('a'), ('b')")
            .unwrap();
        spec.auto_repair = true;
        spec.auto_snapshot = true;
        drop_trigger(&db);
        let mut watch = Watch::new(&db, &[spec], Duration::ZERO);
        watch.check(Timestamp::now()).unwrap();
        let gaps = || {
            let conn = outboxd::connection::open_read_only(&db).unwrap();
            capture::gaps(&conn, 10).unwrap()
        };
        assert_eq!(gaps().len(), 1);
        assert_eq!(gaps()[0].ended_by, "repair");
        let handle = watch.snapshots.remove("pages").expect("a snapshot started");
        handle.join().unwrap();
        let g = &gaps()[0];
        assert!(
            g.resolved_by
                .as_deref()
                .is_some_and(|r| r.starts_with("snapshot ")),
            "{g:?}"
        );
        let conn = outboxd::connection::open_read_only(&db).unwrap();
        let r: i64 = conn
            .query_row(
                "SELECT count(*) FROM event_outbox WHERE event_type = 'page.snapshot.v1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(r, 2, "one r event per row");
        // A second repair within the hour starts no second snapshot.
        drop_trigger(&db);
        watch.check(Timestamp::now()).unwrap();
        assert!(watch.snapshots.is_empty());
        assert_eq!(gaps().len(), 2);
    }

    #[test]
    fn each_check_records_that_the_triggers_were_intact() {
        let dir = tempfile::tempdir().unwrap();
        let (db, spec) = captured(dir.path());
        outboxd::connection::open(&db)
            .unwrap()
            .execute_batch("UPDATE outboxd_capture SET verified_at = 0")
            .unwrap();
        let before = Timestamp::now();
        let mut watch = Watch::start(&db, &[spec], Duration::from_secs(3600));
        watch.tick(); // within the interval: no second check
        let conn = outboxd::connection::open_read_only(&db).unwrap();
        assert!(capture::inspect(&conn).unwrap()[0].verified_at >= before);
    }
}
