//! `outboxd doctor`: inspect a database and say what to do about what is
//! wrong with it.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use outboxd::connection::ReadMode;
use outboxd::integrity::{self, Depth};
use outboxd::intents::{self, IntentStatus};
use outboxd::schema::LATEST_VERSION;
use outboxd::status::{Problem, Thresholds};
use outboxd::Timestamp;
use rusqlite::Connection;
use serde::Serialize;

use super::support::{count, human};
use super::{database, Global};
use crate::args::parse_duration;
use crate::config::{alerts, Config};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd doctor --help`.
pub const EXAMPLES: &str = "\
Checks: file integrity (PRAGMA integrity_check, or quick_check with --quick),
the schema version against this binary, the journal mode (must be WAL), the
WAL file's size, the synchronous setting, expired leases, stale due events,
leases and retries further ahead than any setting allows (the clock stepped
back), events delayed by more than a year (a time in microseconds, say), dead
letters, open publish intents and capture triggers (missing or changed).
Every finding says what to do.

Opens the database read-only and changes nothing, so it is safe on a file
that is in use, damaged, or not yours to write. Exits 0 when no finding is
an error (warnings and notes allowed), 1 otherwise.

With --config (or OUTBOXD_CONFIG), the database and --stale-after are the
config's (`database`, [alerts] stale_after); --db, OUTBOXD_DB and
--stale-after win over it. The sinks that can be asked are checked too: a
nats sink's stream, and its duplicate window against the consumer's retry
schedule.

Examples:
  outboxd --db app.db doctor
  outboxd doctor --config /etc/outboxd/outboxd.toml
  outboxd --db app.db doctor --json | jq '.findings[] | select(.severity != \"ok\")'";

/// Above this the WAL file is reported: a reader holding a snapshot keeps
/// checkpoints from resetting it. The same bound outboxd's connections set
/// as `journal_size_limit`.
const WAL_WARN_BYTES: u64 = outboxd::connection::DEFAULT_JOURNAL_SIZE_LIMIT as u64;

/// Options of `outboxd doctor`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help(
    "Take the database and alerts.stale_after from this config file, and check its sinks that \
     can be asked (a nats sink: its stream, and its duplicate window against the retry schedule)"
)))]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Use PRAGMA quick_check, faster on a large file, instead of the full
    /// integrity_check.
    #[arg(long)]
    quick: bool,
    /// Warn when the oldest due event has waited longer than this
    /// [default: the config's alerts.stale_after, else 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    stale_after: Option<Duration>,
    #[command(flatten)]
    config: super::config_arg::ConfigArg,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Severity {
    /// The check passed.
    Ok,
    /// Worth knowing; nothing to fix.
    Note,
    /// Needs a look, but outboxd works.
    Warning,
    /// outboxd cannot work correctly until it is fixed.
    Error,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "ERROR",
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, Serialize)]
struct Finding {
    /// Which check ("integrity", "journal-mode"…).
    check: &'static str,
    severity: Severity,
    /// What was found.
    message: String,
    /// What to do about it, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<String>,
}

impl Finding {
    fn new(check: &'static str, severity: Severity, message: impl Into<String>) -> Finding {
        Finding {
            check,
            severity,
            message: message.into(),
            action: None,
        }
    }

    fn action(mut self, action: impl Into<String>) -> Finding {
        self.action = Some(action.into());
        self
    }

    fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding::new(check, Severity::Ok, message)
    }

    /// A check that could not run: an error, since nothing is known.
    fn failed(check: &'static str, what: &str, e: impl std::fmt::Display) -> Finding {
        Finding::new(check, Severity::Error, format!("cannot {what}: {e}")).action(
            "run `outboxd doctor` again; if this persists, the file may be damaged \
             (see the integrity finding)",
        )
    }
}

/// Runs every check and prints the findings.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    // The database and the thresholds are resolved as `status` resolves them.
    let mut unreadable = None;
    let (db, mut alerts) = match args.config.file().map(Config::load_without_sinks) {
        None => (global.db.clone(), alerts::without_config()),
        Some(Ok(c)) => (global.db_with_config(c.database.as_deref()), c.alerts),
        // Unreadable, the config cannot name the database: only --db can.
        Some(Err(e)) if global.db_explicit => {
            unreadable = Some(Finding::new(CONFIG, Severity::Error, e.to_string()));
            (global.db.clone(), alerts::without_config())
        }
        Some(Err(e)) => return Err(Failure::from(e).into()),
    };
    if let Some(d) = args.stale_after {
        alerts.stale_after = d;
    }
    let (conn, mode) = database::for_inspection(&db)?;
    let now = Timestamp::now();
    let mut findings = examine(&conn, mode, &db, args.quick, alerts.stale_after, now);
    if let Some(note) = database::read_mode_note(mode) {
        findings.push(Finding::new("read-mode", Severity::Note, note));
    }
    match (unreadable, args.config.file()) {
        (Some(finding), _) => findings.push(finding),
        (None, Some(file)) => findings.extend(sinks(file)),
        (None, None) => {}
    }
    let healthy = findings.iter().all(|f| f.severity < Severity::Error);
    let mut out = std::io::stdout().lock();
    if args.json {
        let value = serde_json::json!({
            "database": db.display().to_string(),
            "healthy": healthy,
            "findings": findings,
        });
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &findings)?;
    }
    Ok(if healthy { Exit::Ok } else { Exit::Problems })
}

fn examine(
    conn: &Connection,
    mode: ReadMode,
    db: &Path,
    quick: bool,
    stale_after: Duration,
    now: Timestamp,
) -> Vec<Finding> {
    let mut findings = vec![
        integrity(conn, quick, db),
        journal_mode(conn, mode),
        wal_size(db),
        synchronous(),
    ];
    let schema = schema(conn);
    let current = schema.severity == Severity::Ok;
    findings.insert(1, schema);
    if current {
        findings.extend(outbox(conn, stale_after, now));
        findings.push(open_intents(conn, now));
        findings.extend(captures(conn, now));
    }
    findings
}

/// The check a config file that cannot be read or used is reported under.
const CONFIG: &str = "config";

/// What the config's sinks say about their destinations (see
/// `Sink::probe`); a config whose consumers or sinks cannot be built is a
/// "config" finding.
fn sinks(file: &Path) -> Vec<Finding> {
    const CHECK: &str = "sink";
    let config = match Config::load(file) {
        Ok(c) => c,
        Err(e) => return vec![Finding::new(CONFIG, Severity::Error, e.to_string())],
    };
    let lease = config.relay.lease;
    let mut findings = Vec::new();
    for c in &config.consumers {
        match c.sink.probe(&c.name, &c.retry, lease) {
            Err(e) => findings.push(Finding::new(CHECK, Severity::Error, e.to_string())),
            Ok(found) => findings.extend(found.into_iter().map(|f| {
                let severity = if f.warning {
                    Severity::Warning
                } else {
                    Severity::Ok
                };
                Finding::new(
                    CHECK,
                    severity,
                    format!("consumer {}: {}", c.name, f.message),
                )
            })),
        }
    }
    findings
}

/// Capture triggers missing or changed (a host migration rebuilt a table).
fn captures(conn: &Connection, now: Timestamp) -> Vec<Finding> {
    const CHECK: &str = "capture";
    match super::capture::problems(conn, now) {
        Ok(found) if found.is_empty() => vec![Finding::ok(
            CHECK,
            "no capture trigger is missing or changed",
        )],
        Ok(found) => found
            .into_iter()
            .map(|m| Finding::new(CHECK, Severity::Error, m))
            .collect(),
        Err(e) => vec![Finding::failed(CHECK, "check the capture triggers", e)],
    }
}

fn integrity(conn: &Connection, quick: bool, db: &Path) -> Finding {
    const CHECK: &str = "integrity";
    let depth = if quick { Depth::Quick } else { Depth::Full };
    let damaged = |finding: String| {
        Finding::new(CHECK, Severity::Error, finding).action(integrity::advice(db))
    };
    match integrity::check(conn, depth) {
        Ok(found) if found.is_ok() => Finding::ok(
            CHECK,
            format!("no damage found (PRAGMA {})", depth.pragma()),
        ),
        Ok(found) => damaged(found.finding()),
        Err(e) => damaged(format!(
            "the database file is damaged (PRAGMA {}): {e}",
            depth.pragma()
        )),
    }
}

fn schema(conn: &Connection) -> Finding {
    const CHECK: &str = "schema";
    match outboxd::schema::version(conn) {
        Err(e) => Finding::failed(CHECK, "read the schema version", e),
        Ok(None | Some(0)) => Finding::new(CHECK, Severity::Error, "no outboxd schema")
            .action("run `outboxd migrate` to create outboxd's tables"),
        Ok(Some(v)) if v < LATEST_VERSION => Finding::new(
            CHECK,
            Severity::Error,
            format!("schema v{v} is older than this binary's v{LATEST_VERSION}"),
        )
        .action("run `outboxd migrate` (with this binary) before starting the relay"),
        Ok(Some(v)) if v > LATEST_VERSION => Finding::new(
            CHECK,
            Severity::Error,
            format!("schema v{v} is newer than this binary's v{LATEST_VERSION}"),
        )
        .action("use the outboxd release that migrated this database, or a newer one"),
        Ok(Some(v)) => Finding::ok(CHECK, format!("schema v{v}, as this binary expects")),
    }
}

fn journal_mode(conn: &Connection, mode: ReadMode) -> Finding {
    const CHECK: &str = "journal-mode";
    let found = match mode {
        ReadMode::Shared => conn.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0)),
        // An immutable connection reports "delete" whatever the file is:
        // the file header says (its read and write versions are 2 in WAL).
        ReadMode::Immutable => header_journal_mode(conn),
    };
    match found {
        Err(e) => Finding::failed(CHECK, "read the journal mode", e),
        Ok(mode) if mode.eq_ignore_ascii_case("wal") => Finding::ok(CHECK, "WAL"),
        Ok(mode) => Finding::new(
            CHECK,
            Severity::Error,
            format!(
                "journal mode is {mode}; outboxd needs WAL so the relay and the application \
                 do not block each other"
            ),
        )
        .action(
            "run `outboxd migrate` (it switches the file to WAL); if the mode stays, the file \
             system does not support WAL (a network share?), so move the database to a local \
             disk; make sure the application does not set another journal_mode",
        ),
    }
}

fn wal_size(db: &Path) -> Finding {
    const CHECK: &str = "wal-size";
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    match std::fs::metadata(&wal) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Finding::ok(
            CHECK,
            "no WAL file (nothing written since the last checkpoint)",
        ),
        Err(e) => Finding::failed(CHECK, "read the WAL file's size", e),
        Ok(m) if m.len() > WAL_WARN_BYTES => Finding::new(
            CHECK,
            Severity::Warning,
            format!(
                "the WAL file is {} MiB, above {} MiB: checkpoints cannot reset it; usually \
                 a reader is holding a snapshot (a long read transaction)",
                m.len() >> 20,
                WAL_WARN_BYTES >> 20
            ),
        )
        .action(format!(
            "find and end the long-running reader, then run \
             `sqlite3 {} 'PRAGMA wal_checkpoint(TRUNCATE)'`",
            db.display()
        )),
        Ok(m) => Finding::ok(CHECK, format!("the WAL file is {} KiB", m.len() >> 10)),
    }
}

/// "wal" when the database file's header says WAL (bytes 18 and 19, the
/// file format's write and read versions, are 2), else "delete".
///
/// The header is read through the connection's own file handle
/// (SQLITE_FCNTL_FILE_POINTER), never through a descriptor opened beside
/// it: closing that would release every POSIX lock this process holds on
/// the file (sqlite.org/howtocorrupt.html, section 2.2).
fn header_journal_mode(conn: &Connection) -> rusqlite::Result<String> {
    use rusqlite::ffi;
    let failed = |rc| rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None);
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    let mut header = [0u8; 20];
    // SAFETY: the handle is valid while `conn` lives and is used on this
    // thread only; FILE_POINTER writes one pointer to the main database's
    // open file, which stays open as long as the connection, and its
    // xRead reads at most `header.len()` bytes into `header`.
    let rc = unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        );
        if rc != ffi::SQLITE_OK {
            rc
        } else {
            match file
                .as_ref()
                .and_then(|f| f.pMethods.as_ref())
                .and_then(|m| m.xRead)
            {
                Some(read) => read(file, header.as_mut_ptr().cast(), header.len() as i32, 0),
                None => ffi::SQLITE_CANTOPEN,
            }
        }
    };
    match rc {
        ffi::SQLITE_OK => Ok(if header[18] == 2 && header[19] == 2 {
            "wal"
        } else {
            "delete"
        }
        .to_string()),
        // A file shorter than its header is not one SQLite would open.
        rc => Err(failed(rc)),
    }
}

/// `synchronous` belongs to each connection, not to the file, so doctor
/// cannot read the application's; it reminds instead.
fn synchronous() -> Finding {
    Finding::new(
        "synchronous",
        Severity::Note,
        "synchronous is set per connection, so it cannot be read from the file: outboxd's \
         connections use FULL; in WAL mode NORMAL can lose commits already acknowledged on \
         power loss",
    )
    .action(
        "on the application's connection that enqueues, run `PRAGMA synchronous = FULL` \
         (or call outboxd::connection::configure)",
    )
}

fn outbox(conn: &Connection, stale_after: Duration, now: Timestamp) -> Vec<Finding> {
    let s = match outboxd::status::status(conn, now) {
        Ok(s) => s,
        Err(e) => return vec![Finding::failed("outbox", "read the outbox", e)],
    };
    // Doctor warns on any dead letter; the thresholds are checked by the
    // library, as for `status`.
    let crossed = s.problems(&Thresholds::new(stale_after, Some(0)));
    let stale = crossed.iter().find_map(|p| match p {
        Problem::Stale { oldest_due_age, .. } => Some(*oldest_due_age),
        _ => None,
    });
    let dead = crossed
        .iter()
        .any(|p| matches!(p, Problem::TooManyDead { .. }));
    let mut found = Vec::new();
    found.push(if s.expired_leases > 0 {
        Finding::new(
            "expired-leases",
            Severity::Warning,
            format!(
                "{} claimed by a relay whose lease has expired",
                count(s.expired_leases, "event is", "events are")
            ),
        )
        .action(
            "a relay died or stalled; they will be claimed again by a running relay; \
             check that `outboxd run` is running and look at its logs",
        )
    } else {
        Finding::ok(
            "expired-leases",
            format!("no expired leases ({} live)", s.leases_held),
        )
    });
    found.push(match (stale, s.oldest_due_age) {
        (Some(age), _) => Finding::new(
            "stale-events",
            Severity::Warning,
            format!(
                "{} due; the oldest has waited {} (more than {})",
                events(s.counts.pending_due),
                human(age),
                human(stale_after)
            ),
        )
        .action("check that `outboxd run` is running and its consumers are reachable"),
        (None, Some(age)) => Finding::ok(
            "stale-events",
            format!(
                "{} due; the oldest has waited {}",
                events(s.counts.pending_due),
                human(age)
            ),
        ),
        (None, None) => Finding::ok("stale-events", "no event is waiting"),
    });
    for (check, kind, ok) in [
        (
            "clock",
            "clock-step",
            "no lease or retry ends further ahead than any setting allows",
        ),
        (
            "delayed-events",
            "implausible-delay",
            "no event is delayed by more than a year",
        ),
    ] {
        let problem = crossed
            .iter()
            .map(crate::config::alerts::describe)
            .find(|p| p.threshold == kind);
        found.push(match problem {
            Some(p) => Finding::new(check, Severity::Warning, p.message),
            None => Finding::ok(check, ok),
        });
    }
    found.push(if dead {
        Finding::new(
            "dead-letters",
            Severity::Warning,
            count(s.counts.dead, "dead letter", "dead letters"),
        )
        .action(
            "see why with `outboxd dead list` and `outboxd dead show ID`; fix the cause, then \
             `outboxd dead requeue` them, or `outboxd dead discard` them",
        )
    } else {
        Finding::ok("dead-letters", "no dead letters")
    });
    found
}

fn events(n: u64) -> String {
    count(n, "event", "events")
}

fn open_intents(conn: &Connection, now: Timestamp) -> Finding {
    const CHECK: &str = "publish-intents";
    let open = match intents::list_open(conn) {
        Ok(open) => open,
        Err(e) => return Finding::failed(CHECK, "list publish intents", e),
    };
    let failed = open
        .iter()
        .filter(|i| i.status == IntentStatus::Failed)
        .count();
    let abandoned = open
        .iter()
        .filter(|i| i.claimed_until().is_some_and(|until| until <= now))
        .count();
    if failed + abandoned > 0 {
        Finding::new(
            CHECK,
            Severity::Warning,
            format!(
                "{} open publish intents: {failed} failed, {abandoned} whose sender stopped \
                 mid-send",
                open.len()
            ),
        )
        .action(
            "see them with `outboxd intents list`; their consumers' retries complete them \
             (looking for the output by marker first); a dead-lettered event's intent waits \
             for `outboxd dead requeue`",
        )
    } else if !open.is_empty() {
        Finding::new(
            CHECK,
            Severity::Note,
            format!("{} publish intents recorded or being sent", open.len()),
        )
    } else {
        Finding::ok(CHECK, "no open publish intents")
    }
}

fn write_text(out: &mut impl Write, findings: &[Finding]) -> std::io::Result<()> {
    for f in findings {
        writeln!(
            out,
            "{:<8} {:<16} {}",
            f.severity.label(),
            f.check,
            f.message
        )?;
        if let Some(action) = &f.action {
            writeln!(out, "{:<8} {:<16} -> {action}", "", "")?;
        }
    }
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
    writeln!(
        out,
        "{}: {errors} errors, {warnings} warnings",
        if errors == 0 { "healthy" } else { "unhealthy" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_wal_file_is_a_warning_that_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        assert_eq!(wal_size(&db).severity, Severity::Ok, "no WAL file");
        let wal = std::fs::File::create(dir.path().join("app.db-wal")).unwrap();
        wal.set_len(WAL_WARN_BYTES).unwrap(); // sparse: costs no disk
        assert_eq!(wal_size(&db).severity, Severity::Ok, "at the bound");
        wal.set_len(WAL_WARN_BYTES + (1 << 20)).unwrap();
        let f = wal_size(&db);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("65 MiB"), "{}", f.message);
        assert!(
            f.message.contains("a reader is holding a snapshot"),
            "{}",
            f.message
        );
        let action = f.action.unwrap();
        assert!(action.contains("wal_checkpoint(TRUNCATE)"), "{action}");
        assert!(action.contains("app.db"), "{action}");
    }

    /// True when this process holds a POSIX lock on `path` (/proc/locks).
    fn this_process_locks(path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(path).unwrap().ino().to_string();
        let pid = std::process::id().to_string();
        std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .any(|f| {
                f.get(1) == Some(&"POSIX")
                    && f.get(4) == Some(&pid.as_str())
                    && f.get(5).and_then(|d| d.rsplit(':').next()) == Some(inode.as_str())
            })
    }

    #[test]
    fn the_header_is_read_without_releasing_this_processs_locks() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        // A WAL connection keeps a shared lock on the file while open.
        let writer = outboxd::connection::open(&db).unwrap();
        writer.execute_batch("CREATE TABLE t (x)").unwrap();
        assert!(this_process_locks(&db), "the precondition: a lock is held");
        let uri = format!("file:{}?immutable=1", db.display());
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
        let immutable = Connection::open_with_flags(&uri, flags).unwrap();
        assert_eq!(header_journal_mode(&immutable).unwrap(), "wal");
        assert!(
            this_process_locks(&db),
            "reading the header released the writer's lock"
        );
        drop((immutable, writer));

        let rollback = dir.path().join("rollback.db");
        Connection::open(&rollback)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let uri = format!("file:{}?immutable=1", rollback.display());
        let immutable = Connection::open_with_flags(&uri, flags).unwrap();
        assert_eq!(header_journal_mode(&immutable).unwrap(), "delete");
    }
}
