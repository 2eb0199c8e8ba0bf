//! `outboxd purge`: delete finished rows past their retention.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::error::Setting;
use outboxd::purge::{purge_dry_run, purge_with_progress, PurgePolicy, PurgeReport};
use outboxd::Timestamp;

use super::config_arg::ConfigArg;
use super::support::{count, human, Progress};
use super::{database, Global};
use crate::args::parse_duration;
use crate::config::purge::Retentions;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd purge --help`.
pub(crate) const EXAMPLES: &str = "\
Deletes delivered events older than --delivered-retention, dedup entries
older than --dedup-ttl, completed publish intents older than
--intent-retention and, only with --dead-retention, dead letters older than
that; pending events, and intents still pending or failed, are never
touched. Works in small transactions so the application's writes are never
blocked for long, and shows progress on a terminal. `outboxd run` purges on
its own as well; this is for a one-off clean-up. --dry-run counts without
deleting (and opens the file read-only).

With --config (or OUTBOXD_CONFIG), the database and the retentions are the
config's ([purge], even with enabled = false, which only turns off the
purging inside `outboxd run`); the flags win over it.

Examples:
  outboxd --db app.db purge --dry-run
  outboxd purge --config /etc/outboxd/outboxd.toml --dry-run
  outboxd --db app.db purge --delivered-retention 1d --dedup-ttl 2d --dead-retention 30d";

/// Options of `outboxd purge`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help(
    "Take the database and the retentions ([purge]) from this config file"
)))]
pub(crate) struct Args {
    /// Count what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    config: ConfigArg,
    /// Delete delivered events finished longer ago than this [default: the
    /// config's purge.delivered_retention, else 7d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    delivered_retention: Option<Duration>,
    /// Forget deliveries (the dedup ledger) older than this; at least the
    /// delivered retention [default: the config's purge.dedup_ttl, else
    /// 14d, or the delivered retention if longer].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    dedup_ttl: Option<Duration>,
    /// Delete dead letters older than this [default: the config's
    /// purge.dead_retention, else keep them].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    dead_retention: Option<Duration>,
    /// Delete publish intents completed longer ago than this [default: the
    /// config's purge.intent_retention, else 30d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    intent_retention: Option<Duration>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Purges (or counts) and prints what went.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let (db, config) = args.config.summary(global)?;
    let configured = config.map(|c| c.purge);
    let policy = policy(args, configured.as_ref())?;
    let now = Timestamp::now();
    let report = if args.dry_run {
        purge_dry_run(&database::for_reading(&db)?, &policy, now)?
    } else {
        let mut conn = database::for_writing(&db)?;
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

/// The config's retentions (or the library's defaults) with the flags
/// given on top; the library checks it, and its verdict names where each
/// of the two values came from: a flag, the config, or the default.
fn policy(args: &Args, configured: Option<&Retentions>) -> Result<PurgePolicy> {
    let base = configured.map_or_else(PurgePolicy::default, |c| c.policy.clone());
    let from_config = |set: fn(&Retentions) -> bool| configured.is_some_and(set);
    let delivered = args.delivered_retention.unwrap_or(base.delivered_retention);
    // The ledger must outlive every kept row: follow a longer retention,
    // unless the dedup window was given.
    let dedup = args.dedup_ttl.unwrap_or_else(|| {
        if from_config(|c| c.dedup_ttl_set) {
            base.dedup_ttl
        } else {
            base.dedup_ttl.max(delivered)
        }
    });
    let policy = base
        .clone()
        .delivered_retention(delivered)
        .dedup_ttl(dedup)
        .dead_retention(args.dead_retention.or(base.dead_retention))
        .intent_retention(args.intent_retention.unwrap_or(base.intent_retention));
    policy.validate().map_err(|e| {
        Failure::input(match e.setting() {
            Setting::PurgeDedupTtl => format!(
                "{}: {} is shorter than {} ({}{}); the dedup window must cover every kept row",
                if args.dedup_ttl.is_some() {
                    "--dedup-ttl"
                } else {
                    "the config's purge.dedup_ttl"
                },
                human(dedup),
                if args.delivered_retention.is_some() || !from_config(|c| c.delivered_retention_set)
                {
                    "--delivered-retention"
                } else {
                    "the config's purge.delivered_retention"
                },
                human(delivered),
                if args.delivered_retention.is_none() && !from_config(|c| c.delivered_retention_set)
                {
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
