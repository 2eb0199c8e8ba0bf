//! The library's one error type.

use std::path::PathBuf;

use crate::envelope::EnvelopeError;

/// Result with outboxd's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in outboxd's library operations.
///
/// Every variant carries enough context to act on: the operation that failed,
/// the versions that disagree, the field that is wrong. Match on the variant
/// (the binary maps them to exit codes) or use the predicates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// SQLite refused an operation; `op` says which ("cannot claim rows").
    #[error("cannot {op}: {source}")]
    Database {
        /// What outboxd was doing, as a verb phrase ("open the database").
        op: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The path could not be used as a database file.
    #[error("cannot open database {path}: {reason}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `enqueue` was called on a connection in autocommit mode. The event
    /// would commit on its own, not with the caller's business rows.
    #[error(
        "cannot enqueue outside a transaction: pass the host's rusqlite Transaction \
         (or Savepoint), or allow autocommit explicitly with Enqueuer::allow_autocommit"
    )]
    NotInTransaction,
    /// An envelope field is invalid.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The payload is larger than the configured bound.
    #[error("payload is {size} bytes, larger than the limit of {limit} bytes (Enqueuer::max_payload_bytes)")]
    PayloadTooLarge {
        /// The payload's size in bytes, as JSON.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The payload could not be serialized to JSON.
    #[error("cannot serialize the payload to JSON: {0}")]
    Payload(#[source] serde_json::Error),
    /// The database holds a newer outboxd schema than this build knows.
    #[error(
        "database schema version {found} is newer than this outboxd supports ({supported}); \
         upgrade outboxd — nothing was written"
    )]
    SchemaTooNew {
        /// The version recorded in the database.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// The database has no outboxd tables yet.
    #[error(
        "database has no outboxd schema; run `outboxd migrate` (or outboxd::schema::migrate) first"
    )]
    NotMigrated,
    /// The database has an older outboxd schema than this build needs.
    #[error(
        "database schema version {found} is older than {expected}; run `outboxd migrate` first"
    )]
    SchemaOutdated {
        /// The version recorded in the database.
        found: u32,
        /// The version this build needs.
        expected: u32,
    },
    /// SQLite did not switch the database to WAL mode.
    #[error(
        "cannot enable WAL mode: SQLite reports journal_mode={got}; outboxd needs WAL \
         (is the file on a network file system, or opened read-only?)"
    )]
    NotWal {
        /// The journal mode SQLite reported back.
        got: String,
    },
    /// A setting given to a builder is out of range.
    #[error("invalid setting {field}: {reason}")]
    InvalidSetting {
        /// The setting's name.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The requested row or event does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for ("event 01J…").
        what: String,
    },
    /// The connection pool could not hand out a connection.
    #[error("cannot get a database connection from the pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// The relay has shut down.
    #[error("the relay has shut down")]
    Shutdown,
    /// A capture cannot be installed as defined (see [`crate::capture`]).
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
}

impl Error {
    /// Wraps a rusqlite error with the operation that failed.
    pub(crate) fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
        move |source| Error::Database { op, source }
    }

    /// True when SQLite said the database is busy or locked: the operation
    /// may simply be tried again.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Database { source, .. } => is_busy(source),
            _ => false,
        }
    }

    /// True for errors about the outboxd schema version (too new, too old, missing).
    pub fn is_schema(&self) -> bool {
        matches!(
            self,
            Error::SchemaTooNew { .. } | Error::NotMigrated | Error::SchemaOutdated { .. }
        )
    }
}

/// True when a rusqlite error is SQLITE_BUSY or SQLITE_LOCKED.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
