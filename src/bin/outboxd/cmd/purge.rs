//! `outboxd purge`: delete finished rows past their retention.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::purge::{purge_dry_run, purge_with_progress, PurgePolicy, PurgeReport};
use outboxd::Timestamp;

use super::support::{human, Progress};
use super::{database, Global};
use crate::args::parse_duration;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd purge --help`.
pub const EXAMPLES: &str = "\
Deletes delivered events older than --delivered-retention, dedup entries
older than --dedup-ttl and, only with --dead-retention, dead letters older
than that; pending events are never touched. Works in small transactions so
the application's writes are never blocked for long, and shows progress on a
terminal. `outboxd run` purges on its own as well; this is for a one-off
clean-up. --dry-run counts without deleting (and opens the file read-only).

Examples:
  outboxd --db app.db purge --dry-run
  outboxd --db app.db purge --delivered-retention 1d --dedup-ttl 2d --dead-retention 30d";

/// Options of `outboxd purge`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Count what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Delete delivered events finished longer ago than this [default: 7d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    delivered_retention: Option<Duration>,
    /// Forget deliveries (the dedup ledger) older than this; at least the
    /// delivered retention [default: 14d, or the delivered retention if longer].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    dedup_ttl: Option<Duration>,
    /// Delete dead letters older than this [default: keep them].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    dead_retention: Option<Duration>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Purges (or counts) and prints what went.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let policy = policy(args)?;
    let now = Timestamp::now();
    let report = if args.dry_run {
        purge_dry_run(&database::for_reading(&global.db)?, &policy, now)?
    } else {
        let mut conn = database::for_writing(&global.db)?;
        let mut progress = Progress::stderr();
        let report = purge_with_progress(&mut conn, &policy, now, |r| {
            progress.show(&format!(
                "purging: {} delivered, {} dead, {} dedup entries deleted",
                r.delivered, r.dead, r.dedup_entries
            ));
        })?;
        progress.finish();
        report
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let value = serde_json::json!({
            "dry_run": args.dry_run,
            "delivered": report.delivered,
            "dead": report.dead,
            "dedup_entries": report.dedup_entries,
        });
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, args.dry_run, &report, &policy)?;
    }
    Ok(Exit::Ok)
}

/// The library's defaults, with the flags given on top; checked here so the
/// message names the flags.
fn policy(args: &Args) -> Result<PurgePolicy> {
    // The library subtracts a retention from now in i64 milliseconds; one
    // past i64::MAX would wrap into a cutoff in the future and purge every
    // finished row. Nothing sensible is longer than a century.
    const LONGEST: Duration = Duration::from_secs(100 * 365 * 86_400);
    for (flag, d) in [
        ("--delivered-retention", args.delivered_retention),
        ("--dedup-ttl", args.dedup_ttl),
        ("--dead-retention", args.dead_retention),
    ] {
        if d.is_some_and(|d| d > LONGEST) {
            return Err(Failure::input(format!(
                "{flag} is longer than 100 years (36500d); give a shorter duration"
            ))
            .into());
        }
    }
    let mut policy = PurgePolicy::default();
    if let Some(d) = args.delivered_retention {
        policy.delivered_retention = d;
    }
    match args.dedup_ttl {
        Some(d) => policy.dedup_ttl = d,
        // The ledger must outlive every kept row; follow a longer retention.
        None => policy.dedup_ttl = policy.dedup_ttl.max(policy.delivered_retention),
    }
    policy.dead_retention = args.dead_retention;
    if policy.dedup_ttl < policy.delivered_retention {
        return Err(Failure::input(format!(
            "--dedup-ttl ({}) is shorter than --delivered-retention ({}); the dedup ledger must \
             remember every delivered event still kept, so give a --dedup-ttl of at least {}",
            human(policy.dedup_ttl),
            human(policy.delivered_retention),
            human(policy.delivered_retention)
        ))
        .into());
    }
    Ok(policy)
}

fn write_text(
    out: &mut impl Write,
    dry_run: bool,
    r: &PurgeReport,
    policy: &PurgePolicy,
) -> std::io::Result<()> {
    let verb = if dry_run { "would delete" } else { "deleted" };
    writeln!(
        out,
        "{verb} {} delivered events (finished over {} ago)",
        r.delivered,
        human(policy.delivered_retention)
    )?;
    match policy.dead_retention {
        Some(d) => writeln!(
            out,
            "{verb} {} dead letters (over {} ago)",
            r.dead,
            human(d)
        )?,
        None => writeln!(out, "kept every dead letter (no --dead-retention)")?,
    }
    writeln!(
        out,
        "{verb} {} dedup entries (over {} ago)",
        r.dedup_entries,
        human(policy.dedup_ttl)
    )
}
