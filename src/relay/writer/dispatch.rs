//! Routing a claimed row and carrying the decision out, inside the write
//! transaction that claimed it.

use crate::relay::fenced;
use std::sync::Arc;
use std::time::Instant;

use rusqlite::Connection;

use super::in_flight::InFlight;
use super::note::Note;
use super::step::Step;
use crate::clock::Timestamp;
use crate::envelope::{check_head, check_row, EnvelopeError};
use crate::relay::claim;
use crate::relay::job::Job;
use crate::relay::ConsumerEntry;
use crate::router::{Dispatch, Finish, Routes};

/// Routes a claimed row ([`Routes::dispatch`]) and carries the decision
/// out: a dead letter, a delivered mark, or a job for the workers. Routing
/// needs only the event type and id ([`check_head`]); a row going to a
/// worker is checked whole there, one finished here is checked whole
/// here, and a row whose columns make no valid envelope is dead-lettered
/// with the reason ([`check_row`]) either way.
#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch_claimed(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    routes: &mut Routes,
    row: claim::ClaimedRow,
    token: &Arc<str>,
    (lease_until, renew_at): (Timestamp, Instant),
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    let row_id = row.row_id;
    let invalid = |e: EnvelopeError, step: &mut Step| -> rusqlite::Result<()> {
        let reason = format!("invalid row: {e}");
        fenced::dead_letter(tx, row_id, token, &reason, now, false)?;
        step.counts.dead += 1;
        step.notes.push(Note::Invalid { row_id, reason });
        Ok(())
    };
    let raw = row.raw.as_raw();
    let (event_type, event_id) = match check_head(&raw) {
        Ok(head) => head,
        // The whole check's first failure, which may be a time's.
        Err(e) => return invalid(check_row(&raw).err().unwrap_or(e), step),
    };
    let replay = row.replay_consumers.as_deref();
    match routes.dispatch(&event_type, &row.delivered_to, replay, |i| {
        consumers[i].name.as_str()
    }) {
        Dispatch::Deliver(missing) => {
            let flight = InFlight {
                token: token.clone(),
                lease_until,
                renew_at,
                event_id,
                attempts: row.attempts,
                bytes: row.payload_bytes,
            };
            let job = Job {
                row_id,
                token: token.clone(),
                event_key: row.event_key,
                raw: row.raw,
                legacy: row.legacy,
                ordering_key: row.ordering_key,
                attempt: row.attempts.saturating_add(1),
                consumers: missing,
            };
            step.claimed.push((job, flight));
        }
        Dispatch::Finish(finish) => {
            if let Err(e) = check_row(&raw) {
                return invalid(e, step);
            }
            fenced::finish_delivered(tx, row_id, token, now)?;
            step.counts.delivered += 1;
            step.notes.push(match finish {
                Finish::AlreadyDelivered => Note::AlreadyDelivered { row_id, event_id },
                Finish::SkippedUnrouted => Note::Skipped {
                    row_id,
                    event_type: event_type.to_string(),
                },
                Finish::NoReplayedConsumer => Note::ReplayedToNobody {
                    row_id,
                    event_id,
                    consumers: row.replay_consumers.unwrap_or_default().join(","),
                },
            });
        }
        Dispatch::Unrouted(reason) => {
            if let Err(e) = check_row(&raw) {
                return invalid(e, step);
            }
            fenced::dead_letter(tx, row_id, token, &reason, now, false)?;
            step.counts.dead += 1;
            step.notes.push(Note::Unrouted {
                row_id,
                event_id,
                reason,
            });
        }
    }
    Ok(())
}
