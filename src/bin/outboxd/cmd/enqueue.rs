//! `outboxd enqueue`: add one event from the shell.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use outboxd::{Enqueued, Enqueuer, Event, Timestamp};
use rusqlite::TransactionBehavior;

use super::{database, Global};
use crate::args::parse_duration;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd enqueue --help`.
pub const EXAMPLES: &str = "\
Prints the new event's id. With --key, a second enqueue with the same key
(and tenant) writes nothing and prints `duplicate of <id>`, naming the first
event; it still exits 0. The database must be migrated first.

Examples:
  outboxd enqueue --type article.created.v1 --payload '{\"id\": 7}' --key article-7
  generate-report | outboxd enqueue --type report.ready.v1 --payload-file - --delay 5m";

/// Options of `outboxd enqueue`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Event type, `<domain>.<verb>.v<N>` (such as article.created.v1).
    #[arg(long = "type", value_name = "TYPE")]
    event_type: String,
    /// The payload as JSON text [default: null].
    #[arg(long, value_name = "JSON", conflicts_with = "payload_file")]
    payload: Option<String>,
    /// Read the JSON payload from a file, or from stdin with `-`.
    #[arg(long, value_name = "FILE")]
    payload_file: Option<PathBuf>,
    /// Idempotency key: unique per tenant (or in the system scope without --tenant).
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// The tenant the event belongs to.
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// Deliver no sooner than this long from now: 500ms, 30s, 5m, 2h or 1d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          conflicts_with = "available_at")]
    delay: Option<Duration>,
    /// Deliver no sooner than this time (RFC 3339, such as 2026-12-01T09:00:00Z).
    #[arg(long, value_name = "TIME")]
    available_at: Option<Timestamp>,
    /// Events sharing an ordering key reach each consumer one at a time, in order.
    #[arg(long, value_name = "KEY")]
    ordering_key: Option<String>,
    /// The id of what caused this event.
    #[arg(long, value_name = "ID")]
    causation_id: Option<String>,
    /// The id shared by everything one request caused.
    #[arg(long, value_name = "ID")]
    correlation_id: Option<String>,
    /// The largest payload accepted, in bytes of JSON.
    #[arg(long, value_name = "BYTES", default_value_t = outboxd::enqueue::DEFAULT_MAX_PAYLOAD_BYTES)]
    max_payload_bytes: usize,
}

/// Validates the event, then writes it in one `BEGIN IMMEDIATE` transaction.
/// Nothing touches the database until the input is known to be good.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let event = build_event(args)?;

    let mut conn = database::for_writing(&global.db)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .context("cannot start a write transaction")?;
    // Again under the write lock, in case a migration ran in between.
    outboxd::schema::ensure_current(&tx)?;
    let outcome = Enqueuer::new()
        .max_payload_bytes(args.max_payload_bytes)
        .enqueue(&tx, &event)?;
    tx.commit().context("cannot commit the event")?;

    let mut out = std::io::stdout().lock();
    match outcome {
        Enqueued::New(id) => writeln!(out, "{id}")?,
        Enqueued::Duplicate(id) => writeln!(out, "duplicate of {id}")?,
    }
    Ok(Exit::Ok)
}

/// The event the arguments describe, with every field validated.
fn build_event(args: &Args) -> Result<Event> {
    let limit = args.max_payload_bytes;
    let payload = match (&args.payload, &args.payload_file) {
        (Some(json), _) => json.clone(),
        (None, Some(file)) => read_payload(file, limit)?,
        (None, None) => "null".to_string(),
    };
    if payload.len() > limit {
        return Err(too_large(payload.len().to_string(), limit).into());
    }
    let mut event = Event::from_json(&args.event_type, payload)?;
    if let Some(key) = &args.key {
        event = event.idempotency_key(key);
    }
    if let Some(tenant) = &args.tenant {
        event = event.tenant(tenant);
    }
    if let Some(delay) = args.delay {
        event = event.delay(delay);
    }
    if let Some(at) = args.available_at {
        event = event.available_at(at);
    }
    if let Some(key) = &args.ordering_key {
        event = event.ordering_key(key);
    }
    if let Some(id) = &args.causation_id {
        event = event.causation_id(id);
    }
    if let Some(id) = &args.correlation_id {
        event = event.correlation_id(id);
    }
    Ok(event)
}

/// How far past the limit an oversized payload is counted (not kept), to
/// say its size: an endless stream on stdin must still end the command.
const SIZE_COUNT_CAP: u64 = 1 << 30;

/// Reads a payload file (`-` for stdin), keeping at most one byte past the
/// limit so a huge or endless stream cannot exhaust memory; an oversized
/// one is counted to the end (up to 1 GiB) so the error gives its size.
fn read_payload(file: &Path, limit: usize) -> Result<String> {
    let name = if file == Path::new("-") {
        "stdin".to_string()
    } else {
        file.display().to_string()
    };
    let cannot_read =
        |e: std::io::Error| Failure::input(format!("cannot read the payload from {name}: {e}"));
    let mut reader: Box<dyn Read> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(file).map_err(cannot_read)?)
    };
    let mut bytes = Vec::new();
    (&mut reader)
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() > limit {
        let rest = std::io::copy(&mut reader.take(SIZE_COUNT_CAP), &mut std::io::sink())
            .map_err(cannot_read)?;
        let size = if rest == SIZE_COUNT_CAP {
            format!("more than {}", bytes.len() as u64 + rest)
        } else {
            (bytes.len() as u64 + rest).to_string()
        };
        return Err(too_large(size, limit).into());
    }
    String::from_utf8(bytes).map_err(|_| {
        Failure::input(format!(
            "the payload in {name} is not UTF-8 text, so not JSON"
        ))
        .into()
    })
}

fn too_large(size: String, limit: usize) -> Failure {
    Failure::input(format!(
        "payload is {size} bytes, larger than the limit of {limit} bytes \
         (raise it with --max-payload-bytes)"
    ))
}
