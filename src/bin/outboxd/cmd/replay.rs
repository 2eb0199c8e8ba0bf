//! `outboxd replay`: deliver events again to one consumer.

use std::io::Write;

use anyhow::Result;
use outboxd::replay::{replay_with_progress, ReplayFilter};
use outboxd::router::Pattern;
use outboxd::{EventId, Timestamp};

use super::config_arg::ConfigArg;
use super::support::{bar, count, Progress};
use super::{database, Global};
use crate::args::parse_time_now;
use crate::exit::{Exit, Failure};

/// Shown under `outboxd replay --help`.
pub(crate) const EXAMPLES: &str = "\
Forgets that the consumer had the selected events and puts them back in the
queue, due now; a running relay then delivers them to that consumer only,
even where another consumer lacks the event (one added since, say), and a
replayed dead letter goes back to the dead letters with its reason. Only
events the consumer had delivered, and whose rows are not purged, can be
replayed. Filters combine with AND; name at least one, or --all for
everything the consumer had. Prints how many events were put back. Shows a
progress bar on a terminal. A consumer name the database does not know (no
delivery recorded, no replay pending) is an error listing the names it
knows, exit 5; with --config, the config's consumers are known too.

Examples:
  outboxd --db app.db replay --consumer search-index --type 'article.*.v1' \\
      --since 2026-11-29T00:00:00Z --until 2026-11-30T00:00:00Z
  outboxd --db app.db replay --consumer billing --type 'order.*.v1' --since '2h ago'
  outboxd --db app.db replay --consumer billing --id 01JDQ7X6ZB5N4Q2W8V1K3M9T0R
  outboxd --db app.db replay --consumer audit-log --all";

/// Options of `outboxd replay`. The `events` group makes clap refuse a
/// replay that names no filter and not --all (a usage error).
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("events")
        .required(true)
        .multiple(true)
        .args(["event_type", "since", "until", "ids", "all"])
))]
#[command(mut_arg("config", |a| a.help(
    "The config file: its consumers are the known names (one with no deliveries yet \
     replays nothing rather than being unknown), and its database is used unless --db is given"
)))]
pub(crate) struct Args {
    /// The consumer to deliver to again (its name in the configuration).
    #[arg(long, value_name = "NAME")]
    consumer: String,
    #[command(flatten)]
    config: ConfigArg,
    /// Only event types matching this pattern, such as article.*.v1.
    #[arg(long = "type", value_name = "PATTERN", value_parser = Pattern::parse)]
    event_type: Option<Pattern>,
    /// Only events that occurred at or after this time: RFC 3339, or how
    /// long ago (2h ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_now)]
    since: Option<Timestamp>,
    /// Only events that occurred before this time: RFC 3339, or how long
    /// ago (30m ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_now)]
    until: Option<Timestamp>,
    /// Only these event ids (repeat the flag for several).
    #[arg(long = "id", value_name = "ID", value_parser = parse_event_id)]
    ids: Vec<EventId>,
    /// Replay every event delivered to the consumer.
    #[arg(long, conflicts_with_all = ["event_type", "since", "until", "ids"])]
    all: bool,
}

fn parse_event_id(s: &str) -> Result<EventId, outboxd::EnvelopeError> {
    EventId::parse(s)
}

/// Replays the selected events and prints how many were put back.
pub(crate) fn exec(global: &Global, args: &Args) -> Result<Exit> {
    let (db, config) = args.config.summary(global)?;
    let known = config.map(|c| c.consumers).unwrap_or_default();
    let mut filter = ReplayFilter::new(args.consumer.clone())
        .ids(args.ids.clone())
        .known_consumers(known);
    filter.event_type = args.event_type.clone();
    filter.since = args.since;
    filter.until = args.until;
    // Before the database is opened: a mistake in the flags is reported as
    // such (exit 5), whatever the database's state.
    filter.validate()?;
    let mut conn = database::for_writing(&db)?;
    let mut progress = Progress::stderr();
    let n = replay_with_progress(&mut conn, &filter, Timestamp::now(), |done, total| {
        progress.show(&format!("replaying {}", bar(done, total)));
    })
    .map_err(|e| match e {
        // Without --config only the database's records name consumers.
        e @ outboxd::Error::UnknownConsumer { .. } if args.config.file().is_none() => {
            Failure::input(format!(
                "{e}; --config FILE makes the configured consumers known"
            ))
            .into()
        }
        e => anyhow::Error::from(e),
    })?;
    progress.finish();
    writeln!(
        std::io::stdout().lock(),
        "replayed {} to consumer {}",
        count(n, "event", "events"),
        args.consumer
    )?;
    Ok(Exit::Ok)
}
