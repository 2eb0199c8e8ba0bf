//! `outboxd check-config`: validate a config file without running.

use std::io::Write;

use anyhow::Result;

use super::config_arg::ConfigArg;
use super::support::{count, human};
use super::Global;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd check-config --help`.
pub(crate) const EXAMPLES: &str = "\
Parses the file, checks every field, and builds every sink: a command's
program must exist and be executable, a webhook's URL must be http(s) and its
secret variables or files must be present; a sql sink's statements must
prepare against the database (its tables exist, its parameters are known).
A nats sink's servers are asked about its stream (bounded by
connect_timeout): a missing stream, refused credentials, a certificate that
cannot be trusted or is not for the host, TLS required on one side and not
offered by the other, and a host name that does not exist are errors; an
unreachable server, and a duplicate window that a retry of the consumer can
outlast, are warnings. A webhook's receiver is connected to (for https, a TLS
handshake) and sent no request: a host that does not exist, an untrusted or
wrong certificate, or a port without TLS are errors; a receiver that is down
is a warning. Prints a summary and exits 0, or prints the first
problem (file, field path such as consumer[2].sink.statements[1], what is
allowed) and exits 6. Nothing is claimed or written: the database is opened
read-only, and only for sql sinks (a JSONL sink's file is created if
missing). The console and metrics addresses are checked but not bound, so
this works while outboxd runs.

Each [[capture]] is checked against the database as `capture apply` would
(its table and columns exist, its `when` compiles), with or without
--offline: a capture of a missing table is an error (run the host's own
migrations first).

With --offline, only the file's syntax and values are checked (sinks are
built, so a missing program or secret is still found): no server is asked,
sql statements are not prepared, and the database is opened (read-only)
only for [[capture]] entries. That is the
check to run before starting the service (the systemd unit's ExecStartPre),
so an unreachable receiver or a database not created yet cannot keep it from
starting; `outboxd run` reports those itself.

Examples:
  outboxd check-config --config /etc/outboxd/outboxd.toml
  outboxd check-config --offline --config /etc/outboxd/outboxd.toml";

/// Options of `outboxd check-config`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("config", |a| a.help("The config file to check").required(true)))]
pub(crate) struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Check the file's syntax and values only: no network, no database.
    #[arg(long)]
    offline: bool,
}

/// Validates the config and prints what it configures.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let (db, c) = args.config.load(global, &[])?;
    // clap refuses the command line without --config.
    let (Some(file), Some(c)) = (args.config.file(), c) else {
        unreachable!("--config is required");
    };
    let probes = if args.offline {
        vec![Vec::new(); c.consumers.len()]
    } else {
        let probes = c
            .consumers
            .iter()
            .map(|k| k.sink.probe(&k.name, &k.retry, &c.relay))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::config(e.to_string()))?;
        c.check_database(&db).map_err(Failure::from)?;
        probes
    };
    crate::config::capture::check_database(file, &c.captures, &db).map_err(Failure::from)?;
    let mut out = std::io::stdout().lock();
    if args.offline {
        writeln!(
            out,
            "config {}: ok (offline: no server asked, the database not opened)",
            file.display()
        )?;
    } else {
        writeln!(out, "config {}: ok", file.display())?;
    }
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
        "alerts:    stale after {}, undelivered after {}{}",
        human(c.alerts.stale_after),
        human(c.alerts.max_undelivered_age),
        c.alerts.max_dead.map_or(String::new(), |n| format!(
            ", more than {}",
            count(n, "dead letter", "dead letters")
        ))
    )?;
    if let Some(addr) = c.http.listen {
        writeln!(
            out,
            "console:   http://{addr}/ (with /metrics and /healthz){}{}",
            c.http
                .token_env
                .as_ref()
                .map_or(String::new(), |v| format!(", token from ${v}")),
            if c.http.read_only { ", read-only" } else { "" }
        )?;
        // The token as `run` reads it: refused or weak here too, before a
        // unit's ExecStartPre lets `run` start with it.
        let serve = c
            .http
            .serve(None)
            .map_err(|e| Failure::config(format!("config {}: http: {e}", file.display())))?;
        if let Some(weak) = serve.and_then(|s| s.weak_token) {
            writeln!(out, "  warning: {weak}")?;
        }
    }
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
