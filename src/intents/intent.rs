//! One intent as `publish_intents` records it, and where it stands.

use std::fmt;

use super::key::IntentKey;
use crate::clock::Timestamp;

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

    pub(super) fn parse(s: &str) -> Option<IntentStatus> {
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
