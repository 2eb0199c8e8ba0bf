//! `outboxd purge`: delete finished rows past their retention.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::error::Setting;
use outboxd::purge::{purge_dry_run, purge_with_progress, PurgePolicy, PurgeReport};
use outboxd::Timestamp;

use super::support::{count, human, Progress};
use super::{database, Global};
use crate::args::parse_duration;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd purge --help`.
pub const EXAMPLES: &str = "\
Deletes delivered events older than --delivered-retention, dedup entries
older than --dedup-ttl, completed publish intents older than
--intent-retention and, only with --dead-retention, dead letters older than
that; pending events, and intents still pending or failed, are never
touched. Works in small transactions so the application's writes are never
blocked for long, and shows progress on a terminal. `outboxd run` purges on
its own as well; this is for a one-off clean-up. --dry-run counts without
deleting (and opens the file read-only).

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
    /// Delete publish intents completed longer ago than this [default: 30d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    intent_retention: Option<Duration>,
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
                "purging: {} delivered, {} dead, {} dedup entries, {} intents deleted",
                r.delivered, r.dead, r.dedup_entries, r.intents
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
            "intents": report.intents,
        });
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, args.dry_run, &report, &policy)?;
    }
    Ok(Exit::Ok)
}

/// The library's defaults with the flags given on top; the library checks
/// it, and its verdict is worded with the flags (its reason names the
/// config's fields).
fn policy(args: &Args) -> Result<PurgePolicy> {
    let d = PurgePolicy::default();
    let delivered = args.delivered_retention.unwrap_or(d.delivered_retention);
    // The ledger must outlive every kept row: follow a longer retention.
    let dedup = args.dedup_ttl.unwrap_or_else(|| d.dedup_ttl.max(delivered));
    let policy = PurgePolicy::default()
        .delivered_retention(delivered)
        .dedup_ttl(dedup)
        .dead_retention(args.dead_retention)
        .intent_retention(args.intent_retention.unwrap_or(d.intent_retention));
    policy.validate().map_err(|e| {
        Failure::input(match e.setting() {
            Setting::PurgeDedupTtl => format!(
                "--dedup-ttl: {} is shorter than --delivered-retention ({}{}); the dedup \
                 window must cover every kept row",
                human(dedup),
                human(delivered),
                if args.delivered_retention.is_none() {
                    ", its default"
                } else {
                    ""
                }
            ),
            _ => format!("purge: {}", e.reason()),
        })
    })?;
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
        "{verb} {} (finished over {} ago)",
        count(r.delivered, "delivered event", "delivered events"),
        human(policy.delivered_retention)
    )?;
    match policy.dead_retention {
        Some(d) => writeln!(
            out,
            "{verb} {} (over {} ago)",
            count(r.dead, "dead letter", "dead letters"),
            human(d)
        )?,
        None => writeln!(out, "kept every dead letter (no --dead-retention)")?,
    }
    writeln!(
        out,
        "{verb} {} (over {} ago)",
        count(r.dedup_entries, "dedup entry", "dedup entries"),
        human(policy.dedup_ttl)
    )?;
    writeln!(
        out,
        "{verb} {} (completed over {} ago)",
        count(
            r.intents,
            "completed publish intent",
            "completed publish intents"
        ),
        human(policy.intent_retention)
    )
}
