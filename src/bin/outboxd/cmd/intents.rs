//! `outboxd intents`: publish intents that are not completed, and the purge
//! of completed ones.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use outboxd::intents::{self, Intent, IntentStatus};
use outboxd::text::escape;
use outboxd::Timestamp;

use super::support::{count, human};
use super::{database, Global};
use crate::args::parse_duration;
use crate::exit::Exit;

/// Shown under `outboxd intents --help`.
pub(crate) const EXAMPLES: &str = "\
A publish intent records an outside write (a comment, an e-mail, a ticket)
before a consumer sends it, so a retry never sends it twice. `list` shows the
ones that need a look: pending (recorded or being sent) and failed.

Examples:
  outboxd --db app.db intents list
  outboxd --db app.db intents purge --older-than 30d";

const LIST_HELP: &str = "\
Reads only. A pending intent whose claim has ended belongs to a sender that
died or stalled: the consumer's next retry looks for its output by marker
before posting again. A failed intent is retried by its consumer's retry.

Examples:
  outboxd --db app.db intents list
  outboxd --db app.db intents list --json | jq '.[] | select(.status == \"failed\")'";

const PURGE_HELP: &str = "\
Deletes completed intents that completed longer ago than --older-than;
pending and failed ones are never deleted. After the purge, a redelivery of
the same event is kept from posting again only by the consumer's look-up by
marker: keep intents at least as long as a redelivery can arrive.

Example:
  outboxd --db app.db intents purge --older-than 30d";

/// The `intents` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Args {
    /// List pending and failed publish intents, least recently changed first.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Delete completed intents older than a duration.
    #[command(after_help = PURGE_HELP)]
    Purge(PurgeArgs),
}

/// Options of `intents list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Print a JSON array instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `intents purge`.
#[derive(Debug, clap::Args)]
pub(crate) struct PurgeArgs {
    /// Delete intents completed longer ago than this: 30s, 5m, 2h or 30d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Duration,
}

/// Rows deleted per statement by `intents purge`.
const PURGE_BATCH: usize = 500;

/// Runs one `intents` subcommand.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    match args {
        Args::List(a) => list(global, a),
        Args::Purge(a) => purge(global, a),
    }
}

fn list(global: &Global, args: &ListArgs) -> Result<Exit> {
    let conn = database::for_reading(&global.db)?;
    let open = intents::list_open(&conn)?;
    let now = Timestamp::now();
    let mut out = std::io::stdout().lock();
    if args.json {
        let rows: Vec<_> = open.iter().map(|i| json(i, now)).collect();
        serde_json::to_writer(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    if open.is_empty() {
        writeln!(out, "no pending or failed intents")?;
        return Ok(Exit::Ok);
    }
    writeln!(
        out,
        "{:>6}  {:<8}  {:>8}  {:<16}  {:<32}  {:<24}  NOTE",
        "ID", "STATUS", "ATTEMPTS", "TENANT", "KEY", "UPDATED AT"
    )?;
    for i in &open {
        writeln!(
            out,
            "{:>6}  {:<8}  {:>8}  {:<16}  {:<32}  {:<24}  {}",
            i.id,
            i.status,
            i.attempts,
            escape(i.key.tenant_id().unwrap_or("-")),
            escape(i.key.key()),
            i.updated_at.to_string(),
            escape(&note(i, now))
        )?;
    }
    Ok(Exit::Ok)
}

/// What an operator should know about an open intent.
fn note(i: &Intent, now: Timestamp) -> String {
    match (i.status, i.claimed_until()) {
        (IntentStatus::Failed, _) => format!(
            "failed: {}",
            i.last_error.as_deref().unwrap_or("(no reason recorded)")
        ),
        (_, Some(until)) if until > now => {
            format!("being sent (claim ends in {})", human(until.since(now)))
        }
        (_, Some(until)) => format!(
            "claim ended {} ago: its sender died or stalled",
            human(now.since(until))
        ),
        _ => "recorded, not sent yet".into(),
    }
}

fn json(i: &Intent, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "id": i.id,
        "tenant_id": i.key.tenant_id(),
        "key": i.key.key(),
        "marker": i.marker,
        "status": i.status.as_str(),
        "attempts": i.attempts,
        "last_error": i.last_error,
        "created_at": i.created_at,
        "updated_at": i.updated_at,
        "claimed_until": i.claimed_until(),
        "note": note(i, now),
    })
}

fn purge(global: &Global, args: &PurgeArgs) -> Result<Exit> {
    let conn = database::for_writing(&global.db)?;
    let cutoff = Timestamp::now().minus(args.older_than);
    let n = intents::purge_completed(&conn, cutoff, PURGE_BATCH)?;
    writeln!(
        std::io::stdout().lock(),
        "deleted {} (completed over {} ago)",
        count(n as u64, "completed intent", "completed intents"),
        human(args.older_than)
    )?;
    Ok(Exit::Ok)
}
