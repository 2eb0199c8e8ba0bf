//! Exit codes, and how an error maps to one.
//!
//! Scripts and service managers act on these, so they are part of the CLI's
//! contract: a code's meaning never changes once released.

use std::process::ExitCode;

/// The process's exit status. See [`HELP`] for what each means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Success.
    Ok = 0,
    /// The command ran and found problems (`status` over a threshold,
    /// `doctor` found an error).
    Problems = 1,
    /// The command line is wrong (clap uses 2 for usage errors).
    Usage = 2,
    /// The database cannot be opened, read or written; for `run`, also: the
    /// file is damaged, the relay stopped before it could record every
    /// outcome (those deliveries will be made again), or the file was
    /// deleted or replaced while it ran.
    Database = 3,
    /// The outboxd schema is missing, older or newer than this binary.
    Schema = 4,
    /// The input is invalid: bad JSON, bad event type, payload too large,
    /// an id that is not found.
    Input = 5,
    /// The configuration is invalid or cannot be used: a config file error,
    /// a sink that cannot be built, a metrics address in use. Raised before
    /// any event is claimed.
    Config = 6,
    /// outboxd itself failed: a thread could not be started (the system's
    /// limits on threads or memory) or one of its threads panicked (a bug).
    Internal = 7,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// The table shown under `outboxd --help`.
pub(crate) const HELP: &str = "\
Exit codes:
  0  success
  1  problems found: status over a threshold, doctor found an error
  2  usage error: unknown flag, missing or malformed argument
  3  database error: cannot open, read or write the database file; for
     `run`, also: the file is damaged (SQLITE_CORRUPT or SQLITE_NOTADB; it
     stops claiming and says what `outboxd doctor` says), or it stopped
     before it could record every outcome, say on a full disk (it logs how
     many at ERROR; those events will be delivered again), or its database
     file was deleted or replaced while it ran
  4  schema error: no outboxd schema (run `outboxd migrate`), or a schema
     older or newer than this binary
  5  invalid input: bad JSON, invalid event type, payload too large, an id
     that is not found, a consumer the database does not know, a discard of
     several rows without --yes
  6  configuration error: a config file field is wrong, a sink cannot be
     built (missing program, bad URL, missing secret), the metrics address
     is in use; found at start-up, before any event is claimed
  7  internal error: a thread could not be started (the system's limit on
     threads or memory was reached), or one of outboxd's threads panicked or
     found its own data inconsistent (a bug: please report it with the log)
  130  `run` stopped by a second SIGINT/SIGTERM during its graceful shutdown";

/// An error the binary raises itself, tagged with its exit code. Library
/// errors ([`outboxd::Error`]) are classified by [`classify`] instead.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Failure {
    /// The code to exit with.
    pub(crate) exit: Exit,
    message: String,
}

impl Failure {
    /// Invalid input (exit 5).
    pub(crate) fn input(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Input,
            message: message.into(),
        }
    }

    /// The configuration cannot be used (exit 6).
    pub(crate) fn config(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Config,
            message: message.into(),
        }
    }

    /// The database cannot be used (exit 3).
    pub(crate) fn database(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Database,
            message: message.into(),
        }
    }

    /// outboxd itself failed: a thread could not start, or one panicked (exit 7).
    pub(crate) fn internal(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Internal,
            message: message.into(),
        }
    }
}

/// The exit code for an error: the first [`Failure`] or [`outboxd::Error`]
/// found in its chain decides; anything else is an I/O or database failure.
pub(crate) fn classify(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.exit;
        }
        if let Some(e) = cause.downcast_ref::<outboxd::Error>() {
            return library(e);
        }
    }
    Exit::Database
}

fn library(e: &outboxd::Error) -> Exit {
    use outboxd::Error as E;
    if e.is_schema() {
        return Exit::Schema;
    }
    match e {
        E::Envelope(_)
        | E::PayloadTooLarge { .. }
        | E::Payload(_)
        | E::InvalidSetting { .. }
        | E::NotFound { .. }
        | E::UnknownConsumer { .. } => Exit::Input,
        E::Spawn { .. } | E::Panicked { .. } | E::Invariant { .. } => Exit::Internal,
        // A capture that cannot be installed as defined is a config
        // problem; its unreadable record in the database is not.
        E::Capture(outboxd::capture::CaptureError::Record { .. }) => Exit::Database,
        E::Capture(_) => Exit::Config,
        _ => Exit::Database,
    }
}

/// True when the error is stdout closing under us (`outboxd status | head`):
/// not a failure, so the process exits quietly with success.
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error as one line: each cause in the chain, joined by ": ", skipping
/// a cause whose text its parent already shows (the library's errors embed
/// their source's message); when SQLite said the file is damaged, what to
/// do next.
pub(crate) fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    if is_damage(err) {
        line.push_str(
            " (the database file is damaged: `outboxd doctor` reports the damage and what to do)",
        );
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// True when SQLite said, somewhere in the chain, that the file is damaged.
fn is_damage(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<outboxd::Error>()
            .is_some_and(outboxd::Error::is_damage)
            || c.downcast_ref::<rusqlite::Error>()
                .is_some_and(outboxd::integrity::is_damage)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_their_codes() {
        let e = anyhow::Error::new(outboxd::Error::NotMigrated);
        assert_eq!(classify(&e), Exit::Schema);
        let e = anyhow::Error::new(outboxd::Error::SchemaTooNew {
            found: 9,
            supported: 1,
        })
        .context("cannot enqueue");
        assert_eq!(classify(&e), Exit::Schema);
        let e = anyhow::Error::new(outboxd::Error::PayloadTooLarge { size: 2, limit: 1 });
        assert_eq!(classify(&e), Exit::Input);
        let e = anyhow::Error::new(outboxd::Error::Open {
            path: "x".into(),
            reason: "no".into(),
        });
        assert_eq!(classify(&e), Exit::Database);
        let e = anyhow::Error::new(Failure::input("bad")).context("while reading");
        assert_eq!(classify(&e), Exit::Input);
        // A thread that could not start, or a panic, is neither bad input
        // nor a database problem.
        let e = anyhow::Error::new(outboxd::Error::Spawn {
            thread: "outboxd-worker-0".into(),
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })
        .context("the relay stopped");
        assert_eq!(classify(&e), Exit::Internal);
        let e = anyhow::Error::new(outboxd::Error::Panicked {
            thread: "outboxd-writer".into(),
            message: "index out of bounds".into(),
        });
        assert_eq!(classify(&e), Exit::Internal);
        let e = anyhow::Error::new(outboxd::Error::Invariant {
            what: "a claimed row vanished".into(),
        });
        assert_eq!(classify(&e), Exit::Internal);
        let e = anyhow::Error::new(outboxd::Error::UnknownConsumer {
            name: "serch".into(),
            known: vec!["search".into()],
        });
        assert_eq!(classify(&e), Exit::Input);
        let e = anyhow::Error::new(outboxd::Error::from(
            outboxd::capture::CaptureError::NoSuchTable {
                table: "pages".into(),
            },
        ));
        assert_eq!(classify(&e), Exit::Config);
        let e = anyhow::Error::new(outboxd::Error::from(
            outboxd::capture::CaptureError::Record {
                table: "pages".into(),
                reason: "edited by hand".into(),
            },
        ));
        assert_eq!(classify(&e), Exit::Database);
    }

    #[test]
    fn one_line_skips_repeated_causes_and_newlines() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot do it: {0}")]
        struct Outer(#[source] std::io::Error);
        let io = std::io::Error::other("disk\nfull");
        let e = anyhow::Error::new(Outer(io)).context("cannot enqueue");
        assert_eq!(one_line(&e), "cannot enqueue: cannot do it: disk full");
    }
}
