//! Publish intents: writes to an outside system that are never posted twice,
//! even when the sender dies between the post and its record.
//!
//! A consumer that posts a comment, sends an e-mail through an API or opens a
//! ticket cannot share a transaction with SQLite: it can crash after the
//! outside system accepted the write and before the result was stored, and
//! its retry would post again. The cure (ADR-0005): the intent is recorded in
//! `publish_intents` before anything is sent ([`record`]); every intent has a
//! [marker](IntentKey::marker) that the post embeds in what it sends; and a
//! [`send`] looks for an output carrying the marker before it posts, so a
//! retry completes from the output instead of posting again. Concurrent
//! senders of one intent post once: a send claims the intent first, and a
//! second sender gets [`IntentError::InFlight`] until the claim ends
//! ([`Intents::lease`]).
//!
//! docs/publish-intents.md is the user's guide: a consumer that posts
//! comments, what the look-up and the post must do, how claims and leases
//! work, and what operators can see and purge.
//!
//! The files: `key` (the key and its marker), `intent` (a recorded intent),
//! `settings` ([`Intents`]: clock and lease), `store` (the SQL over
//! `publish_intents`) and `send` (the send-at-most-once logic).

use std::fmt;
use std::time::Duration;

use rusqlite::Connection;

use crate::clock::Timestamp;
use crate::consumer::Outcome;
use crate::error::Error;

mod intent;
mod key;
mod send;
mod senders;
mod settings;
mod store;

pub use intent::{Intent, IntentStatus};
pub use key::{IntentKey, MARKER_PREFIX};
pub use send::{Completion, IntentLease, SendResult};
pub use settings::{Intents, DEFAULT_INTENT_LEASE, MIN_INTENT_LEASE};
pub(crate) use store::{claimed_by, count_completed_before, purge_completed_batch};

/// Result with [`IntentError`] (named apart from [`crate::Result`], whose error is [`crate::Error`]).
pub type IntentResult<T, E = IntentError> = std::result::Result<T, E>;

// The error lives here rather than in a file of its own: the key builds it
// and it names the key, so every file of the module uses it.

/// What can go wrong recording or sending an intent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntentError {
    /// The database refused an operation (busy, missing table, I/O).
    #[error(transparent)]
    Store(#[from] Error),
    /// The tenant or key is not usable.
    #[error("invalid intent key: {reason}")]
    InvalidKey {
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The connection is inside a transaction. Intents are recorded in their
    /// own committed transaction, before anything is sent: inside the
    /// caller's transaction the record could roll back after the post.
    #[error(
        "cannot {op} inside a transaction: publish intents commit on their own; \
         pass a connection in autocommit mode (not a Transaction or Savepoint)"
    )]
    InTransaction {
        /// What was being done ("record an intent").
        op: &'static str,
    },
    /// Another sender holds a live claim on the intent; it is being sent.
    #[error("{key} is being sent by another sender (attempt {attempt}); try again after {until}")]
    InFlight {
        /// The intent's key.
        key: IntentKey,
        /// The other sender's attempt number.
        attempt: u32,
        /// When its claim ends, if it does not finish first.
        until: Timestamp,
        /// How long from the refusal until then.
        wait: Duration,
    },
    /// The look-up or the post failed. The intent is marked failed; a later
    /// send looks up again before posting.
    #[error("cannot send {key} (attempt {attempt}): {reason}")]
    Send {
        /// The intent's key.
        key: IntentKey,
        /// The attempt that failed.
        attempt: u32,
        /// The caller's error, as text, and which step gave it.
        reason: String,
    },
    /// The claim passed to another sender (its lease ran out) before this
    /// sender extended it: stop, since the other sender looks up and posts.
    #[error("the claim on {key} passed to another sender: its lease ran out; do not post")]
    LeaseLost {
        /// The intent's key.
        key: IntentKey,
    },
    /// The post succeeded but its result could not be recorded. The next
    /// send finds the output by its marker and completes the intent from it.
    #[error("{key} was posted but its result could not be recorded ({source}); the next send completes it from the look-up")]
    NotRecorded {
        /// The intent's key.
        key: IntentKey,
        /// Why the record failed.
        #[source]
        source: Box<Error>,
    },
}

impl IntentError {
    /// What a consumer should report for this error: a retry for anything a
    /// later attempt can fix (after the claim ends, for [`InFlight`](Self::InFlight)),
    /// poison for a bad key or a connection inside a transaction, which no
    /// retry fixes.
    ///
    /// ```
    /// use outboxd::intents::IntentKey;
    /// use outboxd::Outcome;
    /// let e = IntentKey::system("").unwrap_err();
    /// assert!(matches!(e.outcome(), Outcome::Poison { .. }));
    /// ```
    pub fn outcome(&self) -> Outcome {
        match self {
            IntentError::InFlight { wait, .. } => Outcome::retry_after(self.to_string(), *wait),
            IntentError::InvalidKey { .. } | IntentError::InTransaction { .. } => {
                Outcome::poison(self.to_string())
            }
            IntentError::Store(e) if e.is_schema() => Outcome::poison(self.to_string()),
            _ => Outcome::retry(self.to_string()),
        }
    }

    /// True when another sender holds the intent.
    pub fn is_in_flight(&self) -> bool {
        matches!(self, IntentError::InFlight { .. })
    }
}

/// Records an intent before anything is sent, in its own committed
/// `BEGIN IMMEDIATE` transaction, and returns it. Recording the same (scope,
/// key) again writes nothing and returns the existing intent. The connection
/// must be in autocommit mode ([`IntentError::InTransaction`] otherwise).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
/// # outboxd::schema::migrate(&mut conn)?;
/// use outboxd::intents::{self, IntentKey};
/// let key = IntentKey::tenant("acme", "invoice-mail/1001")?;
/// let first = intents::record(&conn, &key)?;
/// assert_eq!(intents::record(&conn, &key)?.id, first.id);
/// assert_eq!(first.marker, key.marker());
/// # Ok(()) }
/// ```
pub fn record(conn: &Connection, key: &IntentKey) -> IntentResult<Intent> {
    default().record(conn, key)
}

/// The intent recorded for a key, if any. Reads only.
pub fn get(conn: &Connection, key: &IntentKey) -> IntentResult<Option<Intent>> {
    default().get(conn, key)
}

/// Sends an intent at most once, with the default lease and the system clock.
///
/// - A completed intent returns its recorded result; neither closure is called.
/// - Otherwise the intent is recorded if new and claimed (its own committed
///   transaction), and `lookup(marker)` is asked whether an output carrying
///   the marker exists. `Ok(Some(result))` completes the intent from it,
///   without posting.
/// - `Ok(None)`: `post(marker)` sends, embedding the marker in what it sends,
///   and its `Ok(result)` is recorded and completes the intent.
/// - An `Err` from either closure marks the intent failed (kept with the
///   reason in `last_error`) and returns [`IntentError::Send`]; a panic
///   marks it failed too, then unwinds. The next send tries again, looking
///   up first.
/// - If another sender holds a live claim, returns [`IntentError::InFlight`]
///   without calling anything.
///
/// The look-up must see what the post wrote at once: list the target's
/// outputs rather than query a search index that lags, or a retry may post
/// again. The connection must be in autocommit mode.
/// [`IntentError::outcome`] turns any error into the consumer's [`Outcome`].
pub fn send<L, P, E>(
    conn: &Connection,
    key: &IntentKey,
    lookup: L,
    post: P,
) -> IntentResult<SendResult>
where
    L: FnOnce(&str) -> std::result::Result<Option<String>, E>,
    P: FnOnce(&str) -> std::result::Result<String, E>,
    E: fmt::Display,
{
    default().send(conn, key, lookup, post)
}

/// The intents an operator may need to look at: pending (recorded, or being
/// sent) and failed, least recently changed first. Reads only.
pub fn list_open(conn: &Connection) -> IntentResult<Vec<Intent>> {
    default().list_open(conn)
}

/// Deletes completed intents that completed before `older_than`, `batch`
/// rows per statement so no write holds the lock for long; in autocommit
/// mode each batch commits on its own. Returns how many were deleted.
/// Pending and failed intents are never purged.
///
/// After a purge, sending the same key again records a fresh intent, and
/// only the look-up keeps it from posting again: keep completed intents at
/// least as long as a redelivery can arrive.
pub fn purge_completed(
    conn: &Connection,
    older_than: Timestamp,
    batch: usize,
) -> IntentResult<usize> {
    default().purge_completed(conn, older_than, batch)
}

/// The `Intents` of the free functions: one sender for the whole process,
/// so they share one lock file ([`crate::liveness`]).
fn default() -> &'static Intents {
    static DEFAULT: std::sync::LazyLock<Intents> = std::sync::LazyLock::new(Intents::new);
    &DEFAULT
}

/// docs/publish-intents.md's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../docs/publish-intents.md")]
pub struct GuideDoctests;
