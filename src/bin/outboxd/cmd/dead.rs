//! `outboxd dead`: list, show, requeue and discard dead letters.

use std::io::Write;

use anyhow::Result;
use outboxd::dead_letter::{self, DeadLetter, Selector};
use outboxd::router::Pattern;
use outboxd::text::{clip, Keep};
use outboxd::Timestamp;

use super::support::{count, not_found};
use super::{database, Global};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd dead --help`.
pub const EXAMPLES: &str = "\
A dead letter is an event a consumer refused (poison) or that ran out of
retries. It stays until you requeue it (deliver again) or discard it.
Exit code 5 when no dead letter has the id given, or when a discard of
several rows lacks --yes.

Examples:
  outboxd --db app.db dead list
  outboxd --db app.db dead show 42
  outboxd --db app.db dead requeue --type 'order.*'
  outboxd --db app.db dead discard --all --yes";

const NOT_FOUND_HINT: &str = "see the dead letters with `outboxd dead list`";

/// The `dead` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Args {
    /// List dead letters, newest first: row id, event id, type, attempts, and
    /// the end of the reason (where the cause is; `dead show` has it whole).
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Show one dead letter in full: reason, attempts and payload.
    #[command(after_help = SHOW_HELP)]
    Show(ShowArgs),
    /// Put dead letters back in the queue, due now, with their attempts reset.
    #[command(after_help = REQUEUE_HELP)]
    Requeue(ChangeArgs),
    /// Delete dead letters for good.
    #[command(after_help = DISCARD_HELP)]
    Discard(DiscardArgs),
}

const LIST_HELP: &str = "\
Reads only. Example:
  outboxd --db app.db dead list --limit 20
  outboxd --db app.db dead list --json | jq '.[].reason'";

const SHOW_HELP: &str = "\
Reads only. ID is the row id `dead list` prints first, or the event id.
Exit code 5 when no dead letter has that id.

Examples:
  outboxd --db app.db dead show 42
  outboxd --db app.db dead show 01JDQ7X6ZB5N4Q2W8V1K3M9T0R --json";

const REQUEUE_HELP: &str = "\
Changes the selected rows from dead to pending, due now, with attempts back
at 0; a running relay delivers them again to every consumer that has not
had them yet. Exit code 5 when ID names no dead letter.

Examples:
  outboxd --db app.db dead requeue 42
  outboxd --db app.db dead requeue --type 'order.*.v1'
  outboxd --db app.db dead requeue --all";

const DISCARD_HELP: &str = "\
Deletes the selected dead letters; they cannot be delivered afterwards.
Discarding more than one row needs --yes. Exit code 5 when ID names no dead
letter, or when --yes is missing for several rows (nothing is deleted).

Examples:
  outboxd --db app.db dead discard 42
  outboxd --db app.db dead discard --type 'user.deleted.*' --yes";

/// Options of `dead list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Show at most this many (the newest).
    #[arg(long, value_name = "N", default_value_t = 50)]
    limit: usize,
    /// Print a JSON array instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `dead show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The row id or the event id.
    #[arg(value_name = "ID")]
    id: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Which dead letters `requeue` and `discard` apply to: exactly one of an
/// id, a type pattern, or all.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// One dead letter: its row id or event id.
    #[arg(value_name = "ID")]
    id: Option<String>,
    /// Every dead letter whose type matches, such as order.*.v1 (`*` is one
    /// or more segments).
    #[arg(long = "type", value_name = "PATTERN", value_parser = Pattern::parse)]
    event_type: Option<Pattern>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

impl Which {
    fn selector(&self) -> Selector {
        match (&self.id, &self.event_type) {
            (Some(id), _) => Selector::One(id.clone()),
            (None, Some(p)) => Selector::Type(p.clone()),
            (None, None) => Selector::All,
        }
    }
}

/// Options of `dead requeue`.
#[derive(Debug, clap::Args)]
pub struct ChangeArgs {
    #[command(flatten)]
    which: Which,
}

/// Options of `dead discard`.
#[derive(Debug, clap::Args)]
pub struct DiscardArgs {
    #[command(flatten)]
    which: Which,
    /// Confirm a discard of more than one dead letter.
    #[arg(long)]
    yes: bool,
}

/// Runs one `dead` subcommand.
pub fn exec(global: &Global, args: &Args) -> Result<Exit> {
    match args {
        Args::List(a) => list(global, a),
        Args::Show(a) => show(global, a),
        Args::Requeue(a) => requeue(global, a),
        Args::Discard(a) => discard(global, a),
    }
}

fn list(global: &Global, args: &ListArgs) -> Result<Exit> {
    let conn = database::for_reading(&global.db)?;
    let dead = dead_letter::list(&conn, args.limit)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &dead)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    if dead.is_empty() {
        writeln!(out, "no dead letters")?;
        return Ok(Exit::Ok);
    }
    writeln!(
        out,
        "{:>8}  {:<26}  {:<30}  {:>8}  {:<24}  REASON",
        "ROW", "EVENT ID", "TYPE", "ATTEMPTS", "DEAD AT"
    )?;
    for d in &dead {
        writeln!(
            out,
            "{:>8}  {:<26}  {:<30}  {:>8}  {:<24}  {}",
            d.row_id,
            d.event_id.as_deref().unwrap_or("-"),
            d.event_type,
            d.attempts,
            d.dead_at.map_or_else(|| "-".into(), |t| t.to_string()),
            reason_tail(d.reason.as_deref().unwrap_or("-"), 80)
        )?;
    }
    Ok(Exit::Ok)
}

fn show(global: &Global, args: &ShowArgs) -> Result<Exit> {
    let conn = database::for_reading(&global.db)?;
    let d = dead_letter::show(&conn, &args.id).map_err(not_found(NOT_FOUND_HINT))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &d)?;
        writeln!(out)?;
    } else {
        write_one(&mut out, &d)?;
    }
    Ok(Exit::Ok)
}

fn write_one(out: &mut impl Write, d: &DeadLetter) -> std::io::Result<()> {
    writeln!(out, "row id:      {}", d.row_id)?;
    writeln!(out, "event id:    {}", d.event_id.as_deref().unwrap_or("-"))?;
    writeln!(out, "type:        {}", d.event_type)?;
    writeln!(
        out,
        "tenant:      {}",
        d.tenant_id.as_deref().unwrap_or("-")
    )?;
    writeln!(out, "attempts:    {}", d.attempts)?;
    writeln!(
        out,
        "dead at:     {}",
        d.dead_at.map_or_else(|| "-".into(), |t| t.to_string())
    )?;
    writeln!(out, "reason:      {}", d.reason.as_deref().unwrap_or("-"))?;
    writeln!(out, "payload:")?;
    writeln!(out, "{}", d.payload.as_deref().unwrap_or("(not text)"))?;
    Ok(())
}

fn requeue(global: &Global, args: &ChangeArgs) -> Result<Exit> {
    let mut conn = database::for_writing(&global.db)?;
    let n = dead_letter::requeue(&mut conn, &args.which.selector(), Timestamp::now())
        .map_err(not_found(NOT_FOUND_HINT))?;
    writeln!(std::io::stdout().lock(), "requeued {}", dead_letters(n))?;
    Ok(Exit::Ok)
}

fn discard(global: &Global, args: &DiscardArgs) -> Result<Exit> {
    let selector = args.which.selector();
    if !args.yes && !matches!(selector, Selector::One(_)) {
        // Count what would go before deleting anything. (A dead letter that
        // arrives between this count and the discard is discarded too.)
        let conn = database::for_reading(&global.db)?;
        let n = dead_letter::list(&conn, i64::MAX as usize)?
            .iter()
            .filter(|d| match &selector {
                Selector::Type(p) => p.matches(&d.event_type),
                _ => true,
            })
            .count();
        if n > 1 {
            return Err(Failure::input(format!(
                "this would discard {n} dead letters for good; add --yes to confirm \
                 (see them with `outboxd dead list`)"
            ))
            .into());
        }
    }
    let mut conn = database::for_writing(&global.db)?;
    let n = dead_letter::discard(&mut conn, &selector).map_err(not_found(NOT_FOUND_HINT))?;
    writeln!(std::io::stdout().lock(), "discarded {}", dead_letters(n))?;
    Ok(Exit::Ok)
}

fn dead_letters(n: u64) -> String {
    count(n, "dead letter", "dead letters")
}

/// A reason on one line, cut to `max` bytes keeping its end: reasons lead
/// with context ("webhook … answered 500: ") and end with the cause.
fn reason_tail(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    clip(&flat, max, Keep::Tail).into_owned()
}
