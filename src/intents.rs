//! Publish intents: writes to an outside system that are never posted twice,
//! even when the sender dies between the post and its record.
//!
//! A consumer that posts a comment, sends an e-mail through an API or opens a
//! ticket cannot share a transaction with SQLite. It can crash after the
//! outside system accepted the write and before the result was stored, and
//! its retry would post again. The cure (ADR-0005) has three parts:
//!
//! 1. **Record before sending.** The intent is written to `publish_intents`,
//!    unique per (tenant or system scope, idempotency key), in its own
//!    committed transaction, before anything is sent.
//! 2. **Mark the output.** Every intent has a [marker](IntentKey::marker)
//!    derived from its scope and key. The post embeds it in what it sends (an
//!    HTML comment, a header, a metadata field).
//! 3. **Look before posting.** A [`send`] returns the recorded result of a
//!    completed intent without calling anything. Otherwise it first asks the
//!    caller's look-up whether an output carrying the marker exists, and
//!    completes the intent from it; only when there is none does it post.
//!
//! Concurrent senders of one intent (threads, or processes sharing the file)
//! post once: a send *claims* the intent in a short `BEGIN IMMEDIATE`
//! transaction before it looks or posts, and a second sender that finds a
//! live claim gets [`IntentError::InFlight`] (a retry, for a consumer). See
//! [`Intents::lease`] for how a claim ends when its sender dies.
//!
//! # A consumer that posts comments
//!
//! ```
//! use std::sync::Mutex;
//! use outboxd::consumer::{Consumer, Delivery, Outcome};
//! use outboxd::intents::{self, IntentKey};
//!
//! /// The outside system: here a list of comments, searchable by text.
//! #[derive(Default)]
//! struct Tracker { comments: Mutex<Vec<String>> }
//!
//! impl Tracker {
//!     fn post(&self, body: String) -> Result<String, String> {
//!         let mut c = self.comments.lock().unwrap();
//!         c.push(body);
//!         Ok(format!("comment-{}", c.len()))
//!     }
//!     fn find(&self, needle: &str) -> Result<Option<String>, String> {
//!         let c = self.comments.lock().unwrap();
//!         Ok(c.iter().position(|b| b.contains(needle)).map(|i| format!("comment-{}", i + 1)))
//!     }
//! }
//!
//! struct CommentOnArticle { db: Mutex<rusqlite::Connection>, tracker: Tracker }
//!
//! impl Consumer for CommentOnArticle {
//!     fn deliver(&self, d: &Delivery) -> Outcome {
//!         // One intent per event: a redelivery of the event is the same intent.
//!         let key = match IntentKey::new(d.tenant_id.as_deref(), format!("comment/{}", d.envelope.event_id)) {
//!             Ok(key) => key,
//!             Err(e) => return e.outcome(),
//!         };
//!         let db = self.db.lock().unwrap();
//!         let sent = intents::send(
//!             &db,
//!             &key,
//!             |marker| self.tracker.find(marker),
//!             // The marker rides along, hidden, so a retry can find the comment.
//!             |marker| self.tracker.post(format!("Thanks for the article!\n<!-- {marker} -->")),
//!         );
//!         match sent {
//!             Ok(_) => Outcome::Delivered,
//!             Err(e) => e.outcome(), // InFlight and Send are retries.
//!         }
//!     }
//! }
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! # let consumer = CommentOnArticle { db: Mutex::new(conn), tracker: Tracker::default() };
//! # let envelope: outboxd::Envelope = serde_json::from_value(serde_json::json!({
//! #     "event_id": outboxd::EventId::new().to_string(), "event_type": "article.created.v1",
//! #     "event_version": 1, "causation_id": null, "correlation_id": null,
//! #     "occurred_at": "2026-11-30T07:18:00Z", "payload": {"id": 7}})).unwrap();
//! # let d = Delivery::new(envelope).consumer("comments").tenant_id(Some("acme".into()));
//! assert_eq!(consumer.deliver(&d), Outcome::Delivered);
//! // Delivered again (a crash before the relay recorded it): nothing is posted.
//! assert_eq!(consumer.deliver(&d), Outcome::Delivered);
//! assert_eq!(consumer.tracker.comments.lock().unwrap().len(), 1);
//! # Ok(()) }
//! ```
//!
//! The consumer above holds one connection behind a mutex, which sends one
//! intent at a time; a consumer that sends in parallel gives each worker its
//! own connection (an r2d2 pool over [`ConnectionManager`](crate::connection::ConnectionManager)).
//!
//! # How the claim works
//!
//! A claim sets `status = 'pending'`, adds one to `attempts`, and stamps a
//! fresh `claim_token` and `lease_until = now + lease`, the lease of the
//! sender that claims. The claim carries its own end, so senders configured
//! with different leases agree on it: another sender waits until
//! `lease_until`, whatever its own lease. A post that runs long extends the
//! claim ([`IntentLease::extend`], through [`Intents::send_with_lease`]).
//! The token fences: a sender marks its intent failed, or extends it, only
//! `WHERE claim_token = <its token>`, so a sender whose claim expired and was
//! taken over can never release or prolong the new claim. Completion is not
//! fenced: a result is a fact about the outside world, and whichever sender
//! records one first wins; a completed intent never changes.
//!
//! A look-up is made even before the first post. That is not waste: after a
//! completed intent is purged, the same key makes a fresh intent, and only
//! the look-up keeps it from posting again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use sha2::{Digest, Sha256};

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::consumer::Outcome;
use crate::error::{Error, Setting, SettingError};

/// How long a send's claim keeps other senders away by default: 5 minutes.
/// Give the post a timeout shorter than the lease, or extend the lease from
/// a long post ([`Intents::send_with_lease`]).
pub const DEFAULT_INTENT_LEASE: Duration = Duration::from_secs(5 * 60);

/// The shortest lease [`Intents::lease`] accepts.
pub const MIN_INTENT_LEASE: Duration = Duration::from_secs(1);

/// The prefix of every marker.
pub const MARKER_PREFIX: &str = "outboxd-intent-";

/// Result with [`IntentError`] (named apart from [`crate::Result`], whose error is [`crate::Error`]).
pub type IntentResult<T, E = IntentError> = std::result::Result<T, E>;

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

/// Which intent: an idempotency key in the system scope or in a tenant's.
/// The same key in two scopes names two intents.
///
/// ```
/// use outboxd::intents::IntentKey;
/// let a = IntentKey::tenant("acme", "welcome-mail/42").unwrap();
/// let b = IntentKey::tenant("globex", "welcome-mail/42").unwrap();
/// assert_ne!(a.marker(), b.marker());
/// assert!(a.marker().starts_with("outboxd-intent-"));
/// assert!(!a.marker().contains(':'));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IntentKey {
    tenant: Option<String>,
    key: String,
}

impl IntentKey {
    /// A key in a tenant's scope, or the system scope for `None`. The key
    /// must not be empty; a tenant, when given, must not be empty either
    /// (use `None` for the system scope). Any other characters are allowed.
    pub fn new(tenant: Option<&str>, key: impl Into<String>) -> IntentResult<IntentKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(IntentError::InvalidKey {
                reason: "the idempotency key is empty; give a non-empty key that names the write \
                         (such as comment/<event id>)"
                    .into(),
            });
        }
        if tenant == Some("") {
            return Err(IntentError::InvalidKey {
                reason: format!(
                    "the tenant of key {key:?} is empty; give a tenant id, or no tenant for the system scope"
                ),
            });
        }
        Ok(IntentKey {
            tenant: tenant.map(str::to_string),
            key,
        })
    }

    /// A key in the system scope (no tenant).
    pub fn system(key: impl Into<String>) -> IntentResult<IntentKey> {
        IntentKey::new(None, key)
    }

    /// A key in a tenant's scope.
    pub fn tenant(tenant: &str, key: impl Into<String>) -> IntentResult<IntentKey> {
        IntentKey::new(Some(tenant), key)
    }

    /// The tenant, or `None` for the system scope.
    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The marker a post embeds so a retry can find its output:
    /// `outboxd-intent-` and 64 lowercase hex digits of a SHA-256 over the
    /// scope and key. It uses only `a-z`, `0-9` and single `-`, so it fits
    /// an HTML comment, a header value, a metadata field or a queue job id.
    /// It is stable across versions and machines, and different for every
    /// (scope, key): the hash input length-prefixes each part, so tenant
    /// `a:b` with key `c` and tenant `a` with key `b:c` differ.
    ///
    /// A [`send`] uses the marker stored with the intent, which is this one
    /// for every intent this version records.
    pub fn marker(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"outboxd publish intent v1\0");
        match &self.tenant {
            None => h.update([0u8]),
            Some(t) => {
                h.update([1u8]);
                h.update((t.len() as u64).to_be_bytes());
                h.update(t.as_bytes());
            }
        }
        h.update((self.key.len() as u64).to_be_bytes());
        h.update(self.key.as_bytes());
        let digest = h.finalize();
        let mut out = String::with_capacity(MARKER_PREFIX.len() + 64);
        out.push_str(MARKER_PREFIX);
        for b in digest.iter() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

impl fmt::Display for IntentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tenant {
            Some(t) => write!(f, "intent {:?} of tenant {t:?}", self.key),
            None => write!(f, "intent {:?} (system)", self.key),
        }
    }
}

/// Where an intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntentStatus {
    /// Recorded, or being sent (see [`Intent::claimed_until`]).
    Pending,
    /// The last attempt failed; a later send tries again.
    Failed,
    /// Done: its result is recorded and nothing is sent again.
    Completed,
}

impl IntentStatus {
    /// The status as stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            IntentStatus::Pending => "pending",
            IntentStatus::Failed => "failed",
            IntentStatus::Completed => "completed",
        }
    }

    fn parse(s: &str) -> Option<IntentStatus> {
        match s {
            "pending" => Some(IntentStatus::Pending),
            "failed" => Some(IntentStatus::Failed),
            "completed" => Some(IntentStatus::Completed),
            _ => None,
        }
    }
}

impl fmt::Display for IntentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of `publish_intents`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Intent {
    /// The row id.
    pub id: i64,
    /// Its scope and key.
    pub key: IntentKey,
    /// The marker its output carries (as stored).
    pub marker: String,
    /// Where it stands.
    pub status: IntentStatus,
    /// Sends started so far (each claim adds one).
    pub attempts: u32,
    /// What the post (or the look-up) returned; set once completed.
    pub result: Option<String>,
    /// Why the last failed attempt failed (kept after later attempts).
    pub last_error: Option<String>,
    /// When it was first recorded.
    pub created_at: Timestamp,
    /// When it last changed (a claim's start, while pending with attempts).
    pub updated_at: Timestamp,
    /// When it completed.
    pub completed_at: Option<Timestamp>,
    /// When the current sender's claim ends (its lease, as that sender
    /// set or extended it); None when no send holds it.
    pub lease_until: Option<Timestamp>,
}

impl Intent {
    /// When the current sender's claim ends: `Some` for a pending intent
    /// that a send has claimed (it may have ended in the past if the sender
    /// died), `None` otherwise.
    pub fn claimed_until(&self) -> Option<Timestamp> {
        self.lease_until
            .filter(|_| self.status == IntentStatus::Pending)
    }
}

/// A send's live claim, handed to the post of [`Intents::send_with_lease`]:
/// the marker to embed, and a way for a long post to keep its claim.
pub struct IntentLease<'a> {
    conn: &'a Connection,
    claim: &'a Claim,
    clock: &'a dyn Clock,
}

impl IntentLease<'_> {
    /// The marker the post embeds in what it sends.
    pub fn marker(&self) -> &str {
        &self.claim.marker
    }

    /// Extends the claim to `lease` from now (a long upload calls it between
    /// chunks) and returns the new end. Fails with
    /// [`IntentError::LeaseLost`] when the claim already passed to another
    /// sender: the post must then stop, since that sender may post too.
    pub fn extend(&self, lease: Duration) -> IntentResult<Timestamp> {
        if !self.conn.is_autocommit() {
            return Err(IntentError::InTransaction {
                op: "extend an intent's claim",
            });
        }
        let until = self.clock.now().plus(lease);
        let n = self
            .conn
            .prepare_cached(
                "UPDATE publish_intents SET lease_until = ?1
                  WHERE id = ?2 AND claim_token = ?3 AND status = 'pending'",
            )
            .and_then(|mut s| {
                s.execute(params![until.as_millis(), self.claim.id, self.claim.token])
            })
            .map_err(Error::db("extend an intent's claim"))?;
        if n == 1 {
            Ok(until)
        } else {
            Err(IntentError::LeaseLost {
                key: self.claim.key.clone(),
            })
        }
    }
}

/// How a [`send`] came by its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Completion {
    /// The intent was already completed; nothing was called.
    AlreadyCompleted,
    /// The look-up found an output carrying the marker; nothing was posted.
    Found,
    /// This send posted.
    Posted,
}

/// A completed send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    /// The intent, completed.
    pub intent: Intent,
    /// How this send came by the result.
    pub how: Completion,
}

impl SendResult {
    /// The recorded result (the first one recorded, if two senders raced).
    pub fn result(&self) -> &str {
        self.intent.result.as_deref().unwrap_or_default()
    }

    /// True when this send posted.
    pub fn posted(&self) -> bool {
        self.how == Completion::Posted
    }
}

/// Intent operations with settings other than the defaults: the clock and
/// the claim lease. The free functions ([`record`], [`send`]…) use
/// `Intents::new()`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
/// # outboxd::schema::migrate(&mut conn)?;
/// use std::time::Duration;
/// use outboxd::intents::{IntentKey, Intents, IntentStatus};
/// let intents = Intents::new().lease(Duration::from_secs(30))?;
/// let intent = intents.record(&conn, &IntentKey::system("nightly-report/2026-11-30")?)?;
/// assert_eq!(intent.status, IntentStatus::Pending);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Intents {
    clock: Arc<dyn Clock>,
    lease: Duration,
}

impl fmt::Debug for Intents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intents")
            .field("now", &self.clock.now())
            .field("lease", &self.lease)
            .finish()
    }
}

impl Default for Intents {
    fn default() -> Self {
        Intents::new()
    }
}

/// Reads the row for a key; the SQL differs by scope so each query uses its
/// partial unique index.
const SELECT_COLUMNS: &str = "SELECT id, tenant_id, idempotency_key, marker, status, attempts, \
     result, last_error, created_at, updated_at, completed_at, lease_until FROM publish_intents";

impl Intents {
    /// The system clock and [`DEFAULT_INTENT_LEASE`].
    pub fn new() -> Intents {
        Intents {
            clock: Arc::new(SystemClock),
            lease: DEFAULT_INTENT_LEASE,
        }
    }

    /// Reads the time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Intents {
        self.clock = Arc::new(clock);
        self
    }

    /// How long a send's claim keeps other senders away (default
    /// [`DEFAULT_INTENT_LEASE`], at least [`MIN_INTENT_LEASE`]). A sender that dies
    /// mid-send holds the intent until its claim ends; then the next send
    /// takes over and looks up before posting. Make it longer than the
    /// slowest post, or extend it from the post
    /// ([`send_with_lease`](Intents::send_with_lease)): a claim taken over
    /// while its post is still running can post twice. The claim records its
    /// own end, so senders with different leases are safe together.
    pub fn lease(mut self, lease: Duration) -> IntentResult<Intents> {
        if lease < MIN_INTENT_LEASE {
            return Err(Error::from(SettingError::new(
                Setting::IntentLease,
                format!(
                    "{} is shorter than the minimum of {}; give a lease longer than the slowest post",
                    crate::text::duration(lease),
                    crate::text::duration(MIN_INTENT_LEASE)
                ),
            ))
            .into());
        }
        self.lease = lease;
        Ok(self)
    }

    /// The lease in use.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// See [`record`].
    pub fn record(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Intent> {
        let tx = begin(conn, "record an intent")?;
        let intent = insert_or_get(&tx, key, self.clock.now())?;
        tx.commit().map_err(Error::db("commit an intent"))?;
        Ok(intent)
    }

    /// See [`get`].
    pub fn get(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Option<Intent>> {
        Ok(select(conn, key)?)
    }

    /// See [`send`].
    pub fn send<L, P, E>(
        &self,
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
        self.send_with_lease(conn, key, lookup, |lease| post(lease.marker()))
    }

    /// [`send`](Intents::send) for a post that may outlast its lease: the
    /// post gets the claim as an [`IntentLease`], whose
    /// [`extend`](IntentLease::extend) keeps other senders away for longer
    /// (and says when the claim was lost, so the post can stop).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
    /// # outboxd::schema::migrate(&mut conn)?;
    /// use std::time::Duration;
    /// use outboxd::intents::{IntentKey, Intents};
    /// let intents = Intents::new().lease(Duration::from_secs(30))?;
    /// let sent = intents.send_with_lease(
    ///     &conn,
    ///     &IntentKey::system("upload/report-2026-11")?,
    ///     |_marker| Ok::<_, String>(None),
    ///     |lease| {
    ///         for _chunk in 0..3 {
    ///             // ... upload a chunk tagged with lease.marker() ...
    ///             lease.extend(Duration::from_secs(30)).map_err(|e| e.to_string())?;
    ///         }
    ///         Ok("upload-1".to_string())
    ///     },
    /// )?;
    /// assert!(sent.posted());
    /// # Ok(()) }
    /// ```
    pub fn send_with_lease<L, P, E>(
        &self,
        conn: &Connection,
        key: &IntentKey,
        lookup: L,
        post: P,
    ) -> IntentResult<SendResult>
    where
        L: FnOnce(&str) -> std::result::Result<Option<String>, E>,
        P: FnOnce(&IntentLease<'_>) -> std::result::Result<String, E>,
        E: fmt::Display,
    {
        let claim = match self.claim(conn, key)? {
            Claimed::Done(intent) => {
                return Ok(SendResult {
                    intent,
                    how: Completion::AlreadyCompleted,
                })
            }
            Claimed::Mine(claim) => claim,
        };
        // From here until the result is recorded, a panic in the caller's
        // code must not leave the claim standing for a whole lease.
        let mut guard = PanicRelease {
            conn,
            claim: &claim,
            now: &*self.clock,
            armed: true,
        };
        let found = match lookup(&claim.marker) {
            Ok(found) => found,
            Err(e) => {
                guard.armed = false;
                return Err(self.fail(conn, &claim, format!("the look-up failed: {e}")));
            }
        };
        let lease = IntentLease {
            conn,
            claim: &claim,
            clock: &*self.clock,
        };
        let (result, how) = match found {
            Some(result) => (result, Completion::Found),
            None => match post(&lease) {
                Ok(result) => (result, Completion::Posted),
                Err(e) => {
                    guard.armed = false;
                    return Err(self.fail(conn, &claim, format!("the post failed: {e}")));
                }
            },
        };
        guard.armed = false;
        match self.complete(conn, &claim, &result) {
            Ok(intent) => Ok(SendResult { intent, how }),
            Err(source) => {
                // Free the claim if the database lets us, so the next send
                // need not wait out the lease; it finds the output by marker.
                let reason = format!("the result {result:?} could not be recorded: {source}");
                let _ = self.fail(conn, &claim, reason);
                Err(IntentError::NotRecorded {
                    key: claim.key.clone(),
                    source: Box::new(source),
                })
            }
        }
    }

    /// See [`list_open`].
    pub fn list_open(&self, conn: &Connection) -> IntentResult<Vec<Intent>> {
        let mut stmt = conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE status <> 'completed' ORDER BY updated_at, id"
            ))
            .map_err(Error::db("list open intents"))?;
        let rows = stmt
            .query_map([], read_intent)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(Error::db("list open intents"))?;
        Ok(rows)
    }

    /// See [`purge_completed`].
    pub fn purge_completed(
        &self,
        conn: &Connection,
        older_than: Timestamp,
        batch: usize,
    ) -> IntentResult<usize> {
        if batch == 0 {
            return Err(Error::from(SettingError::new(
                Setting::IntentPurgeBatch,
                "0 rows per batch would never finish; give 1 or more (100 to 1000 keeps \
                 each write short)",
            ))
            .into());
        }
        let mut total = 0;
        loop {
            let n = purge_completed_batch(conn, older_than, batch)
                .map_err(Error::db("purge completed intents"))?;
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
    }

    /// Records the intent if needed and claims it, in one short committed
    /// write transaction.
    fn claim(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Claimed> {
        let tx = begin(conn, "claim an intent")?;
        let now = self.clock.now();
        let intent = insert_or_get(&tx, key, now)?;
        if intent.status == IntentStatus::Completed {
            return Ok(Claimed::Done(intent));
        }
        if let Some(until) = intent.claimed_until() {
            if until > now {
                return Err(IntentError::InFlight {
                    key: key.clone(),
                    attempt: intent.attempts,
                    until,
                    wait: until.since(now),
                });
            }
            tracing::warn!(
                intent = %key,
                attempt = intent.attempts,
                "taking over an intent whose sender's claim expired; looking up before posting"
            );
        }
        let attempt = intent.attempts + 1;
        let token = ulid::Ulid::generate().to_string();
        // Compare-and-set on the attempt number: under BEGIN IMMEDIATE
        // nobody else writes, but it keeps the claim honest on its own.
        let n = tx
            .execute(
                "UPDATE publish_intents
                    SET status = 'pending', attempts = ?1, updated_at = ?2,
                        claim_token = ?3, lease_until = ?4
                  WHERE id = ?5 AND attempts = ?6 AND status <> 'completed'",
                params![
                    attempt,
                    now.as_millis(),
                    token,
                    now.plus(self.lease).as_millis(),
                    intent.id,
                    intent.attempts
                ],
            )
            .map_err(Error::db("claim an intent"))?;
        if n != 1 {
            return Err(Error::Invariant {
                what: format!("claiming {key} changed {n} rows under the write lock, not 1"),
            }
            .into());
        }
        tx.commit().map_err(Error::db("commit an intent claim"))?;
        Ok(Claimed::Mine(Claim {
            id: intent.id,
            key: key.clone(),
            marker: intent.marker,
            attempt,
            token,
        }))
    }

    /// Records the result unless the intent is completed already, and reads
    /// the intent back (with the first recorded result).
    fn complete(&self, conn: &Connection, claim: &Claim, result: &str) -> crate::Result<Intent> {
        let now = self.clock.now().as_millis();
        conn.execute(
            "UPDATE publish_intents
             SET status = 'completed', result = ?1, completed_at = ?2, updated_at = ?2,
                 claim_token = NULL, lease_until = NULL
             WHERE id = ?3 AND status <> 'completed'",
            params![result, now, claim.id],
        )
        .map_err(Error::db("complete an intent"))?;
        select(conn, &claim.key)?.ok_or_else(|| Error::Invariant {
            what: format!(
                "{} (row {}) is gone right after completing it",
                claim.key, claim.id
            ),
        })
    }

    /// Marks the intent failed if this sender's claim still stands, and
    /// returns the error for the caller.
    fn fail(&self, conn: &Connection, claim: &Claim, reason: String) -> IntentError {
        if let Err(e) = release(conn, claim, &reason, self.clock.now()) {
            tracing::warn!(intent = %claim.key, error = %e, "cannot mark an intent failed; its claim ends with its lease");
        }
        IntentError::Send {
            key: claim.key.clone(),
            attempt: claim.attempt,
            reason,
        }
    }
}

enum Claimed {
    Done(Intent),
    Mine(Claim),
}

/// This sender's claim on an intent.
struct Claim {
    id: i64,
    key: IntentKey,
    marker: String,
    attempt: u32,
    /// The fence: every write that ends or extends the claim names it.
    token: String,
}

/// Marks a claimed intent failed when the caller's look-up or post panics,
/// so the next send need not wait for the lease to end.
struct PanicRelease<'a> {
    conn: &'a Connection,
    claim: &'a Claim,
    now: &'a dyn Clock,
    armed: bool,
}

impl Drop for PanicRelease<'_> {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            let _ = release(
                self.conn,
                self.claim,
                "the look-up or post panicked; the next send looks up before posting",
                self.now.now(),
            );
        }
    }
}

/// The fenced "failed" write: only while this sender's claim stands.
fn release(conn: &Connection, claim: &Claim, reason: &str, now: Timestamp) -> crate::Result<()> {
    conn.execute(
        "UPDATE publish_intents
            SET status = 'failed', last_error = ?1, updated_at = ?2,
                claim_token = NULL, lease_until = NULL
          WHERE id = ?3 AND claim_token = ?4 AND status = 'pending'",
        params![reason, now.as_millis(), claim.id, claim.token],
    )
    .map_err(Error::db("mark an intent failed"))?;
    Ok(())
}

fn begin<'c>(conn: &'c Connection, op: &'static str) -> IntentResult<Transaction<'c>> {
    if !conn.is_autocommit() {
        return Err(IntentError::InTransaction { op });
    }
    Ok(Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(Error::db(op))?)
}

fn insert_or_get(conn: &Connection, key: &IntentKey, now: Timestamp) -> IntentResult<Intent> {
    // ON CONFLICT DO NOTHING: the scope's unique index decides, atomically.
    conn.prepare_cached(
        "INSERT INTO publish_intents (tenant_id, idempotency_key, marker, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![key.tenant, key.key, key.marker(), now.as_millis()]))
    .map_err(Error::db("record an intent"))?;
    Ok(select(conn, key)?.ok_or_else(|| Error::Invariant {
        what: format!("{key} is gone right after recording it"),
    })?)
}

fn select(conn: &Connection, key: &IntentKey) -> crate::Result<Option<Intent>> {
    match &key.tenant {
        Some(t) => conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE tenant_id = ?1 AND idempotency_key = ?2"
            ))
            .and_then(|mut s| s.query_row(params![t, key.key], read_intent).optional()),
        None => conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE tenant_id IS NULL AND idempotency_key = ?1"
            ))
            .and_then(|mut s| s.query_row(params![key.key], read_intent).optional()),
    }
    .map_err(Error::db("read an intent"))
}

fn read_intent(r: &rusqlite::Row<'_>) -> rusqlite::Result<Intent> {
    let status: String = r.get(4)?;
    let status = IntentStatus::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown intent status {status:?}; expected pending, failed or completed")
                .into(),
        )
    })?;
    Ok(Intent {
        id: r.get(0)?,
        key: IntentKey {
            tenant: r.get(1)?,
            key: r.get(2)?,
        },
        marker: r.get(3)?,
        status,
        attempts: r.get(5)?,
        result: r.get(6)?,
        last_error: r.get(7)?,
        created_at: Timestamp::from_millis(r.get(8)?),
        updated_at: Timestamp::from_millis(r.get(9)?),
        completed_at: r.get::<_, Option<i64>>(10)?.map(Timestamp::from_millis),
        lease_until: r.get::<_, Option<i64>>(11)?.map(Timestamp::from_millis),
    })
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
    Intents::new().record(conn, key)
}

/// The intent recorded for a key, if any. Reads only.
pub fn get(conn: &Connection, key: &IntentKey) -> IntentResult<Option<Intent>> {
    Intents::new().get(conn, key)
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
    Intents::new().send(conn, key, lookup, post)
}

/// The intents an operator may need to look at: pending (recorded, or being
/// sent) and failed, least recently changed first. Reads only.
pub fn list_open(conn: &Connection) -> IntentResult<Vec<Intent>> {
    Intents::new().list_open(conn)
}

/// One bounded delete of completed intents older than `older_than`; the
/// relay's housekeeping runs it inside its purge transaction.
pub(crate) fn purge_completed_batch(
    conn: &Connection,
    older_than: Timestamp,
    batch: usize,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM publish_intents WHERE id IN (
             SELECT id FROM publish_intents
             WHERE status = 'completed' AND completed_at < ?1
             ORDER BY completed_at LIMIT ?2)",
    )?
    .execute(params![
        older_than.as_millis(),
        i64::try_from(batch).unwrap_or(i64::MAX)
    ])
}

/// How many completed intents completed before `older_than` (what a purge
/// with that cutoff would delete).
pub(crate) fn count_completed_before(
    conn: &Connection,
    older_than: Timestamp,
) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT count(*) FROM publish_intents WHERE status = 'completed' AND completed_at < ?1",
        [older_than.as_millis()],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
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
    Intents::new().purge_completed(conn, older_than, batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_stable_and_colon_free() {
        let m = IntentKey::tenant("acme", "comment/1").unwrap().marker();
        assert_eq!(m.len(), MARKER_PREFIX.len() + 64);
        assert!(m
            .trim_start_matches(MARKER_PREFIX)
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert!(!m.contains("--"), "fits an HTML comment");
        // Pinned (computed independently): a marker already embedded in
        // posted outputs must be found by every later version.
        assert_eq!(
            IntentKey::system("k").unwrap().marker(),
            "outboxd-intent-43e88af8faad6221e5d5cfde6793acb9f559b9375e9adfd2389e2a9bb086f734"
        );
        assert_eq!(
            m,
            "outboxd-intent-2c22f0ea03391ec46f65e3a44de0128229022352173e123614c99a3900f0e55e"
        );
    }

    #[test]
    fn marker_parts_cannot_run_together() {
        let m = |t: Option<&str>, k: &str| IntentKey::new(t, k).unwrap().marker();
        assert_ne!(m(Some("a:b"), "c"), m(Some("a"), "b:c"));
        assert_ne!(m(Some("ab"), "c"), m(Some("a"), "bc"));
        assert_ne!(m(None, "k"), m(Some("system"), "k"));
        assert_ne!(m(None, "k"), m(Some("\0"), "k"));
    }

    #[test]
    fn empty_keys_and_tenants_are_refused() {
        assert!(matches!(
            IntentKey::system(""),
            Err(IntentError::InvalidKey { .. })
        ));
        let e = IntentKey::tenant("", "k").unwrap_err();
        assert!(e.to_string().contains("system scope"), "{e}");
    }

    /// A claim made under schema version 1 (no lease column) keeps the end
    /// version 1 gave it once the database is migrated: its start plus the
    /// default lease, so no second sender posts while it may be running.
    #[test]
    fn a_claim_made_before_the_lease_columns_keeps_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::connection::open(dir.path().join("v1.db")).unwrap();
        crate::schema::migrate_up_to(&mut conn, 1).unwrap();
        conn.execute_batch(
            "INSERT INTO publish_intents (idempotency_key, marker, status, attempts, updated_at)
                  VALUES ('claimed', 'm1', 'pending', 2, 1000000),
                         ('recorded', 'm2', 'pending', 0, 1000000),
                         ('failed', 'm3', 'failed', 1, 1000000)",
        )
        .unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        let get = |k: &str| get(&conn, &IntentKey::system(k).unwrap()).unwrap().unwrap();
        let start = Timestamp::from_millis(1_000_000);
        assert_eq!(
            get("claimed").claimed_until(),
            Some(start.plus(DEFAULT_INTENT_LEASE))
        );
        assert_eq!(get("recorded").claimed_until(), None);
        assert_eq!(get("failed").claimed_until(), None);
        let clock = crate::ManualClock::new(start.plus(Duration::from_secs(60)));
        let e = Intents::new()
            .clock(clock)
            .send(
                &conn,
                &IntentKey::system("claimed").unwrap(),
                |_| Ok::<_, String>(None),
                |_| Ok("posted".to_string()),
            )
            .unwrap_err();
        assert!(e.is_in_flight(), "{e}");
    }

    #[test]
    fn lease_must_be_at_least_the_minimum() {
        assert!(Intents::new().lease(Duration::from_millis(10)).is_err());
        assert_eq!(
            Intents::new()
                .lease(MIN_INTENT_LEASE)
                .unwrap()
                .lease_duration(),
            MIN_INTENT_LEASE
        );
    }
}
