//! `outboxd dead`: list, show, requeue and discard dead letters.

use std::io::Write;

use anyhow::Result;
use outboxd::dead_letter::{self, DeadLetter, Selector};
use outboxd::repair::{repair, Repair};
use outboxd::router::Pattern;
use outboxd::text::{escape, ELLIPSIS};
use outboxd::{EventId, EventType, Timestamp};

use super::payload::PayloadArgs;
use super::support::{count, not_found};
use super::{database, Global};
use crate::exit::{Exit, Failure};

/// Shown under `outboxd dead --help`.
pub(crate) const EXAMPLES: &str = "\
A dead letter is an event a consumer refused (poison), that ran out of
retries, or that the relay could not read (a row a producer wrote with a bad
event type, payload or id: `dead edit` repairs it). It stays until you
requeue it (deliver again) or discard it.
Exit code 5 when no dead letter has the id given, or when a discard of
several rows lacks --yes.

Examples:
  outboxd --db app.db dead list
  outboxd --db app.db dead show 42
  outboxd --db app.db dead edit 42 --type order.placed.v1 --requeue
  outboxd --db app.db dead requeue --type 'order.*'
  outboxd --db app.db dead discard --all --yes";

const NOT_FOUND_HINT: &str = "see the dead letters with `outboxd dead list`";

/// The `dead` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Args {
    /// List dead letters, newest first: row id, event id, type, attempts, and
    /// the reason's start (`dead show` has it whole).
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Show one dead letter in full: reason, attempts and payload.
    #[command(after_help = SHOW_HELP)]
    Show(ShowArgs),
    /// Repair a dead letter the relay could not read: set its type, payload,
    /// ids or time, checked as the relay checks a row; then requeue it.
    #[command(after_help = EDIT_HELP, visible_alias = "fix")]
    Edit(Box<EditArgs>),
    /// Put dead letters back in the queue, due now, with their attempts reset.
    #[command(after_help = REQUEUE_HELP)]
    Requeue(ChangeArgs),
    /// Delete dead letters for good.
    #[command(after_help = DISCARD_HELP)]
    Discard(DiscardArgs),
}

const LIST_HELP: &str = "\
Reads only. Shows the newest --limit (50) and says how many more there are.
An event id, type or reason too long for its column is cut at its end (…);
`dead show ID` shows it whole. --json prints one object: \"total\" (every
dead letter), \"shown\" and \"dead_letters\" (the list).

Examples:
  outboxd --db app.db dead list --limit 20
  outboxd --db app.db dead list --json | jq '.total, .dead_letters[].reason'";

const SHOW_HELP: &str = "\
Reads only. ID is the row id `dead list` prints first, or the event id.
Exit code 5 when no dead letter has that id.

Examples:
  outboxd --db app.db dead show 42
  outboxd --db app.db dead show 01JDQ7X6ZB5N4Q2W8V1K3M9T0R --json";

const EDIT_HELP: &str = "\
For a row a producer wrote that the relay cannot read, and dead-lettered
with the reason (`dead show ID`): an event type without a version, a payload
that is not JSON, a malformed event id, a version that disagrees with the
type, a time outside years 1 to 9999. Sets the columns given, then checks the
whole row as the relay will when it claims it; if the row would still be
refused, nothing is changed and the error names the column (exit 5). Setting
the type sets the version with it. The row stays dead unless --requeue is
given (or run `dead requeue ID` after). Prefer this to a hand-written UPDATE:
it keeps to the rules of the SQL contract (docs/sql-contract.md).

Examples:
  outboxd --db app.db dead edit 42 --type order.placed.v1
  outboxd --db app.db dead edit 42 --payload-file fixed.json --requeue
  outboxd --db app.db dead edit 01JDQ7X6ZB5N4Q2W8V1K3M9T0R --new-event-id --requeue";

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
pub(crate) struct ListArgs {
    /// Show at most this many (the newest).
    #[arg(long, value_name = "N", default_value_t = 50)]
    limit: usize,
    /// Print a JSON array instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `dead show`.
#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
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
pub(crate) struct Which {
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

/// Options of `dead edit`: the id, and at least one column to set.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("columns")
        .required(true)
        .multiple(true)
        .args([
            "event_type", "payload", "payload_file", "event_id", "new_event_id",
            "causation_id", "no_causation_id", "correlation_id", "no_correlation_id",
            "occurred_at",
        ])
))]
pub(crate) struct EditArgs {
    /// The row id or the event id.
    #[arg(value_name = "ID")]
    id: String,
    /// The event type, such as order.placed.v1 (the version column follows).
    #[arg(long = "type", value_name = "TYPE", value_parser = EventType::parse)]
    event_type: Option<EventType>,
    #[command(flatten)]
    payload: PayloadArgs,
    /// The event id (a ULID).
    #[arg(long, value_name = "ID", value_parser = EventId::parse, conflicts_with = "new_event_id")]
    event_id: Option<EventId>,
    /// A fresh event id, for a row whose id is malformed.
    #[arg(long)]
    new_event_id: bool,
    /// The causation id.
    #[arg(long, value_name = "ID", conflicts_with = "no_causation_id")]
    causation_id: Option<String>,
    /// Clear the causation id.
    #[arg(long)]
    no_causation_id: bool,
    /// The correlation id.
    #[arg(long, value_name = "ID", conflicts_with = "no_correlation_id")]
    correlation_id: Option<String>,
    /// Clear the correlation id.
    #[arg(long)]
    no_correlation_id: bool,
    /// When the event occurred (RFC 3339).
    #[arg(long, value_name = "TIME")]
    occurred_at: Option<Timestamp>,
    /// Put it back in the queue once repaired, due now.
    #[arg(long)]
    requeue: bool,
    /// Print the repaired dead letter as one JSON object.
    #[arg(long)]
    json: bool,
}

impl EditArgs {
    /// The columns the flags set.
    fn repair(&self) -> Result<Repair> {
        let mut r = Repair::new();
        if let Some(t) = &self.event_type {
            r = r.event_type(t.clone());
        }
        if let Some(json) = self.payload.read()? {
            r = r.payload(json);
        }
        match (&self.event_id, self.new_event_id) {
            (Some(id), _) => r = r.event_id(*id),
            (None, true) => r = r.event_id(EventId::new()),
            (None, false) => {}
        }
        if self.causation_id.is_some() || self.no_causation_id {
            r = r.causation_id(self.causation_id.clone());
        }
        if self.correlation_id.is_some() || self.no_correlation_id {
            r = r.correlation_id(self.correlation_id.clone());
        }
        if let Some(t) = self.occurred_at {
            r = r.occurred_at(t);
        }
        Ok(r)
    }
}

/// Options of `dead requeue`.
#[derive(Debug, clap::Args)]
pub(crate) struct ChangeArgs {
    #[command(flatten)]
    which: Which,
}

/// Options of `dead discard`.
#[derive(Debug, clap::Args)]
pub(crate) struct DiscardArgs {
    #[command(flatten)]
    which: Which,
    /// Confirm a discard of more than one dead letter.
    #[arg(long)]
    yes: bool,
}

/// Runs one `dead` subcommand.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    match args {
        Args::List(a) => list(global, a),
        Args::Show(a) => show(global, a),
        Args::Edit(a) => edit(global, a),
        Args::Requeue(a) => requeue(global, a),
        Args::Discard(a) => discard(global, a),
    }
}

fn list(global: &Global, args: &ListArgs) -> Result<Exit> {
    let conn = database::for_reading(&global.db)?;
    let dead = dead_letter::list(&conn, args.limit)?;
    let total = dead_letter::count(&conn, &Selector::All)?.max(dead.len() as u64);
    let mut out = std::io::stdout().lock();
    if args.json {
        let value = serde_json::json!({
            "total": total,
            "shown": dead.len(),
            "dead_letters": dead,
        });
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    if dead.is_empty() {
        writeln!(out, "no dead letters")?;
        return Ok(Exit::Ok);
    }
    let rows: Vec<[String; 6]> = dead
        .iter()
        .map(|d| {
            [
                d.row_id.to_string(),
                cell(d.event_id.as_deref().unwrap_or("-"), EVENT_ID_WIDTH),
                cell(&d.event_type, TYPE_WIDTH),
                d.attempts.to_string(),
                d.dead_at.map_or_else(|| "-".into(), |t| t.to_string()),
                cell(&one_line(d.reason.as_deref().unwrap_or("-")), REASON_WIDTH),
            ]
        })
        .collect();
    write_table(&mut out, &rows)?;
    if rows.iter().flatten().any(|c| c.ends_with(ELLIPSIS)) {
        writeln!(
            out,
            "{ELLIPSIS} marks text cut short; `outboxd dead show ROW` shows a dead letter whole"
        )?;
    }
    let more = total - dead.len() as u64;
    if more > 0 {
        writeln!(
            out,
            "{more} more not shown (the newest {} of {total}); use --limit {total} to see them all",
            dead.len()
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

/// `dead show`: every value a producer (or a consumer, in the reason) wrote
/// is escaped, so it can neither break the layout nor drive the terminal.
fn write_one(out: &mut impl Write, d: &DeadLetter) -> std::io::Result<()> {
    writeln!(out, "row id:      {}", d.row_id)?;
    let event_id = match d.event_id.as_deref() {
        None => "- (none: a legacy row, delivered without dedup)".to_string(),
        Some(id) if EventId::parse(id).is_ok() => id.to_string(),
        Some(id) => format!("{} (invalid: not a ULID)", escape(id)),
    };
    writeln!(out, "event id:    {event_id}")?;
    writeln!(out, "type:        {}", escape(&d.event_type))?;
    writeln!(
        out,
        "tenant:      {}",
        escape(d.tenant_id.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "attempts:    {}", d.attempts)?;
    writeln!(
        out,
        "dead at:     {}",
        d.dead_at.map_or_else(|| "-".into(), |t| t.to_string())
    )?;
    writeln!(
        out,
        "reason:      {}",
        escape(d.reason.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "payload:")?;
    writeln!(
        out,
        "{}",
        escape(d.payload.as_deref().unwrap_or("(not text)"))
    )?;
    Ok(())
}

fn edit(global: &Global, args: &EditArgs) -> Result<Exit> {
    // Everything the flags say is read and checked before the database is.
    let r = args.repair()?;
    let mut conn = database::for_writing(&global.db)?;
    let d = repair(&mut conn, &args.id, &r).map_err(not_found(NOT_FOUND_HINT))?;
    if args.requeue {
        let selector = Selector::One(d.row_id.to_string());
        dead_letter::requeue(&mut conn, &selector, Timestamp::now())?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        // The row as repaired; "requeued" says whether it is still dead.
        let mut value = serde_json::to_value(&d)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("requeued".into(), args.requeue.into());
            map.insert("changed".into(), r.columns().into());
        }
        serde_json::to_writer(&mut out, &value)?;
        writeln!(out)?;
        return Ok(Exit::Ok);
    }
    writeln!(
        out,
        "repaired dead letter {} ({}): {}",
        d.row_id,
        escape(d.event_id.as_deref().unwrap_or("no event id")),
        r.columns().join(", ")
    )?;
    if args.requeue {
        writeln!(out, "requeued: a running relay delivers it again")?;
    } else {
        writeln!(
            out,
            "it is still dead; deliver it with `outboxd dead requeue {}` (or edit with --requeue)",
            d.row_id
        )?;
    }
    Ok(Exit::Ok)
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
        // Counted as the discard selects, so the two agree on every row
        // (one whose type is not text matches no pattern).
        let conn = database::for_reading(&global.db)?;
        let n = dead_letter::count(&conn, &selector)?;
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

/// The widest event id, type and reason `dead list` shows: a ULID's 26
/// characters; a type or a reason past its width is cut at its end, since
/// its start says what it is ("invalid row: column …", "poison: …").
const EVENT_ID_WIDTH: usize = 26;
const TYPE_WIDTH: usize = 40;
const REASON_WIDTH: usize = 80;

/// `dead list`'s columns: the header, how each is aligned (right for
/// numbers), one row per dead letter; each column as wide as its widest
/// cell (the cells are bounded by [`cell`]), the last one not padded.
fn write_table(out: &mut impl Write, rows: &[[String; 6]]) -> std::io::Result<()> {
    const HEADER: [&str; 6] = ["ROW", "EVENT ID", "TYPE", "ATTEMPTS", "DEAD AT", "REASON"];
    const RIGHT: [bool; 6] = [true, false, false, true, false, false];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([HEADER[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..HEADER.len()).map(width).collect();
    let line = |cells: [&str; 6]| {
        let mut text = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths[i];
            match (i + 1 == cells.len(), RIGHT[i]) {
                (true, _) => text.push_str(c),
                (false, true) => text.push_str(&format!("{c:>w$}  ")),
                (false, false) => text.push_str(&format!("{c:<w$}  ")),
            }
        }
        text
    };
    writeln!(out, "{}", line(HEADER))?;
    for r in rows {
        writeln!(out, "{}", line(r.each_ref().map(String::as_str)))?;
    }
    Ok(())
}

/// Text on one line: every run of whitespace (line breaks included) as one
/// space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` [`escape`]d, in at most `width` characters: its start and
/// [`ELLIPSIS`] when it is longer. An escape is kept whole or left out.
fn cell(text: &str, width: usize) -> String {
    let escaped = escape(text);
    if escaped.chars().count() <= width {
        return escaped.into_owned();
    }
    let mut kept = String::new();
    let mut used = 0;
    let mut buf = [0; 4];
    for c in text.chars() {
        let piece = escape(c.encode_utf8(&mut buf));
        let n = piece.chars().count();
        if used + n >= width {
            break;
        }
        kept.push_str(&piece);
        used += n;
    }
    kept.push_str(ELLIPSIS);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_cell_keeps_its_start_and_never_half_an_escape() {
        assert_eq!(cell("short", 10), "short");
        assert_eq!(cell("exactly10!", 10), "exactly10!");
        assert_eq!(cell("abcdefghijk", 10), "abcdefghi…");
        assert_eq!(cell("ééééééééééé", 5), "éééé…");
        // "ab\n" is 4 characters, its escape "\u{1b}" 6: left out whole.
        assert_eq!(cell("ab\n\x1bcdefgh", 10), "ab\\n…");
        let reason = format!(
            "invalid row: column created_at is {}, expected a time",
            "9".repeat(200)
        );
        let shown = cell(&one_line(&reason), REASON_WIDTH);
        assert_eq!(shown.chars().count(), REASON_WIDTH, "{shown}");
        assert!(shown.starts_with("invalid row: column created_at is 999"));
        assert!(shown.ends_with("99…"), "{shown}");
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }

    #[test]
    fn the_table_aligns_its_columns_to_the_widest_cell() {
        let row = |id: &str, ty: &str| {
            [
                id.to_string(),
                "-".to_string(),
                cell(ty, TYPE_WIDTH),
                "3".to_string(),
                "-".to_string(),
                "poison".to_string(),
            ]
        };
        let rows = [row("7", "a.b.v1"), row("123456789012", &"t".repeat(300))];
        let mut out = Vec::new();
        write_table(&mut out, &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = |l: &str, what: &str| l.find(what).unwrap_or_else(|| panic!("{what} in {l}"));
        // The reason starts in one column on every line.
        let reason = at(lines[0], "REASON");
        assert_eq!(at(lines[1], "poison"), reason, "{text}");
        assert!(lines[2].chars().count() < 120, "{text}");
        assert_eq!(
            lines[2].chars().position(|c| c == 'p'),
            lines[1].chars().position(|c| c == 'p')
        );
        assert!(lines[2].contains(&format!("{}…", "t".repeat(TYPE_WIDTH - 1))));
        // The row ids are right-aligned.
        assert!(lines[1].starts_with("           7  "), "{text}");
    }
}
