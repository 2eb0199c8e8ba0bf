//! `outboxd capture snapshot`: one `r` event per existing row of a captured
//! table (docs/capture.md#snapshots), with a progress bar on a terminal;
//! `--status` and `--cancel`.

use std::io::{IsTerminal, Write};

use anyhow::Result;
use outboxd::capture::snapshot::{
    self, Snapshot, SnapshotOptions, SnapshotSelection, SnapshotState,
};
use outboxd::Timestamp;

use super::config_arg::ConfigArg;
use super::support::not_found;
use super::{database, Global};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd capture snapshot --help`.
pub(crate) const HELP: &str = "\
Reads the table in chunks (each read and written in one short transaction,
so the host's writers wait for one chunk at most) and writes one event per
row: op \"r\", the capture's event type with {op} as `snapshot`
(page.snapshot.v1), the payload of an insert (`after` only), the key and
ordering key of live changes. A row's live changes are ordered against its r
event. Markers `<type with {op} as snapshot_started / snapshot_completed>`
carry the snapshot id, the table and, at the end, the row count. A capture's
insert `when` filters the rows; --where filters them further. A capture whose
update condition reads OLD, or of deletes only, is not snapshotted.

Resumable: after a crash, kill -9 or Ctrl-C, run the same command again and
it goes on from the last chunk written (every row once). A table rebuilt
meanwhile stops it with a message. --status lists the snapshots, --cancel
stops one (its process stops at its next chunk).

Examples:
  outboxd capture snapshot --config outboxd.toml --table cms_page
  outboxd capture snapshot --config outboxd.toml --capture page --where \"live = 1\" --rate 500
  outboxd --db cms.db capture snapshot --status
  outboxd --db cms.db capture snapshot --cancel 01JDQ8F6ZC1Y0D3W9N7K2M4P5R";

/// Options of `capture snapshot`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true)))]
#[command(mut_arg("config", |a| a.help("The config file naming the database")))]
pub(crate) struct SnapshotArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Snapshot this capture (repeat for several).
    #[arg(long, value_name = "NAME", group = "what")]
    capture: Vec<String>,
    /// Snapshot every capture of this table that can be snapshotted.
    #[arg(long, value_name = "TABLE", group = "what")]
    table: Option<String>,
    /// Only the rows meeting this SQL condition on the table's columns.
    #[arg(long = "where", value_name = "SQL")]
    filter: Option<String>,
    /// At most this many rows read per second.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// The most rows one chunk (one write transaction) reads.
    #[arg(long, value_name = "ROWS", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    chunk: u32,
    /// List the snapshots and their progress instead.
    #[arg(long, group = "what")]
    status: bool,
    /// Cancel this running snapshot (by id) instead.
    #[arg(long, value_name = "ID", group = "what")]
    cancel: Option<String>,
    /// Print JSON (the final snapshots, or the list) instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `capture snapshot`.
pub(crate) fn exec(global: &Global, args: &SnapshotArgs) -> Result<Exit> {
    let (db, _) = args.config.captures(global)?;
    if args.status {
        let conn = database::for_reading(&db)?;
        return status(&snapshot::snapshots(&conn, 50)?, args.json);
    }
    let mut conn = database::for_writing(&db)?;
    if let Some(id) = &args.cancel {
        let done = snapshot::cancel(&conn, &SnapshotSelection::Id(id.clone()), Timestamp::now())?;
        if done.is_empty() {
            return Err(Failure::input(format!(
                "no running snapshot {id}; see them with `outboxd capture snapshot --status`"
            ))
            .into());
        }
        writeln!(std::io::stdout().lock(), "cancelled snapshot {id}")?;
        return Ok(Exit::Ok);
    }
    let names = match &args.table {
        Some(t) => {
            let names = snapshot::snapshottable(&conn, t)?;
            if names.is_empty() {
                return Err(Failure::input(format!(
                    "no capture of table {t:?} can be snapshotted (none installed, or each reads \
                     OLD or captures deletes only); see `outboxd capture list`"
                ))
                .into());
            }
            names
        }
        None => args.capture.clone(),
    };
    let opts = SnapshotOptions {
        filter: args.filter.clone(),
        chunk_rows: args.chunk as usize,
        rate: args.rate,
        origin: "cli".into(),
        ..SnapshotOptions::default()
    };
    let bar = std::io::stderr().is_terminal();
    let mut done = Vec::new();
    for name in &names {
        let s = snapshot::run(&mut conn, name, &opts, |s| {
            if bar {
                draw(s);
            }
            true
        })
        .map_err(not_found("see the captures with `outboxd capture list`"))?;
        if bar {
            eprintln!();
        }
        if !args.json {
            writeln!(std::io::stdout().lock(), "{}", summary(&s))?;
        }
        done.push(s);
    }
    if args.json {
        serde_json::to_writer(std::io::stdout().lock(), &done)?;
        writeln!(std::io::stdout().lock())?;
    }
    Ok(
        if done.iter().all(|s| s.state == SnapshotState::Completed) {
            Exit::Ok
        } else {
            Exit::Problems
        },
    )
}

/// The progress line: a bar when the row count is known.
fn draw(s: &Snapshot) {
    const WIDTH: u64 = 30;
    let bar = match s.total.filter(|t| *t > 0) {
        Some(t) => {
            let full = (s.scanned.min(t) * WIDTH / t) as usize;
            format!(
                "[{}{}] {}/{t} rows",
                "#".repeat(full),
                " ".repeat(WIDTH as usize - full),
                s.scanned
            )
        }
        None => format!("{} rows", s.scanned),
    };
    let secs = s.updated_at.since(s.started_at).as_secs_f64().max(0.001);
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r{}: {bar}, {} events, {:.0} rows/s ",
        s.capture,
        s.rows,
        s.scanned as f64 / secs
    );
    let _ = err.flush();
}

fn summary(s: &Snapshot) -> String {
    let how = match s.state {
        SnapshotState::Completed => "completed".to_string(),
        SnapshotState::Running => "stopped before its end (run it again to resume)".to_string(),
        other => format!("{}: {}", other.as_str(), s.message.as_deref().unwrap_or("")),
    };
    format!(
        "snapshot {} of capture {} ({}): {how}: {} rows read, {} r events",
        s.id, s.capture, s.table, s.scanned, s.rows
    )
}

fn status(list: &[Snapshot], json: bool) -> Result<Exit> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, list)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    if list.is_empty() {
        writeln!(out, "no snapshot")?;
    }
    for s in list {
        let of = s.total.map(|t| format!("/{t}")).unwrap_or_default();
        writeln!(
            out,
            "{} {} of {} ({}): {}{of} rows read, {} events; started {} by {}, last chunk {}{}",
            s.id,
            s.state.as_str(),
            s.capture,
            s.table,
            s.scanned,
            s.rows,
            s.started_at,
            s.origin,
            s.updated_at,
            s.message
                .as_deref()
                .map(|m| format!("; {m}"))
                .unwrap_or_default()
        )?;
    }
    Ok(Exit::Ok)
}
