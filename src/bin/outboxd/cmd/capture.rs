//! `outboxd capture`: install, list and drop the triggers that turn a
//! host's own writes into events (docs/capture.md). Also the capture checks
//! `status`, `doctor` and `run` make.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outboxd::capture::{self, CaptureSpec, CaptureStatus, ConfigMatch, Removal};
use outboxd::Timestamp;
use rusqlite::Connection;
use serde::Serialize;

use super::config_arg::ConfigArg;
use super::support::not_found;
use super::{database, Global};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd capture --help`.
pub(crate) const EXAMPLES: &str = "\
A capture turns the inserts, updates and deletes of a table into events,
with triggers that run inside the host's own statements: no change to the
host's code. Define captures in the config ([[capture]] entries), install
them with `capture apply`, check them with `capture list` (and `status`,
`doctor`, `run`): a host migration that rebuilds a table drops its
triggers, and writes made while they are missing are not captured.

Examples:
  outboxd capture apply --config /etc/outboxd/outboxd.toml
  outboxd capture list --config /etc/outboxd/outboxd.toml || page-someone
  outboxd --db cms.db capture drop --table pages";

/// The `capture` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Args {
    /// Install or update the triggers of every [[capture]] in the config, in
    /// one transaction; a capture already installed as defined is left alone.
    #[command(after_help = APPLY_HELP)]
    Apply(ApplyArgs),
    /// Show what is installed, whether its triggers are intact and whether it
    /// matches the config; exit 1 when something is wrong.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Remove the triggers of one captured table, or of all.
    #[command(after_help = DROP_HELP)]
    Drop(DropArgs),
}

const APPLY_HELP: &str = "\
Creates or upgrades outboxd's tables first (as `outboxd migrate`). Every
capture is checked against its table before anything changes: a table or
column that does not exist, a key that is not unique, or a `when` that does
not compile is an error naming it (exit 6), and nothing is installed.
Captures installed earlier but no longer in the config are kept; remove
them with `capture drop`. The database is --db, OUTBOXD_DB, else the
config's `database`.

Examples:
  outboxd capture apply --config outboxd.toml
  outboxd --db cms.db capture apply --config capture.toml --json";

const LIST_HELP: &str = "\
Reads only. For each capture: its operations and event type, whether its
triggers are installed as outboxd installed them, since when they have not
been, and (with --config) whether the config would install the same. Exits 0
when all is well and 1 otherwise.

Examples:
  outboxd --db cms.db capture list
  outboxd capture list --config outboxd.toml --json | jq '.problems'";

const DROP_HELP: &str = "\
Drops the triggers and forgets the capture; writes to the table are no
longer captured. Dropping the last capture also drops the shared view the
triggers write through. Exit code 5 when the table is not captured.

Examples:
  outboxd --db cms.db capture drop --table pages
  outboxd --db cms.db capture drop --all";

/// Options of `capture apply`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| {
    a.help("The config file whose [[capture]] entries to install").required(true)
}))]
pub(crate) struct ApplyArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `capture list`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help("Compare with the [[capture]] entries of this config")))]
pub(crate) struct ListArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `capture drop`.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct DropArgs {
    /// The captured table.
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// Every capture.
    #[arg(long)]
    all: bool,
}

/// Runs a `capture` subcommand.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    match args {
        Args::Apply(a) => apply(global, a),
        Args::List(a) => list(global, a),
        Args::Drop(a) => drop_captures(global, a),
    }
}

fn apply(global: &Global, args: &ApplyArgs) -> Result<Exit> {
    let (db, config) = args.config.captures(global)?;
    // clap refuses the command line without --config.
    let Some(config) = config else {
        unreachable!("--config is required");
    };
    if config.captures.is_empty() {
        return Err(Failure::config(format!(
            "config {}: no [[capture]] entry; nothing to apply",
            config.file.display()
        ))
        .into());
    }
    database::migrate(&db)?;
    let mut conn = database::for_writing(&db)?;
    let report = capture::apply(&mut conn, &config.captures, Timestamp::now())?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
    } else {
        for t in &report.tables {
            let what = match t.change {
                capture::Change::Installed => "installed",
                capture::Change::Updated => "updated",
                capture::Change::Unchanged => "unchanged",
            };
            writeln!(out, "{}: {what} ({} triggers)", t.table, t.triggers.len())?;
        }
        for w in &report.warnings {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(Exit::Ok)
}

/// One capture as `capture list --json` shows it.
#[derive(Debug, Serialize)]
struct Listed {
    #[serde(flatten)]
    status: CaptureStatus,
    intact: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<ConfigMatch>,
}

fn list(global: &Global, args: &ListArgs) -> Result<Exit> {
    let (db, config) = args.config.captures(global)?;
    let conn = database::for_reading(&db)?;
    let now = Timestamp::now();
    let statuses = capture::inspect(&conn)?;
    let mut problems: Vec<String> = statuses.iter().filter_map(|s| s.problem(now)).collect();
    let mut by_table: BTreeMap<String, ConfigMatch> = BTreeMap::new();
    let mut not_installed = Vec::new();
    if let Some(config) = &config {
        for c in capture::compare(&conn, &config.captures)? {
            match &c.state {
                ConfigMatch::NotInstalled => {
                    problems.push(format!(
                        "capture of {} is in the config but not installed; run `outboxd capture apply`",
                        c.table
                    ));
                    not_installed.push(c.table.clone());
                }
                ConfigMatch::Differs { reason } => problems.push(format!(
                    "capture of {} differs from the config ({reason}); run `outboxd capture apply`",
                    c.table
                )),
                ConfigMatch::Invalid { error } => problems.push(format!(
                    "capture of {} cannot be installed as configured: {error}",
                    c.table
                )),
                ConfigMatch::NotInConfig => problems.push(format!(
                    "capture of {} is installed but not in the config; remove it with `outboxd capture drop --table {}`",
                    c.table, c.table
                )),
                ConfigMatch::Matches => {}
            }
            by_table.insert(c.table.to_ascii_lowercase(), c.state);
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let listed: Vec<Listed> = statuses
            .into_iter()
            .map(|s| Listed {
                intact: s.is_intact(),
                config: by_table.get(&s.table.to_ascii_lowercase()).cloned(),
                status: s,
            })
            .collect();
        let value = serde_json::json!({
            "database": db.display().to_string(),
            "captures": listed,
            "not_installed": not_installed,
            "healthy": problems.is_empty(),
            "problems": problems,
        });
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        if statuses.is_empty() {
            writeln!(out, "no capture installed in {}", db.display())?;
        }
        for s in &statuses {
            let state = if s.is_intact() { "intact" } else { "PROBLEM" };
            let config = match by_table.get(&s.table.to_ascii_lowercase()) {
                Some(ConfigMatch::Matches) => "; matches the config",
                Some(ConfigMatch::NotInConfig) => "; not in the config",
                Some(_) => "; differs from the config",
                None => "",
            };
            let ops: Vec<&str> = s.spec.operations().iter().map(|o| o.name()).collect();
            writeln!(out, "{}: {state}{config}", s.table)?;
            writeln!(
                out,
                "  {} -> {}; installed {}, last seen intact {}",
                ops.join(", "),
                s.spec.event_type,
                s.installed_at,
                s.verified_at
            )?;
        }
        for t in &not_installed {
            writeln!(out, "{t}: NOT INSTALLED; in the config")?;
        }
        if !problems.is_empty() {
            writeln!(out, "problems:")?;
            for p in &problems {
                writeln!(out, "  {p}")?;
            }
        }
    }
    Ok(if problems.is_empty() {
        Exit::Ok
    } else {
        Exit::Problems
    })
}

fn drop_captures(global: &Global, args: &DropArgs) -> Result<Exit> {
    let mut conn = database::for_writing(&global.db)?;
    let which = match &args.table {
        Some(t) => Removal::Table(t.clone()),
        None => Removal::All,
    };
    let report = capture::remove(&mut conn, &which)
        .map_err(not_found("see the captures with `outboxd capture list`"))?;
    let mut out = std::io::stdout().lock();
    for t in &report.tables {
        writeln!(out, "dropped the capture of {t}")?;
    }
    writeln!(out, "{} triggers and views dropped", report.triggers.len())?;
    Ok(Exit::Ok)
}

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
/// `auto_repair`, and records when captures were seen intact
/// ([`capture::mark_verified`], rarely: see [`RECORD_INTACT_EVERY`]), so a
/// later warning can say since when a trigger has been missing. It keeps one
/// connection of its own (reopened after an error); the relay is not
/// involved.
pub(crate) struct Watch {
    db: PathBuf,
    conn: Option<Connection>,
    /// The config's captures, by table (lower case).
    config: BTreeMap<String, CaptureSpec>,
    interval: Duration,
    last: Option<Instant>,
    /// When `verified_at` was last written for the intact captures.
    recorded: Option<Instant>,
    /// Per table (lower case): the last check that saw it intact, not yet
    /// written.
    seen_intact: BTreeMap<String, Timestamp>,
    /// What was last said about each table, and when.
    said: BTreeMap<String, (String, Instant)>,
}

impl Watch {
    /// A watch of `db` with the config's captures; checks once at once.
    pub(crate) fn start(db: &Path, captures: &[CaptureSpec], interval: Duration) -> Watch {
        let mut w = Watch::new(db, captures, interval);
        w.compare_config();
        w.tick();
        w
    }

    fn new(db: &Path, captures: &[CaptureSpec], interval: Duration) -> Watch {
        Watch {
            db: db.to_path_buf(),
            conn: None,
            config: captures
                .iter()
                .map(|s| (s.table.to_ascii_lowercase(), s.clone()))
                .collect(),
            interval,
            last: None,
            recorded: None,
            seen_intact: BTreeMap::new(),
            said: BTreeMap::new(),
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
            let key = s.table.to_ascii_lowercase();
            if !s.is_intact() {
                // Broken now: record when it was last seen intact, which
                // the database does not know yet, and say so.
                if let Some(at) = self.seen_intact.remove(&key) {
                    record.push((s.table.clone(), at));
                    s.verified_at = s.verified_at.max(at);
                }
            }
            let Some(problem) = s.problem(now) else {
                if self.said.remove(&key).is_some() {
                    tracing::info!(table = %s.table, "capture triggers are intact again");
                }
                if record_intact {
                    record.push((s.table.clone(), now));
                    self.seen_intact.remove(&key);
                } else {
                    self.seen_intact.insert(key, now);
                }
                continue;
            };
            let repair = self.config.get(&key).filter(|c| c.auto_repair);
            if let Some(spec) = repair {
                match capture::apply(conn, std::slice::from_ref(spec), now) {
                    Ok(_) => {
                        tracing::warn!(table = %s.table, was = %problem, "capture triggers reinstalled (capture.auto_repair)");
                        self.said.remove(&key);
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(table = %s.table, error = %e, "cannot reinstall the capture triggers (capture.auto_repair)")
                    }
                }
            }
            let repeat = match self.said.get(&key) {
                Some((said, at)) => *said != problem || at.elapsed() >= REMIND_EVERY,
                None => true,
            };
            if repeat {
                tracing::warn!(table = %s.table, "{problem}; reinstall with `outboxd capture apply`, or set auto_repair = true in its [[capture]]");
                self.said.insert(key, (problem, Instant::now()));
            }
        }
        capture::mark_verified(conn, &record)?;
        if record_intact {
            self.recorded = Some(Instant::now());
        }
        Ok(())
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
                            tracing::warn!(table = %c.table, "capture is in the config but not installed: run `outboxd capture apply`")
                        }
                        ConfigMatch::Differs { reason } => {
                            tracing::warn!(table = %c.table, %reason, "capture differs from the config: run `outboxd capture apply`")
                        }
                        ConfigMatch::Invalid { error } => {
                            tracing::warn!(table = %c.table, %error, "capture in the config cannot be installed")
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
    use outboxd::capture::Columns;

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
