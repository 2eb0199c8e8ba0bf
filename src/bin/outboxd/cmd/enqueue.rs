//! `outboxd enqueue`: add one event from the shell.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use outboxd::{Enqueued, Enqueuer, Event, Timestamp};
use rusqlite::TransactionBehavior;

use super::payload::PayloadArgs;
use super::support::human;
use super::{database, Global};
use crate::args::parse_duration;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd enqueue --help`.
pub(crate) const EXAMPLES: &str = "\
Prints the new event's id. Without --payload or --payload-file the payload
is null. With --key, a second enqueue with the same key
(and tenant) writes nothing and prints `duplicate of <id>`, naming the first
event; it still exits 0. The database must be migrated first. --delay and
--available-at reach at most a year ahead (further is refused with exit 5:
`outboxd status` would report the event as an implausible delay).

Examples:
  outboxd enqueue --type article.created.v1 --payload '{\"id\": 7}' --key article-7
  generate-report | outboxd enqueue --type report.ready.v1 --payload-file - --delay 5m";

/// Options of `outboxd enqueue`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Event type, `<domain>.<verb>.v<N>` (such as article.created.v1).
    #[arg(long = "type", value_name = "TYPE")]
    event_type: String,
    #[command(flatten)]
    payload: PayloadArgs,
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
}

/// Validates the event, then writes it in one `BEGIN IMMEDIATE` transaction.
/// Nothing touches the database until the input is known to be good.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let event = build_event(args)?;

    let mut conn = database::for_writing(&global.db)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .context("cannot start a write transaction")?;
    // Again under the write lock, in case a migration ran in between.
    outboxd::schema::ensure_current(&tx)?;
    let outcome = Enqueuer::new()
        .max_payload_bytes(args.payload.max_payload_bytes)
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
    let payload = args.payload.read()?.unwrap_or_else(|| "null".to_string());
    let mut event = Event::from_json(&args.event_type, payload)?;
    if let Some(key) = &args.key {
        event = event.idempotency_key(key);
    }
    if let Some(tenant) = &args.tenant {
        event = event.tenant(tenant);
    }
    // No further off than `outboxd status` finds plausible: a delay of
    // centuries is a slip of the unit, and the event would wait unseen.
    let limit = outboxd::status::IMPLAUSIBLE_DELAY;
    if let Some(delay) = args.delay {
        if delay > limit {
            return Err(Failure::input(format!(
                "--delay {} is longer than {} (`outboxd status` reports such an event as an \
                 implausible delay); give a shorter delay, or --available-at for a time",
                human(delay),
                human(limit)
            ))
            .into());
        }
        event = event.delay(delay);
    }
    if let Some(at) = args.available_at {
        let latest = Timestamp::now().plus(limit);
        if at > latest {
            return Err(Failure::input(format!(
                "--available-at {at} is more than {} from now (`outboxd status` reports such \
                 an event as an implausible delay); give a time before {latest}",
                human(limit)
            ))
            .into());
        }
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
