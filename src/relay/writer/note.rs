//! The writer's log lines about what a transaction decided, written once
//! it has committed.

use crate::clock::Timestamp;
use crate::envelope::EventId;

/// Something worth a log line, decided inside a transaction.
pub(super) enum Note {
    Invalid {
        row_id: i64,
        reason: String,
    },

    Unrouted {
        row_id: i64,
        event_id: EventId,
        reason: String,
    },
    Skipped {
        row_id: i64,
        event_type: String,
    },
    AlreadyDelivered {
        row_id: i64,
        event_id: EventId,
    },
    ReplayedToNobody {
        row_id: i64,
        event_id: EventId,
        consumers: String,
    },
    Retry {
        row_id: i64,
        event_id: EventId,
        attempt: u32,
        at: Timestamp,
    },
    Held {
        row_id: i64,
        event_id: EventId,
        at: Timestamp,
    },
    Poison {
        row_id: i64,
        event_id: EventId,
        reason: String,
    },
    GaveUp {
        row_id: i64,
        event_id: EventId,
        attempts: u32,
        reason: String,
    },
    Fenced {
        row_id: i64,
    },
    NothingToRelease {
        row_id: i64,
    },
    LeaseLost {
        row_id: i64,
    },
}

impl Note {
    pub(super) fn log(&self) {
        match self {
            Note::Invalid { row_id, reason } => {
                tracing::warn!(row_id, %reason, "dead-lettering a malformed row")
            }

            Note::Unrouted {
                row_id,
                event_id,
                reason,
            } => {
                tracing::warn!(row_id, %event_id, %reason, "dead-lettering an unrouted event")
            }
            Note::Skipped { row_id, event_type } => {
                tracing::info!(row_id, %event_type, "no consumer takes this event type; skipped")
            }
            Note::AlreadyDelivered { row_id, event_id } => {
                tracing::debug!(row_id, %event_id, "every consumer has this event already")
            }
            Note::ReplayedToNobody {
                row_id,
                event_id,
                consumers,
            } => tracing::warn!(
                row_id, %event_id, %consumers,
                "replay not delivered: no consumer of this relay by that name takes the event; \
                 the row keeps the status it had"
            ),
            Note::Retry {
                row_id,
                event_id,
                attempt,
                at,
            } => {
                tracing::info!(row_id, %event_id, attempt, retry_at = %at, "retry scheduled: will retry")
            }
            Note::Held {
                row_id,
                event_id,
                at,
            } => {
                tracing::debug!(row_id, %event_id, probe_at = %at, "held: the destination is unavailable; no attempt spent")
            }
            Note::Poison {
                row_id,
                event_id,
                reason,
            } => {
                tracing::warn!(row_id, %event_id, %reason, "dead-lettered: a consumer rejected the event as poison")
            }
            Note::GaveUp {
                row_id,
                event_id,
                attempts,
                reason,
            } => tracing::warn!(
                row_id, %event_id, attempts, %reason,
                "giving up: the retries are spent; dead-lettered"
            ),
            Note::Fenced { row_id } => {
                tracing::warn!(row_id, "outcome refused: the lease passed to another relay")
            }
            Note::NothingToRelease { row_id } => {
                tracing::warn!(row_id, "lease was already taken over; nothing to release")
            }
            Note::LeaseLost { row_id } => {
                tracing::warn!(
                    row_id,
                    "lease lost to another relay; its outcome will be refused"
                )
            }
        }
    }
}
