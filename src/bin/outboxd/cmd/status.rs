//! `outboxd status`: what is waiting, delivered and dead.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::status::Status;
use outboxd::Timestamp;

use super::Global;
use crate::exit::Exit;

/// Shown under `outboxd status --help`.
pub const EXAMPLES: &str = "\
Opens the database read-only, so it works on a file you may not write.
\"Oldest due\" is how long the oldest event that is due (not delayed on
purpose) has waited: the measure of a stuck relay.

Examples:
  outboxd --db app.db status
  outboxd --db app.db status --json | jq .counts.pending_due";

/// Options of `outboxd status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints a snapshot of the outbox.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let conn = outboxd::connection::open_read_only(&global.db)?;
    let status = outboxd::status::status(&conn, Timestamp::now())?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &status)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &global.db.display().to_string(), &status)?;
    }
    Ok(Exit::Ok)
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

/// A duration for people: `850ms`, `42s`, `5m 3s`, `2h 10m`, `3d 4h`.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let s = ms / 1000;
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    match () {
        _ if s == 0 => format!("{ms}ms"),
        _ if m == 0 => format!("{s}s"),
        _ if h == 0 => format!("{m}m {}s", s % 60),
        _ if days == 0 => format!("{h}h {}m", m % 60),
        _ => format!("{days}d {}h", h % 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        let cases = [
            (850, "850ms"),
            (42_000, "42s"),
            (303_000, "5m 3s"),
            (7_800_000, "2h 10m"),
            (273_600_000, "3d 4h"),
        ];
        for (ms, want) in cases {
            assert_eq!(human(Duration::from_millis(ms)), want);
        }
    }
}
