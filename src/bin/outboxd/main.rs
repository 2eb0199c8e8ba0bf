//! `outboxd`: the operator's command line. Parse, dispatch to one command in
//! `cmd/`, map the outcome to an exit code. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

mod args;
mod cmd;
mod exit;

use exit::Exit;

/// A transactional outbox for applications that keep their data in SQLite.
#[derive(Debug, Parser)]
#[command(name = "outboxd", version, after_help = exit::HELP)]
struct Cli {
    /// The SQLite database file shared with the application.
    #[arg(
        long,
        global = true,
        env = "OUTBOXD_DB",
        value_name = "PATH",
        default_value = "./outboxd.db"
    )]
    db: PathBuf,

    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_logging();
    let global = cmd::Global { db: cli.db };
    match cli.command.exec(&global) {
        Ok(code) => code.into(),
        Err(e) if exit::is_broken_pipe(&e) => Exit::Ok.into(),
        Err(e) => {
            eprintln!("outboxd: error: {}", exit::one_line(&e));
            exit::classify(&e).into()
        }
    }
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

/// Logs to stderr at the level RUST_LOG names (default: warn). The one place
/// logging is set up, so a `--log-format` can replace it later.
fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not for journald or a file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
