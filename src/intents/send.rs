//! Sending an intent at most once: claim it, look for an output carrying its
//! marker, post only when there is none, and record the result.

use std::fmt;
use std::time::Duration;

use rusqlite::Connection;

use super::intent::{Intent, IntentStatus};
use super::key::IntentKey;
use super::settings::{Intents, MIN_INTENT_LEASE};
use super::store;
use super::{IntentError, IntentResult};
use crate::clock::{Clock, Timestamp};
use crate::error::Error;
use crate::liveness::Verdict;

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
        let n = store::extend_claim(self.conn, self.claim.id, &self.claim.token, until)?;
        if n == 1 {
            Ok(until)
        } else {
            Err(IntentError::LeaseLost {
                key: self.claim.key.clone(),
            })
        }
    }
}

/// How a [`send`](super::send) came by its result.
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

impl Intents {
    /// See [`send`](super::send).
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

    /// Records the intent if needed and claims it, in one short committed
    /// write transaction.
    fn claim(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Claimed> {
        let tx = store::begin(conn, "claim an intent")?;
        let now = self.clock.now();
        let intent = store::insert_or_get(&tx, key, now)?;
        if intent.status == IntentStatus::Completed {
            return Ok(Claimed::Done(intent));
        }
        let until = intent.claimed_until();
        let held = match until {
            Some(_) => store::claim_token(&tx, intent.id)?,
            None => None,
        };
        let (token, verdict) = self
            .senders
            .token_and_verdict(conn, self.lease, held.as_deref());
        if let Some(until) = until {
            // A live sender's claim stands whatever the clocks say; one
            // that ended is taken at once; an older sender's ends with its
            // time (crate::liveness).
            let stands = match verdict {
                Verdict::Live => true,
                Verdict::Gone | Verdict::Hung => false,
                Verdict::Unknown => until > now,
            };
            if stands {
                let wait = until.since(now);
                return Err(IntentError::InFlight {
                    key: key.clone(),
                    attempt: intent.attempts,
                    until,
                    wait: if wait.is_zero() {
                        MIN_INTENT_LEASE
                    } else {
                        wait
                    },
                });
            }
            tracing::warn!(
                intent = %key,
                attempt = intent.attempts,
                sender = ?verdict,
                "taking over an intent whose sender ended, stopped, or whose claim expired; \
                 looking up before posting"
            );
        }
        let attempt = intent.attempts + 1;
        let n = store::set_claim(&tx, &intent, attempt, &token, now, now.plus(self.lease))?;
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
        store::set_completed(conn, claim.id, result, self.clock.now())?;
        store::select(conn, &claim.key)?.ok_or_else(|| Error::Invariant {
            what: format!(
                "{} (row {}) is gone right after completing it",
                claim.key, claim.id
            ),
        })
    }

    /// Marks the intent failed if this sender's claim still stands, and
    /// returns the error for the caller.
    fn fail(&self, conn: &Connection, claim: &Claim, reason: String) -> IntentError {
        if let Err(e) = store::release(conn, claim.id, &claim.token, &reason, self.clock.now()) {
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
            let _ = store::release(
                self.conn,
                self.claim.id,
                &self.claim.token,
                "the look-up or post panicked; the next send looks up before posting",
                self.now.now(),
            );
        }
    }
}
