//! `outboxd`: the operator's command line. Parse, dispatch to one command in
//! `cmd/`, map the outcome to an exit code. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};

mod allocator;
mod args;
#[cfg(feature = "assets")]
mod assets;
mod cmd;
mod config;
mod console;
mod exit;
mod metrics;
#[cfg(feature = "otlp")]
mod otlp;

use config::{LogFormat, LogSettings};
use exit::Exit;

/// `--version`: the version, the target triple and the git commit (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("OUTBOXD_VERSION_TARGET"),
    ", commit ",
    env!("OUTBOXD_VERSION_COMMIT"),
    ")"
);

/// The heading of the options every command takes, apart from each
/// command's own in its --help.
const GLOBAL: &str = "Global options";

/// A transactional outbox for applications that keep their data in SQLite.
#[derive(Debug, Parser)]
#[command(name = "outboxd", version = VERSION, after_help = exit::HELP)]
struct Cli {
    /// The SQLite database file shared with the application.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "OUTBOXD_DB",
        value_name = "PATH",
        default_value = "./outboxd.db"
    )]
    db: PathBuf,

    /// Log format on stderr [default: text, or the config's log.format].
    #[arg(long, global = true, help_heading = GLOBAL, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,

    /// Log level or filter (error, warn, info, debug, trace, or directives such
    /// as info,outboxd=debug); wins over RUST_LOG, which wins over the config's
    /// log.level [default: info for run, warn otherwise].
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        value_name = "LEVEL",
        value_parser = parse_log_level
    )]
    log_level: Option<String>,

    #[command(subcommand)]
    command: cmd::Command,
}

/// The environment variables that stand in for a flag: (variable, the
/// argument's id, the flag).
const FLAG_VARIABLES: [(&str, &str, &str); 2] = [
    ("OUTBOXD_DB", "db", "--db"),
    ("OUTBOXD_CONFIG", "config", "--config"),
];

fn main() -> ExitCode {
    raise_open_files_limit();
    allocator::set_up();
    // clap takes a variable that is set but empty for a flag given without
    // its value ("a value is required for '--db'"), even when the flag is
    // on the command line. An empty one is set aside here, and refused
    // below, by its name, only where the flag was not given.
    let empty: Vec<_> = FLAG_VARIABLES
        .into_iter()
        .filter(|(var, _, _)| std::env::var_os(var).is_some_and(|v| v.is_empty()))
        .collect();
    for (var, _, _) in &empty {
        // SAFETY: the first thing `main` does: no other thread runs yet to
        // read the environment while it changes.
        unsafe { std::env::remove_var(var) };
    }
    let command = Cli::command();
    // The hidden generator is only in builds with the `assets` feature (not
    // in the static release binaries: scripts/release.sh).
    #[cfg(feature = "assets")]
    let command = command.subcommand(assets::command());
    let parsed = command.try_get_matches().and_then(|m| {
        #[cfg(feature = "assets")]
        if m.subcommand_matches(assets::NAME).is_some() {
            return Ok((None, m));
        }
        Cli::from_arg_matches(&m).map(|cli| (Some(cli), m))
    });
    let (cli, matches) = match parsed {
        Ok((Some(cli), m)) => (cli, m),
        #[cfg(feature = "assets")]
        Ok((None, m)) => return assets::exec(&m),
        #[cfg(not(feature = "assets"))]
        Ok((None, _)) => unreachable!("only generate-assets parses to no command"),
        Err(e) => {
            return match empty.iter().find(|(_, _, flag)| {
                e.kind() == clap::error::ErrorKind::MissingRequiredArgument
                    && e.to_string().contains(flag)
            }) {
                Some(&(var, _, flag)) => empty_variable(var, flag),
                None => usage_error(e),
            }
        }
    };
    if let Some(&(var, _, flag)) = empty.iter().find(|(_, id, _)| not_given(&matches, id)) {
        return empty_variable(var, flag);
    }
    // Given on the command line or in OUTBOXD_DB, the database wins over a
    // config file's `database`; the built-in default does not.
    let db_explicit = !matches!(
        matches.value_source("db"),
        None | Some(clap::parser::ValueSource::DefaultValue)
    );
    let log = LogOptions {
        format: cli.log_format,
        level: cli.log_level,
    };
    // `run` and `console` set up logging themselves once they have read
    // their config's [log].
    if !matches!(cli.command, cmd::Command::Run(_) | cmd::Command::Console(_)) {
        init_logging(&log, &LogSettings::default(), "warn");
    }
    let global = cmd::Global {
        db: cli.db,
        db_explicit,
        log,
    };
    match cli.command.exec(&global) {
        Ok(code) => code.into(),
        Err(e) if exit::is_broken_pipe(&e) => Exit::Ok.into(),
        Err(e) => {
            let line = exit::one_line(&e);
            match cmd::database::no_space(&e) {
                Some(note) => eprintln!("outboxd: error: {line}: {note}"),
                None => eprintln!("outboxd: error: {line}"),
            }
            exit::classify(&e).into()
        }
    }
}

/// Raises the soft limit on open files to the hard one (systemd's default
/// soft limit is 1,024, its hard one far higher): each connection waiting
/// at the console is a descriptor, and the console caps them to what the
/// limit allows. Left as it is when the limit cannot be raised.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

/// True when the command takes argument `id` (at any level of its
/// subcommands) and the command line did not give it.
fn not_given(matches: &clap::ArgMatches, id: &str) -> bool {
    use clap::parser::ValueSource;
    let mut m = Some(matches);
    while let Some(level) = m {
        if level.try_contains_id(id).is_ok() {
            return level.value_source(id) != Some(ValueSource::CommandLine);
        }
        m = level.subcommand().map(|(_, sub)| sub);
    }
    false
}

/// A variable standing in for a flag is set but empty: a usage error that
/// names the variable (the flag was not given).
fn empty_variable(var: &str, flag: &str) -> ExitCode {
    eprintln!(
        "outboxd: error: the environment variable {var} is set but empty; set it to a \
         path, unset it, or give {flag}"
    );
    Exit::Usage.into()
}

/// Help and version go to stdout as clap prints them. A usage error becomes
/// one line on stderr (clap's message and tips, without the usage block)
/// and exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    if matches!(
        e.kind(),
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .fold(String::new(), |mut acc, l| {
            // "...were not provided:" is followed by the list it announces.
            if !acc.is_empty() {
                acc.push_str(if acc.ends_with(':') { " " } else { "; " });
            }
            acc.push_str(l);
            acc
        });
    eprintln!("outboxd: error: {message} (see --help)");
    Exit::Usage.into()
}

/// The logging flags of the command line.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogOptions {
    /// `--log-format`.
    pub(crate) format: Option<LogFormat>,
    /// `--log-level`.
    pub(crate) level: Option<String>,
}

fn parse_log_level(s: &str) -> Result<String, String> {
    config::log::check_level(s).map(|()| s.to_string())
}

/// Sets up logging to stderr, once. The level comes from `--log-level`, else
/// RUST_LOG, else the config's `log.level`, else `default_level`; the format
/// from `--log-format`, else the config's `log.format`, else text.
pub(crate) fn init_logging(flags: &LogOptions, config: &LogSettings, default_level: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| config::log::filter(&v).ok());
    // The flag's and the config's levels were checked when they were read.
    let checked = |level: &str| {
        config::log::filter(level)
            .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO))
    };
    let filter = match (&flags.level, from_env, &config.level) {
        (Some(level), _, _) => checked(level),
        (None, Some(env), _) => env,
        (None, None, Some(level)) => checked(level),
        (None, None, None) => checked(default_level),
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt()
        .with_max_level(LevelFilter::TRACE)
        .with_writer(std::io::stderr);
    // The webhook sink's HTTP client dumps whole requests (secrets included)
    // at TRACE: never let those through, whatever the level or RUST_LOG say.
    let no_http_trace = tracing_subscriber::filter::filter_fn(|meta| {
        *meta.level() < tracing::Level::TRACE
            || !outboxd::sinks::webhook::is_http_client_log_target(meta.target())
    });
    let format = flags.format.or(config.format).unwrap_or(LogFormat::Text);
    // Errors only if logging was set up already, which is then kept.
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .finish()
            .with(filter)
            .with(no_http_trace)
            .try_init(),
        // Colour codes only for a person at a terminal, not for journald or a file.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(filter)
            .with(no_http_trace)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prose under each command's --help is printed as written, not
    /// wrapped: every line of it fits 80 columns, so none runs past a
    /// terminal's edge and breaks a sentence. (Example command lines,
    /// indented, may be longer.)
    #[test]
    fn the_prose_under_every_help_fits_80_columns() {
        let mut command = Cli::command();
        command.build();
        let mut pending = vec![command];
        let mut long = Vec::new();
        while let Some(c) = pending.pop() {
            let text = c.get_after_help().map(ToString::to_string);
            long.extend(
                text.iter()
                    .flat_map(|t| t.lines())
                    .filter(|l| !l.starts_with(' ') && l.chars().count() > 80)
                    .map(|l| format!("{}: {l}", c.get_name())),
            );
            pending.extend(c.get_subcommands().cloned());
        }
        assert!(
            long.is_empty(),
            "lines over 80 columns:\n{}",
            long.join("\n")
        );
    }
}
