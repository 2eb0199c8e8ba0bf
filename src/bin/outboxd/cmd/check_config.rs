//! `outboxd check-config`: validate a config file without running.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;

use super::support::{count, human};
use super::Global;
use crate::config::Config;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd check-config --help`.
pub const EXAMPLES: &str = "\
Parses the file, checks every field, and builds every sink: a command's
program must exist and be executable, a webhook's URL must be http(s) and its
secret variables or files must be present. A nats sink's servers are asked
about its stream (bounded by connect_timeout): a missing stream or refused
credentials are errors; an unreachable server, and a duplicate window that a
retry of the consumer can outlast, are warnings. Prints a summary and exits 0, or
prints the first problem (file, field path, what is allowed) and exits 6.
Nothing is claimed and the database is not opened (a JSONL sink's file is
created if missing). The metrics address is not bound, so this works while
outboxd runs.

Example:
  outboxd check-config --config /etc/outboxd/outboxd.toml";

/// Options of `outboxd check-config`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file to check.
    #[arg(long, env = "OUTBOXD_CONFIG", value_name = "FILE")]
    config: PathBuf,
}

/// Validates the config and prints what it configures.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let c = Config::load(&args.config).map_err(|e| Failure::config(e.to_string()))?;
    let probes = c
        .consumers
        .iter()
        .map(|k| k.sink.probe(&k.name, &k.retry, c.relay.lease))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::config(e.to_string()))?;
    let db = global.db_with_config(c.database.as_deref());
    let mut out = std::io::stdout().lock();
    writeln!(out, "config {}: ok", args.config.display())?;
    writeln!(out, "database:  {}", db.display())?;
    let r = &c.relay;
    let workers = r
        .workers
        .map_or("one per core".to_string(), |n| n.to_string());
    writeln!(
        out,
        "relay:     workers {workers}, lease {}, shutdown grace {}, unrouted events {}",
        human(r.lease),
        human(r.shutdown_grace),
        match r.unrouted {
            outboxd::relay::UnroutedPolicy::DeadLetter => "dead-lettered",
            outboxd::relay::UnroutedPolicy::Skip => "skipped",
        }
    )?;
    match &c.purge {
        Some(p) => writeln!(
            out,
            "purge:     delivered after {}, dedup after {}, dead letters {}",
            human(p.delivered_retention),
            human(p.dedup_ttl),
            p.dead_retention
                .map_or("kept".to_string(), |d| format!("after {}", human(d)))
        )?,
        None => writeln!(out, "purge:     off")?,
    }
    writeln!(
        out,
        "alerts:    stale after {}{}",
        human(c.alerts.stale_after),
        c.alerts.max_dead.map_or(String::new(), |n| format!(
            ", more than {}",
            count(n, "dead letter", "dead letters")
        ))
    )?;
    if let Some(addr) = c.metrics {
        writeln!(out, "metrics:   http://{addr}/metrics")?;
    }
    for (consumer, found) in c.consumers.iter().zip(probes) {
        writeln!(
            out,
            "consumer {} <- {}: {}; {} attempts",
            consumer.name,
            consumer.types.join(", "),
            consumer.sink.describe(),
            consumer.retry.attempts()
        )?;
        for f in found {
            let label = if f.warning { "warning" } else { "note" };
            writeln!(out, "  {label}: {}", f.message)?;
        }
    }
    Ok(Exit::Ok)
}
