//! `outboxd status`: what is waiting, delivered and dead, and whether that
//! crosses the thresholds a monitor alerts on.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::status::Status;
use outboxd::Timestamp;
use serde::Serialize;

use super::support::human;
use super::Global;
use crate::args::parse_duration;
use crate::exit::Exit;

/// Shown under `outboxd status --help`.
pub const EXAMPLES: &str = "\
Opens the database read-only, so it works on a file you may not write.
\"Oldest due\" is how long the oldest event that is due (not delayed on
purpose) has waited: the measure of a stuck relay.

Exits 0 when healthy and 1 when a threshold is crossed: the oldest due event
has waited longer than --stale-after, or there are more dead letters than
--max-dead. The output names the threshold crossed, so the command fits cron
jobs and monitoring checks as it is.

Examples:
  outboxd --db app.db status
  outboxd --db app.db status --stale-after 1m --max-dead 10 || page-someone
  outboxd --db app.db status --json | jq '.healthy, .problems'";

/// Options of `outboxd status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text (with "healthy" and "problems").
    #[arg(long)]
    json: bool,
    /// Unhealthy when the oldest due event has waited longer than this:
    /// 500ms, 30s, 5m, 2h or 1d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5m")]
    stale_after: Duration,
    /// Unhealthy when there are more dead letters than this.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_dead: u64,
}

/// A crossed threshold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Problem {
    /// Which threshold: "stale-after", "max-dead", or "capture" (a capture
    /// trigger missing or changed).
    threshold: &'static str,
    /// What was found and what to do.
    message: String,
}

/// Prints a snapshot of the outbox; exit 1 when a threshold is crossed.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let conn = outboxd::connection::open_read_only(&global.db)?;
    let status = outboxd::status::status(&conn, Timestamp::now())?;
    let mut problems = problems(&status, args);
    for message in super::capture::problems(&conn, status.now)? {
        problems.push(Problem {
            threshold: "capture",
            message,
        });
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut value = serde_json::to_value(&status)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("healthy".into(), problems.is_empty().into());
            map.insert("problems".into(), serde_json::to_value(&problems)?);
        }
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &global.db.display().to_string(), &status)?;
        if problems.is_empty() {
            writeln!(out, "health:           ok")?;
        } else {
            writeln!(out, "health:           PROBLEMS")?;
            for p in &problems {
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

fn problems(s: &Status, args: &Args) -> Vec<Problem> {
    let mut found = Vec::new();
    if let Some(age) = s.oldest_due_age.filter(|age| *age > args.stale_after) {
        found.push(Problem {
            threshold: "stale-after",
            message: format!(
                "the oldest due event has waited {} (more than {}); is `outboxd run` \
                 running and able to deliver? `outboxd doctor` checks for expired leases",
                human(age),
                human(args.stale_after)
            ),
        });
    }
    if s.counts.dead > args.max_dead {
        found.push(Problem {
            threshold: "max-dead",
            message: format!(
                "{} dead letters (more than {}); see them with `outboxd dead list`, then \
                 `outboxd dead requeue` or `outboxd dead discard`",
                s.counts.dead, args.max_dead
            ),
        });
    }
    found
}

fn write_text(out: &mut impl Write, db: &str, s: &Status) -> std::io::Result<()> {
    let c = &s.counts;
    let oldest = s
        .oldest_due_age
        .map_or_else(|| "none".to_string(), |d| format!("{} ago", human(d)));
    writeln!(out, "database:         {db} (schema v{})", s.schema_version)?;
    writeln!(out, "pending due:      {}", c.pending_due)?;
    writeln!(out, "oldest due:       {oldest}")?;
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
        for (consumer, n) in &s.delivered_by_consumer {
            writeln!(out, "  {consumer}: {n}")?;
        }
    }
    Ok(())
}
