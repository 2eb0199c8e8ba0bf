//! Replay: deliver events again to one consumer, although it already had them.
//!
//! The consumer's entries in the dedup ledger are removed for the chosen
//! events and their rows go back to pending, scoped to that consumer
//! (`replay_consumers`): the relay runs that consumer alone, even for a
//! consumer added since the event was delivered or one whose entry is gone,
//! and then gives the row back the status it had (a dead letter stays one,
//! with its reason). A row still pending is not scoped: its own delivery
//! runs every consumer that lacks the event, the replayed one included.
//! Events whose rows were purged cannot be replayed.
//!
//! A consumer name the database has never seen (no entry in the ledger)
//! and the caller did not declare ([`ReplayFilter::known_consumers`]) is an
//! error listing the names it knows: a typo would otherwise replay nothing
//! and say so with success.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! use outboxd::replay::{replay, ReplayFilter};
//! let filter = ReplayFilter::new("indexer").known_consumers(["indexer"]);
//! assert_eq!(replay(&mut conn, &filter, outboxd::Timestamp::now())?, 0);
//! let typo = ReplayFilter::new("indexr");
//! assert!(matches!(
//!     replay(&mut conn, &typo, outboxd::Timestamp::now()),
//!     Err(outboxd::Error::UnknownConsumer { .. })
//! ));
//! # Ok(()) }
//! ```

use rusqlite::{params, Connection, TransactionBehavior};

use crate::clock::Timestamp;
use crate::envelope::EventId;
use crate::error::{Error, Result, Setting, SettingError};
use crate::router::Pattern;

/// Rows replayed per transaction.
const BATCH: usize = 1000;

/// Which events to replay, to which consumer. Filters combine with AND; an
/// empty `ids` means any id.
///
/// ```
/// use outboxd::replay::ReplayFilter;
/// use outboxd::router::Pattern;
/// let filter = ReplayFilter::new("indexer")
///     .event_type(Pattern::parse("article.*.v1").unwrap())
///     .since("2026-11-30T00:00:00Z".parse().unwrap());
/// assert_eq!(filter.consumer, "indexer");
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReplayFilter {
    /// The consumer to deliver to again.
    pub consumer: String,
    /// Only these event ids.
    pub ids: Vec<EventId>,
    /// Only event types matching this pattern.
    pub event_type: Option<Pattern>,
    /// Only events that occurred at or after this time.
    pub since: Option<Timestamp>,
    /// Only events that occurred before this time.
    pub until: Option<Timestamp>,
    /// Consumer names the caller knows to exist (its configured consumers),
    /// whether or not the ledger has entries of theirs yet.
    pub known_consumers: Vec<String>,
}

impl ReplayFilter {
    /// Every event delivered to `consumer`.
    pub fn new(consumer: impl Into<String>) -> ReplayFilter {
        ReplayFilter {
            consumer: consumer.into(),
            ..ReplayFilter::default()
        }
    }

    /// Only these event ids (none: any id).
    #[must_use]
    pub fn ids(mut self, ids: impl IntoIterator<Item = EventId>) -> Self {
        self.ids = ids.into_iter().collect();
        self
    }

    /// Only event types matching `pattern`.
    #[must_use]
    pub fn event_type(mut self, pattern: Pattern) -> Self {
        self.event_type = Some(pattern);
        self
    }

    /// Only events that occurred at or after `t`.
    #[must_use]
    pub fn since(mut self, t: Timestamp) -> Self {
        self.since = Some(t);
        self
    }

    /// Only events that occurred before `t`.
    #[must_use]
    pub fn until(mut self, t: Timestamp) -> Self {
        self.until = Some(t);
        self
    }

    /// Declares the consumers that exist (a config's consumers), so a
    /// replay to one of them that has no deliveries yet replays nothing
    /// rather than failing as [`Error::UnknownConsumer`].
    #[must_use]
    pub fn known_consumers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.known_consumers = names.into_iter().map(Into::into).collect();
        self
    }
}

/// Replays the events the filter selects that were delivered to the
/// consumer. Returns how many rows were put back. Fails with
/// [`Error::UnknownConsumer`] for a consumer neither the ledger nor
/// [`ReplayFilter::known_consumers`] knows.
pub fn replay(conn: &mut Connection, filter: &ReplayFilter, now: Timestamp) -> Result<u64> {
    replay_with_progress(conn, filter, now, |_, _| {})
}

/// How many rows the filter selects now: what [`replay`] would put back,
/// less any row a relay holds leased when it runs (left to that relay). The
/// console shows it before replaying.
pub fn count(conn: &Connection, filter: &ReplayFilter) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    check_known(conn, filter)?;
    Ok(candidates(conn, filter)?.len() as u64)
}

/// [`replay`], calling `progress(done, total)` after each batch.
pub fn replay_with_progress(
    conn: &mut Connection,
    filter: &ReplayFilter,
    now: Timestamp,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    if filter.consumer.is_empty() {
        return Err(SettingError::new(
            Setting::ReplayConsumer,
            "is empty; name the consumer to replay to",
        )
        .into());
    }
    check_known(conn, filter)?;
    let rows = candidates(conn, filter)?;
    let total = rows.len() as u64;
    let mut done = 0;
    for chunk in rows.chunks(BATCH) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::db("start a replay"))?;
        {
            // A leased row is left to its relay: replaying it mid-delivery
            // would race the lease. A finished row is scoped to the consumer
            // (see the module doc); a pending row is not, since its own
            // delivery runs every consumer without an entry anyway, unless a
            // replay scoped it already (then the scope grows).
            let mut reopen = tx
                .prepare_cached(
                    "UPDATE event_outbox
                        SET replay_consumers = CASE
                                WHEN status <> 'pending' THEN ?3
                                WHEN replay_consumers IS NULL THEN NULL
                                ELSE replay_consumers || ',' || ?3 END,
                            status_before_replay = CASE
                                WHEN status <> 'pending' THEN status
                                ELSE status_before_replay END,
                            status = 'pending', attempts = 0, available_at = ?2, finished_at = NULL
                      WHERE id = ?1 AND claim_token IS NULL",
                )
                .map_err(Error::db("replay events"))?;
            for (row_id, key) in chunk {
                let reopened = reopen
                    .execute(params![row_id, now.as_millis(), filter.consumer])
                    .map_err(Error::db("replay events"))?;
                if reopened == 1 {
                    crate::dedup::forget(&tx, key, &filter.consumer)
                        .map_err(Error::db("replay events"))?;
                    done += 1;
                }
            }
        }
        tx.commit().map_err(Error::db("commit a replay"))?;
        progress(done, total);
    }
    Ok(done)
}

/// Fails unless the ledger or the caller knows the consumer.
fn check_known(conn: &Connection, filter: &ReplayFilter) -> Result<()> {
    let name = &filter.consumer;
    if filter.known_consumers.contains(name)
        || crate::dedup::knows(conn, name).map_err(Error::db("look up the consumer"))?
    {
        return Ok(());
    }
    let mut known = crate::dedup::consumer_names(conn).map_err(Error::db("list consumers"))?;
    known.extend(filter.known_consumers.iter().cloned());
    known.sort();
    known.dedup();
    Err(Error::UnknownConsumer {
        name: name.clone(),
        known,
    })
}

/// (row id, event key) of each row delivered to the consumer that matches.
fn candidates(conn: &Connection, f: &ReplayFilter) -> Result<Vec<(i64, String)>> {
    let entries = crate::dedup::entries_of(conn, &f.consumer, f.since, f.until)
        .map_err(Error::db("select events to replay"))?;
    let ids: Vec<String> = f.ids.iter().map(|i| i.to_string()).collect();
    Ok(entries
        .into_iter()
        .filter(|e| ids.is_empty() || ids.contains(&e.event_key))
        .filter(|e| {
            f.event_type
                .as_ref()
                .is_none_or(|p| e.event_type.as_deref().is_some_and(|t| p.matches(t)))
        })
        .map(|e| (e.row_id, e.event_key))
        .collect())
}
