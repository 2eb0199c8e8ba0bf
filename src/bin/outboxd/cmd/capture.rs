//! `outboxd capture`: install, list and drop the triggers that turn a
//! host's own writes into events (docs/capture.md), acknowledge the gaps
//! they left; `capture snapshot` is in snapshot.rs, `run`'s watch in
//! capture_watch.rs.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::Result;
use outboxd::capture::{self, CaptureStatus, Change, ConfigMatch, GapSelection, Removal};
use outboxd::Timestamp;
use serde::Serialize;

use super::config_arg::ConfigArg;
use super::support::not_found;
use super::{database, Global};
use crate::exit::{Exit, Failure};

pub(crate) use super::capture_watch::Watch;

/// Shown under `outboxd capture --help`.
pub(crate) const EXAMPLES: &str = "\
A capture turns the inserts, updates and deletes of a table into events,
with triggers that run inside the host's own statements: no change to the
host's code. Define captures in the config ([[capture]] entries), install
them with `capture apply`, check them with `capture list` (and `status`,
`doctor`, `run`): a host migration that rebuilds a table drops its
triggers, and writes made while they are missing are not captured; a
snapshot (`capture snapshot`) sends the rows as they are.

Examples:
  outboxd capture apply --config /etc/outboxd/outboxd.toml
  outboxd capture list --config /etc/outboxd/outboxd.toml || page-someone
  outboxd capture snapshot --config /etc/outboxd/outboxd.toml --table cms_page
  outboxd --db cms.db capture drop --table pages";

/// The `capture` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Args {
    /// Install or update the triggers of every [[capture]] in the config, in
    /// one transaction; a capture already installed as defined is left alone.
    #[command(after_help = APPLY_HELP)]
    Apply(ApplyArgs),
    /// Show what is installed, whether its triggers are intact, its gaps and
    /// whether it matches the config; exit 1 when something is wrong.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Remove the triggers of one capture, of a table's captures, or of all.
    #[command(after_help = DROP_HELP)]
    Drop(DropArgs),
    /// Send one `r` event per existing row of a captured table, in short
    /// chunks, resumable; or show (--status) or cancel (--cancel) snapshots.
    #[command(after_help = super::snapshot::HELP)]
    Snapshot(super::snapshot::SnapshotArgs),
    /// Acknowledge recorded capture gaps, so they are no longer a problem.
    #[command(after_help = ACK_HELP)]
    Ack(AckArgs),
}

const APPLY_HELP: &str = "\
Creates or upgrades outboxd's tables first (as `outboxd migrate`), and
switches the database to WAL (it says so when it was not). Every capture is
checked against its table before anything changes: a table or column that
does not exist, a key that is not unique, or a `when` that does not compile
is an error naming it (exit 6), and nothing is installed. Prints what it did
to each capture: installed, updated (and why: the settings that changed, the
triggers that were missing and are back), or unchanged; a capture whose
triggers were missing gets a gap record. Captures installed earlier but no
longer in the config are kept; remove them with `capture drop`. The database
is --db, OUTBOXD_DB, else the config's `database`.

Examples:
  outboxd capture apply --config outboxd.toml
  outboxd --db cms.db capture apply --config capture.toml --json";

const LIST_HELP: &str = "\
Reads only. For each capture: its name, table, operations and event type,
whether its triggers are installed as outboxd installed them, since when they
have not been, its open gaps, and (with --config) whether the config would
install the same, and what differs. Exits 0 when all is well and 1
otherwise.

Examples:
  outboxd --db cms.db capture list
  outboxd capture list --config outboxd.toml --json | jq '.problems'";

const DROP_HELP: &str = "\
Drops the triggers and forgets the capture; writes to the table are no
longer captured. Dropping the last capture also drops the shared view the
triggers write through. Exit code 5 when there is no such capture.

Examples:
  outboxd --db cms.db capture drop --table pages
  outboxd capture drop --config outboxd.toml --capture page-published
  outboxd --db cms.db capture drop --all";

const ACK_HELP: &str = "\
A gap is a window in which a capture's triggers were missing: the host's
writes in it may not have become events. It is a health problem until a
complete snapshot of the capture started after it covers it, or until it is
acknowledged here (you reconciled another way, or accept the loss).

Examples:
  outboxd capture ack --config outboxd.toml --capture cms_page
  outboxd --db cms.db capture ack --gap 3
  outboxd --db cms.db capture ack --all";

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
#[command(group(clap::ArgGroup::new("which").required(true)))]
#[command(mut_arg("config", |a| a.help("The config file naming the database")))]
pub(crate) struct DropArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Every capture of this table.
    #[arg(long, value_name = "TABLE", group = "which")]
    table: Option<String>,
    /// The capture of this name.
    #[arg(long, value_name = "NAME", group = "which")]
    capture: Option<String>,
    /// Every capture.
    #[arg(long, group = "which")]
    all: bool,
}

/// Options of `capture ack`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true)))]
#[command(mut_arg("config", |a| a.help("The config file naming the database")))]
pub(crate) struct AckArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The open gaps of this capture.
    #[arg(long, value_name = "NAME", group = "which")]
    capture: Option<String>,
    /// The open gaps of this table's captures.
    #[arg(long, value_name = "TABLE", group = "which")]
    table: Option<String>,
    /// One gap, by its id (`capture list` shows them).
    #[arg(long, value_name = "ID", group = "which")]
    gap: Option<i64>,
    /// Every open gap.
    #[arg(long, group = "which")]
    all: bool,
}

/// Runs a `capture` subcommand.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    match args {
        Args::Apply(a) => apply(global, a),
        Args::List(a) => list(global, a),
        Args::Drop(a) => drop_captures(global, a),
        Args::Snapshot(a) => super::snapshot::exec(global, a),
        Args::Ack(a) => ack(global, a),
    }
}

/// The journal mode of an existing database file, read without changing
/// it; None when there is no file yet.
fn journal_mode(db: &Path) -> Option<String> {
    if !db.exists() {
        return None;
    }
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()?;
    conn.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
        .ok()
}

/// "pages" or "page-published (pages)": a capture as apply and list name it.
fn label(name: &str, table: &str) -> String {
    if name.eq_ignore_ascii_case(table) {
        table.to_string()
    } else {
        format!("{name} ({table})")
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
    let was = journal_mode(&db);
    database::migrate(&db)?;
    let mut conn = database::for_writing(&db)?;
    let report = capture::apply(&mut conn, &config.captures, Timestamp::now())?;
    let switched = was.filter(|m| !m.eq_ignore_ascii_case("wal"));
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["switched_to_wal_from"] = serde_json::json!(switched);
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    if let Some(mode) = &switched {
        writeln!(
            out,
            "switched {} to WAL journal mode (it was {mode}): outboxd needs it, and the host's \
             connections use it from now on (docs/sql-contract.md)",
            db.display()
        )?;
    }
    if report.shared == Some(Change::Updated) {
        writeln!(
            out,
            "reinstalled the shared view outboxd_capture_event and its triggers (they were \
             missing or changed: the host's writes to captured tables were failing)"
        )?;
    }
    for t in &report.tables {
        let what = match t.change {
            Change::Installed => format!("installed ({} triggers)", t.triggers.len()),
            Change::Updated => {
                let mut why = Vec::new();
                if !t.reinstalled.is_empty() {
                    why.push(format!("reinstalled missing {}", t.reinstalled.join(", ")));
                }
                if !t.replaced.is_empty() {
                    why.push(format!("replaced rewritten {}", t.replaced.join(", ")));
                }
                if let Some(r) = &t.reason {
                    why.push(r.clone());
                }
                format!(
                    "updated ({} triggers): {}",
                    t.triggers.len(),
                    why.join("; ")
                )
            }
            Change::Unchanged => format!("unchanged ({} triggers)", t.triggers.len()),
        };
        writeln!(out, "{}: {what}", label(&t.name, &t.table))?;
    }
    for g in &report.gaps {
        writeln!(
            out,
            "gap {} recorded: {}; send the rows as they are now with `outboxd capture snapshot --capture {}`",
            g.id,
            g.describe(),
            g.capture
        )?;
    }
    for w in &report.warnings {
        writeln!(out, "warning: {w}")?;
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
    let running = capture::snapshot::running(&conn)?;
    let mut problems: Vec<String> = statuses.iter().filter_map(|s| s.problem(now)).collect();
    for s in &statuses {
        problems.extend(
            s.gaps
                .iter()
                .map(|g| format!("gap {}: {}", g.id, g.describe())),
        );
    }
    let mut by_name: BTreeMap<String, ConfigMatch> = BTreeMap::new();
    let mut not_installed = Vec::new();
    if let Some(config) = &config {
        for c in capture::compare(&conn, &config.captures)? {
            let who = label(&c.name, &c.table);
            match &c.state {
                ConfigMatch::NotInstalled => {
                    problems.push(format!(
                        "capture {who} is in the config but not installed; run `outboxd capture apply`"
                    ));
                    not_installed.push(c.name.clone());
                }
                ConfigMatch::Differs { reason } => problems.push(format!(
                    "capture {who} differs from the config: {reason}; run `outboxd capture apply`"
                )),
                ConfigMatch::Invalid { error } => problems.push(format!(
                    "capture {who} cannot be installed as configured: {error}"
                )),
                ConfigMatch::NotInConfig => problems.push(format!(
                    "capture {who} is installed but not in the config; remove it with `outboxd capture drop --capture {}`",
                    c.name
                )),
                ConfigMatch::Matches => {}
            }
            by_name.insert(c.name.to_ascii_lowercase(), c.state);
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let listed: Vec<Listed> = statuses
            .into_iter()
            .map(|s| Listed {
                intact: s.is_intact(),
                config: by_name.get(&s.name.to_ascii_lowercase()).cloned(),
                status: s,
            })
            .collect();
        let value = serde_json::json!({
            "database": db.display().to_string(),
            "captures": listed,
            "not_installed": not_installed,
            "snapshots_running": running,
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
            let config = match by_name.get(&s.name.to_ascii_lowercase()) {
                Some(ConfigMatch::Matches) => "; matches the config".to_string(),
                Some(ConfigMatch::NotInConfig) => "; not in the config".to_string(),
                Some(ConfigMatch::Differs { reason }) => {
                    format!("; differs from the config: {reason}")
                }
                Some(ConfigMatch::Invalid { .. }) => {
                    "; the config's entry cannot be installed".to_string()
                }
                _ => String::new(),
            };
            let gaps = match s.gaps.len() {
                0 => String::new(),
                n => format!("; {n} open gap{}", if n == 1 { "" } else { "s" }),
            };
            let ops: Vec<&str> = s.spec.operations().iter().map(|o| o.name()).collect();
            writeln!(out, "{}: {state}{gaps}{config}", label(&s.name, &s.table))?;
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
        for r in &running {
            let of = r.total.map(|t| format!("/{t}")).unwrap_or_default();
            writeln!(
                out,
                "snapshot {} of {}: running (or stopped: run it again to resume), {}{of} rows read",
                r.id, r.capture, r.scanned
            )?;
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
    let (db, _) = args.config.captures(global)?;
    let mut conn = database::for_writing(&db)?;
    let which = match (&args.table, &args.capture) {
        (Some(t), _) => Removal::Table(t.clone()),
        (_, Some(c)) => Removal::Capture(c.clone()),
        _ => Removal::All,
    };
    let report = capture::remove(&mut conn, &which)
        .map_err(not_found("see the captures with `outboxd capture list`"))?;
    let mut out = std::io::stdout().lock();
    for t in &report.tables {
        writeln!(out, "dropped capture {t}")?;
    }
    writeln!(out, "{} triggers and views dropped", report.triggers.len())?;
    Ok(Exit::Ok)
}

fn ack(global: &Global, args: &AckArgs) -> Result<Exit> {
    let (db, _) = args.config.captures(global)?;
    let conn = database::for_writing(&db)?;
    let which = match (&args.capture, &args.table, args.gap) {
        (Some(c), ..) => GapSelection::Capture(c.clone()),
        (_, Some(t), _) => GapSelection::Table(t.clone()),
        (_, _, Some(id)) => GapSelection::Id(id),
        _ => GapSelection::All,
    };
    let n = capture::ack(&conn, &which, Timestamp::now())?;
    writeln!(
        std::io::stdout().lock(),
        "{}",
        super::support::count(n as u64, "gap acknowledged", "gaps acknowledged")
    )?;
    Ok(Exit::Ok)
}
