//! A job: one claimed row the writer hands to a worker, and what the
//! worker reports back when the row's consumers have run.

use std::sync::Arc;

use crate::consumer::Outcome;
use crate::envelope::OwnedRow;

/// One claimed row to deliver: the consumers that have not succeeded yet.
pub(crate) struct Job {
    pub row_id: i64,
    pub token: Arc<str>,
    /// The dedup ledger key, as the claim returned it (a transactional
    /// consumer writes its entry itself).
    pub event_key: String,
    /// The row's columns, checked on the worker ([`check_row`]) rather
    /// than on the writer: the payload's JSON check is the largest
    /// per-event cost outside SQLite, and the writer is the relay's one
    /// serial thread.
    ///
    /// [`check_row`]: crate::envelope::check_row
    pub raw: OwnedRow,
    pub legacy: bool,
    pub ordering_key: Option<String>,
    /// 1 + the row's failed attempts so far.
    pub attempt: u32,
    /// Indexes into the consumer list.
    pub consumers: Vec<usize>,
}

/// What the consumers of one job reported.
pub(crate) struct JobOutcome {
    pub row_id: i64,
    pub token: Arc<str>,
    pub results: Vec<(usize, Outcome)>,
    /// The consumers of `results` that were paused: not run, their
    /// outcome says so.
    pub held: Vec<usize>,
    /// Why the row cannot be delivered at all (it fails [`check_row`]): no
    /// consumer ran, and the writer dead-letters it with this reason.
    ///
    /// [`check_row`]: crate::envelope::check_row
    pub invalid: Option<String>,
}
