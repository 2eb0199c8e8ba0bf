//! Recording the outcomes of finished jobs: each row's fenced update for
//! its verdict, then the consumers' progress (the ledger) for the rows
//! whose update took.

use crate::relay::fenced;
use std::time::Instant;

use rusqlite::Connection;

use super::in_flight::{InFlight, RowMap, RowSet};
use super::note::Note;
use super::step::Step;
use crate::clock::Timestamp;
use crate::consumer::Outcome;
use crate::relay::job::JobOutcome;
use crate::relay::metrics::ConsumerResult;
use crate::relay::retry::{self, Verdict};
use crate::relay::ConsumerEntry;
use crate::text::{clip, Keep};

/// Held rows made due again per transaction once their consumer resumes.
const RELEASE_BATCH: usize = 500;

/// Longest reason text stored in `last_error`.
const MAX_REASON_BYTES: usize = 4096;

/// Records the outcomes of finished jobs (those of rows still in flight).
/// Each row's own update is fenced by its token and made first; the
/// consumers' progress is written only for the rows whose update took, so
/// a relay that lost a lease records nothing for that row. The common
/// case, a row delivered to every consumer, is grouped: the rows' updates
/// take one statement per claim token, and the ledger entries of all rows
/// one per consumer, each over an [`IdList`](crate::connection::IdList) of
/// the rows. (The same over a JSON array, with `json_each` and `->>`, cost
/// more than one execution per row, for parsing the JSON back; id lists
/// cost less: BENCHMARKS.md.)
pub(super) fn record(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    in_flight: &RowMap<InFlight>,
    outcomes: &[JobOutcome],
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    let rounds = rounds(consumers, outcomes);
    release_held(tx, consumers, now, step)?;
    let mut delivered: Vec<&JobOutcome> = Vec::new();
    let mut ledger: Vec<(&str, i64)> = Vec::new();
    for o in outcomes {
        let Some(flight) = in_flight.get(&o.row_id) else {
            continue;
        };
        if o.invalid.is_none() && o.results.iter().all(|(_, r)| *r == Outcome::Delivered) {
            delivered.push(o);
        } else if record_one(tx, consumers, &rounds, flight, o, now, step)? {
            progress(consumers, o, step, &mut ledger);
        }
    }
    let group: Vec<(i64, &str)> = delivered.iter().map(|o| (o.row_id, &*o.token)).collect();
    let kept: RowSet = fenced::finish_delivered_many(tx, &group, now)?
        .into_iter()
        .collect();
    for o in delivered {
        if kept.contains(&o.row_id) {
            step.counts.delivered += 1;
            progress(consumers, o, step, &mut ledger);
        } else {
            step.notes.push(Note::Fenced { row_id: o.row_id });
            step.counts.fenced += 1;
        }
    }
    // A transactional consumer committed its entry with its own writes
    // already: the insert then leaves it as it is.
    crate::dedup::record_many(tx, &ledger, now)
}

/// Each consumer's probes in a row found unavailable (at least 1 for an
/// unavailable outcome), or 0 for a consumer that delivered some of these
/// outcomes: its unavailable outcomes are then failures of their events.
fn rounds(consumers: &[ConsumerEntry], outcomes: &[JobOutcome]) -> Vec<u32> {
    let mut delivered = vec![false; consumers.len()];
    for (i, outcome) in outcomes.iter().flat_map(|o| &o.results) {
        delivered[*i] |= *outcome == Outcome::Delivered;
    }
    consumers
        .iter()
        .zip(delivered)
        .map(|(entry, d)| {
            if d {
                0
            } else {
                entry.availability.rounds().max(1)
            }
        })
        .collect()
}

/// Makes due one batch of the rows a resumed consumer held (one batch per
/// transaction, never one update over the whole backlog).
fn release_held(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    for entry in consumers {
        let ids = entry.availability.release(RELEASE_BATCH);
        if !ids.is_empty() {
            if fenced::release_held(tx, &ids, now)? > 0 {
                step.next_due = Some(now);
            }
            return Ok(());
        }
    }
    Ok(())
}

/// The consumers' progress of a job whose row update took: a ledger entry
/// for each that delivered, and the per-consumer counts.
fn progress<'a>(
    consumers: &'a [ConsumerEntry],
    o: &JobOutcome,
    step: &mut Step,
    ledger: &mut Vec<(&'a str, i64)>,
) {
    for (i, outcome) in &o.results {
        let result = match outcome {
            Outcome::Delivered => {
                ledger.push((&consumers[*i].name, o.row_id));
                ConsumerResult::Delivered
            }
            Outcome::Retry { .. } | Outcome::Unavailable { .. } => ConsumerResult::Retried,
            Outcome::Poison { .. } => ConsumerResult::Poisoned,
        };
        step.counts.per_consumer.push((*i, result));
    }
}

/// The outcomes a job's verdict goes by. A paused consumer's row waits for
/// the next probe if it is to be it, otherwise for the longest hold (or
/// the release on resumption); a failed probe hands the next probe to the
/// row held longest. An unavailable outcome of a consumer that delivered
/// others here is this event's failure.
fn effective(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    rounds: &[u32],
    o: &JobOutcome,
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<Vec<(usize, Outcome)>> {
    let mut out = Vec::with_capacity(o.results.len());
    for (i, outcome) in &o.results {
        let entry = &consumers[*i];
        let held = |reason: &str, after: Option<std::time::Duration>| Outcome::Unavailable {
            reason: reason.to_string(),
            after: Some(after.unwrap_or(entry.retry.longest_hold())),
        };
        let effective = match outcome {
            Outcome::Unavailable { reason, .. } if o.held.contains(i) => {
                held(reason, entry.availability.hold(o.row_id, Instant::now()))
            }
            _ if rounds[*i] == 0 => outcome.as_failure(),
            Outcome::Unavailable { reason, .. } => {
                let at = now.plus(entry.retry.probe_after(rounds[*i]));
                if rotate(tx, entry, o.row_id, at)? {
                    step.next_due = Some(step.next_due.map_or(at, |t| t.min(at)));
                    held(reason, None)
                } else {
                    entry.availability.probe_with(o.row_id);
                    outcome.clone()
                }
            }
            _ => outcome.clone(),
        };
        out.push((*i, effective));
    }
    Ok(out)
}

/// Makes the row held longest the next probe, due at `at`, in place of
/// `failed`; false when no held row is left.
fn rotate(
    tx: &Connection,
    entry: &ConsumerEntry,
    failed: i64,
    at: Timestamp,
) -> rusqlite::Result<bool> {
    while let Some(next) = entry.availability.oldest_held() {
        if next != failed && fenced::release_held(tx, &[next], at)? > 0 {
            entry.availability.probe_with(next);
            entry.availability.hold_later(failed);
            return Ok(true);
        }
    }
    Ok(false)
}

/// Records one job's outcome other than "delivered to all": the row's
/// fenced update for its verdict (retry, dead letter). True when the
/// update took (the caller then records the consumers' progress).
fn record_one(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    rounds: &[u32],
    flight: &InFlight,
    o: &JobOutcome,
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<bool> {
    let (row_id, event_id) = (o.row_id, flight.event_id);
    if let Some(reason) = &o.invalid {
        // The worker found the row invalid: no consumer ran.
        if fenced::dead_letter(tx, row_id, &o.token, reason, now, false)? {
            step.counts.dead += 1;
            step.notes.push(Note::Invalid {
                row_id,
                reason: reason.clone(),
            });
        } else {
            step.notes.push(Note::Fenced { row_id });
            step.counts.fenced += 1;
        }
        return Ok(false);
    }
    let effective = effective(tx, consumers, rounds, o, now, step)?;
    let reports = effective.iter().map(|(i, outcome)| retry::Report {
        consumer: &consumers[*i].name,
        policy: &consumers[*i].retry,
        outcome,
        rounds: rounds[*i],
    });
    let verdict = retry::verdict(reports, flight.attempts, now, rand::random);
    let kept = match &verdict {
        Verdict::Delivered => fenced::finish_delivered(tx, row_id, &o.token, now)?,
        Verdict::Retry { at, reason, .. } => {
            step.next_due = Some(step.next_due.map_or(*at, |t| t.min(*at)));
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            fenced::schedule_retry(tx, row_id, &o.token, *at, &reason, true)?
        }
        Verdict::Held { at, reason } => {
            step.next_due = Some(step.next_due.map_or(*at, |t| t.min(*at)));
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            fenced::schedule_retry(tx, row_id, &o.token, *at, &reason, false)?
        }
        Verdict::Poison { reason } => {
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            fenced::dead_letter(tx, row_id, &o.token, &reason, now, false)?
        }
        Verdict::GaveUp { reason, .. } => {
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            fenced::dead_letter(tx, row_id, &o.token, &reason, now, true)?
        }
    };
    if !kept {
        step.notes.push(Note::Fenced { row_id });
        step.counts.fenced += 1;
        return Ok(false);
    }
    match verdict {
        Verdict::Delivered => step.counts.delivered += 1,
        Verdict::Retry { at, attempt, .. } => {
            step.counts.retried += 1;
            step.notes.push(Note::Retry {
                row_id,
                event_id,
                attempt,
                at,
            });
        }
        Verdict::Held { at, .. } => {
            step.counts.retried += 1;
            step.notes.push(Note::Held {
                row_id,
                event_id,
                at,
            });
        }
        Verdict::Poison { reason } => {
            step.counts.dead += 1;
            step.notes.push(Note::Poison {
                row_id,
                event_id,
                reason,
            });
        }
        Verdict::GaveUp { attempts, reason } => {
            step.counts.dead += 1;
            step.notes.push(Note::GaveUp {
                row_id,
                event_id,
                attempts,
                reason,
            });
        }
    }
    Ok(true)
}
