//! `outboxd status`: what is waiting, delivered and dead, and whether that
//! crosses the thresholds a monitor alerts on.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::status::Status;
use outboxd::Timestamp;

use super::config_arg::ConfigArg;
use super::support::human;
use super::{database, Global};
use crate::args::parse_duration;
use crate::config::alerts;
use crate::exit::Exit;

/// Shown under `outboxd status --help`.
pub const EXAMPLES: &str = "\
Opens the database read-only, so it works on a file, or in a directory, you
may not write. (SQLite keeps a WAL database's index, the -shm file, beside
it: when no writer has the database open and you may not create that file,
the database is read as an immutable file, and the output says so; a write
during the read could then show a mix of old and new.)

\"Oldest due\" is how long the oldest event that is due (not delayed on
purpose) has waited: the measure of a stuck relay.

\"Oldest undelivered\" is how long ago the oldest event that is due, being
delivered or waiting for a retry was written: it shows a consumer that keeps
failing, whose retries are not due and so not stale.

Exits 0 when healthy and 1 when a threshold is crossed: the oldest due event
has waited longer than --stale-after (default 5m), the oldest undelivered
event is older than --max-undelivered-age (default 1h), or there are more
dead letters than --max-dead (default 0: any dead letter); or when a capture
trigger is missing or changed (`outboxd capture list` says more). With
--config (or OUTBOXD_CONFIG), the thresholds and the database are the
config's ([alerts] stale_after, max_undelivered_age and max_dead, the same
defaults when unset);
the flags win over it. The verdict is the one /healthz, the console, `doctor`,
`run`'s log and /metrics give. The output names the threshold crossed, so the
command fits cron jobs and monitoring checks as it is.

Examples:
  outboxd --db app.db status
  outboxd status --config /etc/outboxd/outboxd.toml || page-someone
  outboxd --db app.db status --stale-after 1m --max-dead 10 || page-someone
  outboxd --db app.db status --json | jq '.healthy, .problems'";

/// Options of `outboxd status`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help(
    "Take the thresholds ([alerts]) and the database from this config file"
)))]
pub struct Args {
    /// Print one JSON object instead of text (with "healthy" and "problems").
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    config: ConfigArg,
    /// Unhealthy when the oldest due event has waited longer than this:
    /// 500ms, 30s, 5m, 2h or 1d [default: the config's alerts.stale_after,
    /// else 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    stale_after: Option<Duration>,
    /// Unhealthy when the oldest undelivered event (due, being delivered or
    /// waiting for a retry) was written longer ago than this [default: the
    /// config's alerts.max_undelivered_age, else 1h].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_undelivered_age: Option<Duration>,
    /// Unhealthy when there are more dead letters than this [default: the
    /// config's alerts.max_dead, else 0].
    #[arg(long, value_name = "N")]
    max_dead: Option<u64>,
}

/// Prints a snapshot of the outbox; exit 1 when a threshold is crossed.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let (db, config) = args.config.summary(global)?;
    let mut alerts = config.map_or_else(alerts::without_config, |c| c.alerts);
    if let Some(d) = args.stale_after {
        alerts.stale_after = d;
    }
    if let Some(d) = args.max_undelivered_age {
        alerts.max_undelivered_age = d;
    }
    if let Some(n) = args.max_dead {
        alerts.max_dead = Some(n);
    }
    let (conn, mode) = database::for_inspection(&db)?;
    let status = outboxd::status::status(&conn, Timestamp::now())?;
    let problems = alerts::verdict(&conn, &alerts, status.now)?;
    let note = database::read_mode_note(mode);
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut value = json(&status, &problems)?;
        if let (Some(map), Some(note)) = (value.as_object_mut(), note) {
            map.insert("note".into(), note.into());
        }
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &db.display().to_string(), &status)?;
        if let Some(note) = note {
            writeln!(out, "note:             {note}")?;
        }
        if problems.is_empty() {
            writeln!(out, "health:           ok")?;
        } else {
            writeln!(out, "health:           PROBLEMS")?;
            for p in problems.iter() {
                writeln!(out, "  {}: {}", p.threshold, p.message)?;
            }
        }
    }
    Ok(if problems.is_empty() {
        Exit::Ok
    } else {
        Exit::Problems
    })
}

/// `status --json`: the status with "healthy" and "problems" (also the body
/// of the console's /healthz).
pub fn json(
    status: &Status,
    problems: &[alerts::Problem],
) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(status)?;
    if let Some(map) = value.as_object_mut() {
        map.insert("healthy".into(), problems.is_empty().into());
        map.insert("problems".into(), serde_json::to_value(problems)?);
    }
    Ok(value)
}

fn write_text(out: &mut impl Write, db: &str, s: &Status) -> std::io::Result<()> {
    let c = &s.counts;
    let oldest = s
        .oldest_due_age
        .map_or_else(|| "none".to_string(), |d| format!("{} ago", human(d)));
    writeln!(out, "database:         {db} (schema v{})", s.schema_version)?;
    writeln!(out, "pending due:      {}", c.pending_due)?;
    writeln!(out, "oldest due:       {oldest}")?;
    let undelivered = s.oldest_undelivered_age.map_or_else(
        || "none".to_string(),
        |d| format!("oldest written {} ago", human(d)),
    );
    writeln!(out, "undelivered:      {undelivered}")?;
    writeln!(out, "pending delayed:  {}", c.pending_delayed)?;
    writeln!(
        out,
        "leased:           {} ({} live, {} expired)",
        c.leased, s.leases_held, s.expired_leases
    )?;
    writeln!(out, "delivered:        {}", c.delivered)?;
    writeln!(out, "dead:             {}", c.dead)?;
    if !s.delivered_by_consumer.is_empty() {
        writeln!(out, "delivered by consumer:")?;
        // Consumer names as the ledger holds them (foreign SQL may write it).
        for (consumer, n) in &s.delivered_by_consumer {
            writeln!(out, "  {}: {n}", outboxd::text::escape(consumer))?;
        }
    }
    Ok(())
}
