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
//! A consumer name the database does not know (no entry in the ledger, no
//! replay to it pending) and the caller did not declare
//! ([`ReplayFilter::known_consumers`]) is an error listing the names it
//! knows: a typo would otherwise replay nothing and say so with success.
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

    /// Checks the filter before anything is read: a consumer is named, and
    /// `since` is before `until` (else nothing could match, which would
    /// read as a successful replay of nothing). [`replay`] and [`count`]
    /// call it; a caller that builds a filter from a form or a command line
    /// calls it to report the mistake first.
    ///
    /// ```
    /// use outboxd::replay::ReplayFilter;
    /// let t = |s: &str| s.parse::<outboxd::Timestamp>().unwrap();
    /// let ok = ReplayFilter::new("audit").since(t("2026-11-01T00:00:00Z"));
    /// assert!(ok.validate().is_ok());
    /// let e = ok.until(t("2026-10-01T00:00:00Z")).validate().unwrap_err();
    /// assert!(e.to_string().contains("replay.until"), "{e}");
    /// assert!(ReplayFilter::new("").validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.consumer.is_empty() {
            return Err(SettingError::new(
                Setting::ReplayConsumer,
                "is empty; name the consumer to replay to",
            )
            .into());
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if since >= until {
                return Err(SettingError::new(
                    Setting::ReplayUntil,
                    format!("since {since} is not before until {until}; nothing could match"),
                )
                .into());
            }
        }
        Ok(())
    }

    /// The ids as ledger keys (canonical spelling).
    fn keys(&self) -> Vec<String> {
        self.ids.iter().map(EventId::to_string).collect()
    }

    /// The ledger's selection for this filter, with `keys` from
    /// [`ReplayFilter::keys`].
    fn selection<'a>(&'a self, keys: &'a [String]) -> crate::dedup::Selection<'a> {
        crate::dedup::Selection {
            consumer: &self.consumer,
            keys,
            // A pattern's text is a GLOB that matches what it matches: its
            // literals are a-z, 0-9 and _, and `*` (one or more whole
            // segments, dots included) sits between dots or at an end
            // (tests: `a_pattern_is_the_glob_it_reads_as`).
            type_glob: self.event_type.as_ref().map(Pattern::as_str),
            since: self.since,
            until: self.until,
        }
    }
}

/// Replays the events the filter selects that were delivered to the
/// consumer. Returns how many rows were put back. Fails with
/// [`Error::UnknownConsumer`] for a consumer that neither the ledger, a
/// pending replay nor [`ReplayFilter::known_consumers`] knows.
pub fn replay(conn: &mut Connection, filter: &ReplayFilter, now: Timestamp) -> Result<u64> {
    replay_with_progress(conn, filter, now, |_, _| {})
}

/// How many rows the filter selects now: what [`replay`] would put back,
/// less any row a relay holds leased when it runs (left to that relay). The
/// console shows it before replaying. A count in SQL: nothing is loaded.
pub fn count(conn: &Connection, filter: &ReplayFilter) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    filter.validate()?;
    check_known(conn, filter)?;
    let keys = filter.keys();
    crate::dedup::count_selected(conn, &filter.selection(&keys))
        .map_err(Error::db("count events to replay"))
}

/// [`replay`], calling `progress(done, total)` after each batch.
pub fn replay_with_progress(
    conn: &mut Connection,
    filter: &ReplayFilter,
    now: Timestamp,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    filter.validate()?;
    check_known(conn, filter)?;
    let keys = filter.keys();
    let rows = crate::dedup::selected(conn, &filter.selection(&keys))
        .map_err(Error::db("select events to replay"))?;
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

/// Fails unless the ledger, a replay still pending, or the caller knows the
/// consumer. A replay removes the consumer's ledger entries until the relay
/// delivers again: while it is pending, the rows it scoped name the
/// consumer, so a second replay to it is no typo (it finds nothing more).
fn check_known(conn: &Connection, filter: &ReplayFilter) -> Result<()> {
    let name = &filter.consumer;
    if filter.known_consumers.contains(name)
        || crate::dedup::knows(conn, name).map_err(Error::db("look up the consumer"))?
    {
        return Ok(());
    }
    let pending = pending_replay_consumers(conn).map_err(Error::db("look up the consumer"))?;
    if pending.contains(name) {
        return Ok(());
    }
    let mut known = crate::dedup::consumer_names(conn).map_err(Error::db("list consumers"))?;
    known.extend(pending);
    known.extend(filter.known_consumers.iter().cloned());
    known.sort();
    known.dedup();
    Err(Error::UnknownConsumer {
        name: name.clone(),
        known,
    })
}

/// The consumers that pending rows await a replay to (`replay_consumers`,
/// names joined by ','), sorted. Read over the pending rows only: for the
/// unknown-consumer check, after the ledger did not know the name.
fn pending_replay_consumers(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT replay_consumers FROM event_outbox
          WHERE status = 'pending' AND replay_consumers IS NOT NULL",
    )?;
    let lists = stmt.query_map([], |r| {
        Ok(match r.get_ref(0)? {
            rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
            _ => String::new(),
        })
    })?;
    let mut names = Vec::new();
    for list in lists {
        names.extend(
            list?
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
        );
    }
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selection filters types in SQL by the pattern's text as a GLOB:
    /// it must take exactly what `Pattern::matches` takes, for valid event
    /// types and for the odd ones a foreign producer may store.
    #[test]
    fn a_pattern_is_the_glob_it_reads_as() {
        let conn = Connection::open_in_memory().unwrap();
        let patterns = [
            "*",
            "*.v1",
            "*.v2",
            "a.*",
            "a.*.v1",
            "a.b.v1",
            "*.b.*",
            "a.*.c.*.v1",
            "a_b.*.v10",
        ];
        let types = [
            "a.b.v1",
            "a.b.c.v1",
            "a.v1",
            "a..v1",
            ".v1",
            "v1",
            "",
            "a.b.v1.",
            "a.b.c.d.v1",
            "a_b.x.v10",
            "aXb.x.v10",
            "A.b.v1",
            "a.b.v2",
            "x.b.y.v2",
            "a.*.v1",
            "a.b.v1\n",
        ];
        for p in patterns {
            let pattern = Pattern::parse(p).unwrap();
            for t in types {
                let glob: bool = conn
                    .query_row("SELECT ?1 GLOB ?2", [t, pattern.as_str()], |r| r.get(0))
                    .unwrap();
                assert_eq!(glob, pattern.matches(t), "pattern {p:?}, type {t:?}");
            }
        }
    }
}
