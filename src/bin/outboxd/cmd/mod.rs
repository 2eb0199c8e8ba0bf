//! One file per subcommand. Each defines its clap `Args` and an `exec` that
//! validates the arguments, makes one library call and prints the result
//! (cargo's `commands/` layout). To add a command: a file here, a variant
//! in [`Command`], and an arm in [`Command::exec`].

use std::path::PathBuf;

use crate::exit::Exit;
use anyhow::Result;

pub(crate) mod capture;
pub(crate) mod capture_watch;
pub(crate) mod check_config;
pub(crate) mod config_arg;
pub(crate) mod console;
pub(crate) mod database;
pub(crate) mod dead;
pub(crate) mod doctor;
pub(crate) mod enqueue;
pub(crate) mod intents;
pub(crate) mod migrate;
pub(crate) mod payload;
pub(crate) mod purge;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod signals;
pub(crate) mod snapshot;
pub(crate) mod status;
pub(crate) mod support;

/// Options every command shares.
#[derive(Debug, Clone)]
pub(crate) struct Global {
    /// The database file.
    pub(crate) db: PathBuf,
    /// True when the database was given with --db or OUTBOXD_DB rather than
    /// taken from the default; it then wins over a config file's `database`.
    pub(crate) db_explicit: bool,
    /// The logging flags (`run` sets up logging itself, after its config).
    pub(crate) log: crate::LogOptions,
}

impl Global {
    /// The database to use with a config file that names `configured`:
    /// --db or OUTBOXD_DB when given, else the config's, else the default.
    pub(crate) fn db_with_config(&self, configured: Option<&std::path::Path>) -> PathBuf {
        match configured {
            Some(path) if !self.db_explicit => path.to_path_buf(),
            _ => self.db.clone(),
        }
    }
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade outboxd's tables in the database.
    #[command(after_help = migrate::EXAMPLES)]
    Migrate(migrate::Args),
    /// Add one event to the outbox from the shell.
    #[command(after_help = enqueue::EXAMPLES)]
    Enqueue(Box<enqueue::Args>), // boxed: by far the largest

    /// Show what is waiting, delivered and dead, and how old the oldest due event is.
    #[command(after_help = status::EXAMPLES)]
    Status(status::Args),

    /// Inspect dead letters, and requeue or discard them.
    #[command(subcommand, after_help = dead::EXAMPLES)]
    Dead(dead::Args),
    /// Deliver events again to one consumer that already had them.
    #[command(after_help = replay::EXAMPLES)]
    Replay(replay::Args),
    /// Delete delivered events, old dedup entries and (optionally) dead letters.
    #[command(after_help = purge::EXAMPLES)]
    Purge(purge::Args),
    /// Check the database's health and say what to do about each problem.
    #[command(after_help = doctor::EXAMPLES)]
    Doctor(doctor::Args),
    /// List open publish intents, or purge completed ones.
    #[command(subcommand, after_help = intents::EXAMPLES)]
    Intents(intents::Args),
    /// Deliver events: run the relay with the configured consumers (or, without
    /// --config, print every event as a JSON line on stdout) until SIGINT/SIGTERM.
    #[command(after_help = run::EXAMPLES)]
    Run(run::Args),
    /// Serve the web console (and /metrics, /healthz) for a database, without
    /// running a relay.
    #[command(after_help = console::EXAMPLES)]
    Console(console::Args),
    /// Turn a table's own inserts, updates and deletes into events, with
    /// triggers: install, list and drop them.
    #[command(subcommand, after_help = capture::EXAMPLES)]
    Capture(capture::Args),
    /// Check a config file (sinks included) without running anything.
    #[command(after_help = check_config::EXAMPLES)]
    CheckConfig(check_config::Args),
}

impl Command {
    /// Runs the command; the error's chain decides the exit code.
    pub(crate) fn exec(&self, global: &Global) -> Result<Exit> {
        match self {
            Command::Migrate(args) => migrate::exec(global, args),
            Command::Enqueue(args) => enqueue::exec(global, args),
            Command::Status(args) => status::exec(global, args),
            Command::Dead(args) => dead::exec(global, args),
            Command::Replay(args) => replay::exec(global, args),
            Command::Purge(args) => purge::exec(global, args),
            Command::Doctor(args) => doctor::exec(global, args),
            Command::Intents(args) => intents::exec(global, args),
            Command::Run(args) => {
                let result = run::exec(global, args);
                // However run ended (a clean stop, an error, the relay
                // dropped): no command sink's program outlives it.
                signals::kill_programs_left_behind();
                result
            }
            Command::Console(args) => console::exec(global, args),
            Command::Capture(args) => capture::exec(global, args),
            Command::CheckConfig(args) => check_config::exec(global, args),
        }
    }
}
