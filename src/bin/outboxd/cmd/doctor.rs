//! `outboxd doctor`: inspect a database and say what to do about what is
//! wrong with it.

mod file;
mod finding;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use outboxd::connection::ReadMode;
use outboxd::health::{Problem, Thresholds};
use outboxd::intents::{self, IntentStatus};
use outboxd::Timestamp;
use rusqlite::Connection;

use super::support::{count, human};
use super::{database, Global};
use crate::args::parse_duration;
use crate::config::alerts::{self, Verdict};
use crate::config::Config;
use crate::exit::{Exit, Failure};
use finding::{Finding, Severity};

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

With --config (or OUTBOXD_CONFIG), the database and the health thresholds
are the config's (`database`, [alerts]); --db, OUTBOXD_DB and --stale-after
win over it. The health verdict (\"health\" in --json) is `outboxd
status`'s. The sinks that can be asked are checked too: a nats sink's
stream, and its duplicate window against the consumer's retry schedule.

Examples:
  outboxd --db app.db doctor
  outboxd doctor --config /etc/outboxd/outboxd.toml
  outboxd --db app.db doctor --json | jq '.findings[] | select(.severity != \"ok\")'";

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
    let (mut findings, verdict) = examine(&conn, mode, &db, args.quick, &alerts, now);
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
        let mut value = serde_json::json!({
            "database": db.display().to_string(),
            "healthy": healthy,
            "findings": findings,
        });
        // The health verdict, as `status --json` gives it.
        if let Some(v) = &verdict {
            value["health"] = serde_json::json!({
                "healthy": v.is_empty(),
                "problems": &**v,
            });
        }
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &findings, verdict.as_ref())?;
    }
    Ok(if healthy { Exit::Ok } else { Exit::Problems })
}

/// Every finding, and the health verdict when the schema is current and
/// the verdict could be read (its problems are findings too).
fn examine(
    conn: &Connection,
    mode: ReadMode,
    db: &Path,
    quick: bool,
    thresholds: &Thresholds,
    now: Timestamp,
) -> (Vec<Finding>, Option<Verdict>) {
    let mut findings = vec![
        file::integrity(conn, quick, db),
        file::journal_mode(conn, mode),
        file::wal_size(db),
        file::synchronous(),
    ];
    let schema = file::schema(conn);
    let current = schema.severity == Severity::Ok;
    findings.insert(1, schema);
    if !current {
        return (findings, None);
    }
    let verdict = match alerts::verdict(conn, thresholds, now) {
        Ok(v) => v,
        Err(e) => {
            findings.push(Finding::failed("health", "check the health thresholds", e));
            return (findings, None);
        }
    };
    findings.extend(outbox(conn, &verdict, now));
    findings.push(open_intents(conn, now));
    findings.extend(captures(&verdict));
    (findings, Some(verdict))
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
    let mut findings = Vec::new();
    for c in &config.consumers {
        match c.sink.probe(&c.name, &c.retry, &config.relay) {
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

/// Capture triggers missing or changed (a host migration rebuilt a table):
/// an error each, since the host's writes go uncaptured.
fn captures(verdict: &Verdict) -> Vec<Finding> {
    const CHECK: &str = "capture";
    let found: Vec<Finding> = verdict
        .iter()
        .filter(|p| p.kind == CHECK || p.kind == "capture_gap")
        .map(|p| Finding::new(CHECK, Severity::Error, p.message.clone()))
        .collect();
    if found.is_empty() {
        vec![Finding::ok(
            CHECK,
            "no capture trigger is missing or changed, and no capture gap is open",
        )]
    } else {
        found
    }
}

/// The outbox's findings: its status, and the verdict's problems (stale,
/// clock step, implausible delays, dead letters) as warnings.
fn outbox(conn: &Connection, verdict: &Verdict, now: Timestamp) -> Vec<Finding> {
    let s = match outboxd::status::status(conn, now) {
        Ok(s) => s,
        Err(e) => return vec![Finding::failed("outbox", "read the outbox", e)],
    };
    let crossed = &verdict.health.problems;
    let stale = crossed.iter().find_map(|p| match p {
        Problem::Stale {
            oldest_due_age,
            stale_after,
        } => Some((*oldest_due_age, *stale_after)),
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
        (Some((age, stale_after)), _) => Finding::new(
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
            "undelivered-events",
            "max-undelivered-age",
            "no event due, being delivered or retrying is older than alerts.max_undelivered_age",
        ),
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
        let problem = verdict.iter().find(|p| p.threshold == kind);
        found.push(match problem {
            Some(p) => Finding::new(check, Severity::Warning, p.message.clone()),
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

fn write_text(
    out: &mut impl Write,
    findings: &[Finding],
    verdict: Option<&Verdict>,
) -> std::io::Result<()> {
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
    if let Some(v) = verdict {
        let kinds: Vec<&str> = v.iter().map(|p| p.kind).collect();
        match kinds.is_empty() {
            true => writeln!(out, "{:<8} {:<16} ok", "", "health")?,
            false => writeln!(
                out,
                "{:<8} {:<16} PROBLEMS: {}",
                "",
                "health",
                kinds.join(", ")
            )?,
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
