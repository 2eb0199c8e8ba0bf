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
    /// A `traceparent` or `tracestate` given to the `Event` builder is invalid.
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
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
    /// A setting given to a builder or policy is out of range or malformed.
    /// The [`SettingError`] names the setting (and the consumer, for a
    /// consumer's own setting) as data, so a caller can point at its own
    /// config field without reading the message.
    #[error(transparent)]
    InvalidSetting(#[from] SettingError),
    /// The requested row or event does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for ("event 01J…").
        what: String,
    },
    /// Something outboxd relies on did not hold: a row it just wrote is
    /// gone, or a statement that must change one row changed another
    /// number. A bug, or another program changing outboxd's rows mid-way;
    /// not a missing row the caller asked for (that is [`Error::NotFound`]).
    #[error("internal inconsistency: {what}; please report it")]
    Invariant {
        /// What did not hold.
        what: String,
    },
    /// A consumer name that neither the dedup ledger, a pending replay nor
    /// the caller knows (a replay to a misspelt consumer would otherwise do
    /// nothing). The database forgets a consumer whose every ledger entry a
    /// purge or a replay removed, so the message says what is recorded.
    #[error(
        "consumer {name:?} is not known: this database records no delivery to it and no \
         pending replay for it (a typo, none delivered yet, or a purge or replay removed \
         them); {}",
        known_list(known)
    )]
    UnknownConsumer {
        /// The name given.
        name: String,
        /// The names the database (and the caller) know, sorted.
        known: Vec<String>,
    },
    /// The connection pool could not hand out a connection.
    #[error("cannot get a database connection from the pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// A thread could not be started (the system refused: too many
    /// threads, or no memory).
    #[error("cannot start thread {thread}: {source}")]
    Spawn {
        /// The thread's name (`outboxd-writer`, `outboxd-worker-3`).
        thread: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The relay stopped before it could record the outcomes of every
    /// delivery it finished, or give back every claim it held (the database
    /// refused the writes until the shutdown's grace ran out: a full disk,
    /// say). Those events will be delivered again once their leases expire.
    #[error(
        "could not record the outcomes of {outcomes} finished deliveries nor release {releases} \
         claims before stopping{}; those events will be delivered again once their leases expire",
        source.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    Unwritten {
        /// Outcomes of finished deliveries not recorded.
        outcomes: usize,
        /// Claims (leases) not given back.
        releases: usize,
        /// The last error a write met.
        #[source]
        source: Option<rusqlite::Error>,
    },
    /// A thread of outboxd's panicked: a bug in outboxd (a consumer's panic
    /// is caught and retried, never this).
    #[error("thread {thread} panicked: {message}")]
    Panicked {
        /// The thread's name.
        thread: String,
        /// The panic's message.
        message: String,
    },
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

    /// True when SQLite said the database file is damaged or is not a
    /// database (SQLITE_CORRUPT, SQLITE_NOTADB): trying again cannot help;
    /// `outboxd doctor` (or [`integrity::check`](crate::integrity::check))
    /// says more.
    pub fn is_damage(&self) -> bool {
        match self {
            Error::Database { source, .. }
            | Error::Unwritten {
                source: Some(source),
                ..
            } => is_damage(source),
            _ => false,
        }
    }

    /// The SQLite error, when it says the file is damaged; the error itself
    /// otherwise.
    pub(crate) fn into_damage(self) -> std::result::Result<rusqlite::Error, Error> {
        match self {
            Error::Database { source, .. } if is_damage(&source) => Ok(source),
            other => Err(other),
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

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "no consumer has a delivery recorded or a replay pending".into()
    } else {
        format!("known consumers: {}", known.join(", "))
    }
}

/// True when SQLite says the file is damaged or not a database
/// (SQLITE_CORRUPT, SQLITE_NOTADB): trying again cannot help.
pub fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// True when a rusqlite error is SQLITE_BUSY or SQLITE_LOCKED.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// True when a rusqlite error is SQLITE_NOMEM: SQLite could not have the
/// memory it needed.
pub(crate) fn is_out_of_memory(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::OutOfMemory)
}

/// Which setting a [`SettingError`] is about. [`Setting::as_str`] gives a
/// stable identifier: the builder method or policy field that takes it
/// (`workers`, `retry.initial`, `purge.dedup_ttl`, `consumer.types`…), so a
/// caller that reads its settings from elsewhere (the binary's config file)
/// can map each one to its own field path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// `RelayBuilder::workers`.
    Workers,
    /// `RelayBuilder::batch_size`.
    BatchSize,
    /// `RelayBuilder::batch_bytes`.
    BatchBytes,
    /// `RelayBuilder::max_payload_bytes`.
    MaxPayloadBytes,
    /// `RelayBuilder::lease`.
    Lease,
    /// `RelayBuilder::poll_interval`.
    PollInterval,
    /// `RelayBuilder::flush_interval`.
    FlushInterval,
    /// `RelayBuilder::housekeeping_interval`.
    HousekeepingInterval,
    /// `RelayBuilder::stale_after`.
    StaleAfter,
    /// The consumers as a whole (none registered).
    Consumers,
    /// A consumer's name (`RelayBuilder::consumer`'s first argument).
    ConsumerName,
    /// A consumer's event types (`RelayBuilder::consumer`'s second
    /// argument); the error's [`index`](SettingError::index) says which.
    ConsumerTypes,
    /// `RelayBuilder::retry_policy_for` names a consumer that is not registered.
    RetryPolicyFor,
    /// `RetryPolicy::initial`.
    RetryInitial,
    /// `RetryPolicy::max_delay`.
    RetryMaxDelay,
    /// `RetryPolicy::max_attempts`.
    RetryMaxAttempts,
    /// `RetryPolicy::jitter`.
    RetryJitter,
    /// `RetryPolicy::probe_interval`.
    RetryProbeInterval,
    /// `RetryPolicy::probe_max_interval`.
    RetryProbeMaxInterval,
    /// `PurgePolicy::dedup_ttl`.
    PurgeDedupTtl,
    /// `PurgePolicy::batch_size`.
    PurgeBatchSize,
    /// `Intents::lease`.
    IntentLease,
    /// The batch size given to `Intents::purge_completed`.
    IntentPurgeBatch,
    /// `ReplayFilter`'s consumer.
    ReplayConsumer,
    /// `ReplayFilter`'s until, which must be after its since.
    ReplayUntil,
}

impl Setting {
    /// The stable identifier: `workers`, `batch_size`, `batch_bytes`,
    /// `max_payload_bytes`, `lease`,
    /// `poll_interval`, `flush_interval`, `housekeeping_interval`,
    /// `stale_after`, `consumers`, `consumer.name`, `consumer.types`,
    /// `retry_policy_for`, `retry.initial`, `retry.max_delay`,
    /// `retry.max_attempts`, `retry.jitter`,
    /// `purge.dedup_ttl`, `purge.batch_size`, `intents.lease`,
    /// `intents.purge_batch`, `replay.consumer`, `replay.until`.
    pub fn as_str(self) -> &'static str {
        match self {
            Setting::Workers => "workers",
            Setting::BatchSize => "batch_size",
            Setting::BatchBytes => "batch_bytes",
            Setting::MaxPayloadBytes => "max_payload_bytes",
            Setting::Lease => "lease",
            Setting::PollInterval => "poll_interval",
            Setting::FlushInterval => "flush_interval",
            Setting::HousekeepingInterval => "housekeeping_interval",
            Setting::StaleAfter => "stale_after",
            Setting::Consumers => "consumers",
            Setting::ConsumerName => "consumer.name",
            Setting::ConsumerTypes => "consumer.types",
            Setting::RetryPolicyFor => "retry_policy_for",
            Setting::RetryInitial => "retry.initial",
            Setting::RetryMaxDelay => "retry.max_delay",
            Setting::RetryMaxAttempts => "retry.max_attempts",
            Setting::RetryJitter => "retry.jitter",
            Setting::RetryProbeInterval => "retry.probe_interval",
            Setting::RetryProbeMaxInterval => "retry.probe_max_interval",
            Setting::PurgeDedupTtl => "purge.dedup_ttl",
            Setting::PurgeBatchSize => "purge.batch_size",
            Setting::IntentLease => "intents.lease",
            Setting::IntentPurgeBatch => "intents.purge_batch",
            Setting::ReplayConsumer => "replay.consumer",
            Setting::ReplayUntil => "replay.until",
        }
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A setting is out of range or malformed: which setting, whose (for a
/// consumer's own setting, the consumer's name, and for one of its event
/// type patterns the pattern's position), and what is wrong and allowed.
///
/// ```
/// use outboxd::error::Setting;
/// use outboxd::{Error, Relay};
/// let e = Relay::builder("app.db")
///     .consumer("audit", ["article.created"], |_: &outboxd::Delivery| outboxd::Outcome::Delivered)
///     .build()
///     .err()
///     .unwrap();
/// let Error::InvalidSetting(e) = e else { panic!("{e}") };
/// assert_eq!(e.setting(), Setting::ConsumerTypes);
/// assert_eq!(e.consumer(), Some("audit"));
/// assert_eq!(e.consumer_position(), Some(0));
/// assert_eq!(e.index(), Some(0));
/// assert!(e.reason().contains("article.created.v1"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    setting: Setting,
    consumer: Option<String>,
    position: Option<usize>,
    index: Option<usize>,
    reason: String,
}

impl SettingError {
    /// A setting error with its reason in words ("0 is out of range; allowed: 1 to 1024").
    pub(crate) fn new(setting: Setting, reason: impl Into<String>) -> SettingError {
        SettingError {
            setting,
            consumer: None,
            position: None,
            index: None,
            reason: reason.into(),
        }
    }

    /// The same error, about the named consumer's own setting.
    pub(crate) fn for_consumer(mut self, name: &str) -> SettingError {
        self.consumer = Some(name.to_string());
        self
    }

    /// The same error, about the consumer registered `position`th (from 0).
    pub(crate) fn consumer_at(mut self, position: usize) -> SettingError {
        self.position = Some(position);
        self
    }

    /// The same error, about the `index`th entry of a list setting.
    pub(crate) fn at(mut self, index: usize) -> SettingError {
        self.index = Some(index);
        self
    }

    /// Which setting.
    pub fn setting(&self) -> Setting {
        self.setting
    }

    /// The consumer whose own setting this is (its name as registered);
    /// None for a relay-wide setting.
    pub fn consumer(&self) -> Option<&str> {
        self.consumer.as_deref()
    }

    /// The consumer's position in registration order (from 0), when the
    /// setting is one of a registered consumer's: it tells two consumers
    /// registered under one name apart.
    pub fn consumer_position(&self) -> Option<usize> {
        self.position
    }

    /// For a list setting ([`Setting::ConsumerTypes`]), the position of
    /// the bad entry, from 0.
    pub fn index(&self) -> Option<usize> {
        self.index
    }

    /// What is wrong and what is allowed, without the setting's name.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid setting {}", self.setting)?;
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        if let Some(c) = &self.consumer {
            write!(f, " of consumer {c:?}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for SettingError {}
