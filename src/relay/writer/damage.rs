//! A damaged database file: the writer stops claiming, records what the
//! file still takes one row at a time, and ends with the error.

use super::Writer;
use crate::error::Error;
use crate::integrity::Depth;
use crate::relay::plan::Plan;

impl Writer {
    /// SQLite said the file is damaged (SQLITE_CORRUPT, SQLITE_NOTADB):
    /// trying again cannot help. Logs what `outboxd doctor` would say, and
    /// makes the writer stop claiming and end with the error.
    pub(super) fn stop_on_damage(&mut self, source: rusqlite::Error) {
        if self.damaged.is_some() {
            return;
        }
        let finding = match crate::integrity::check(&self.conn, Depth::Quick) {
            Ok(found) if !found.is_ok() => found.finding(),
            Ok(_) => {
                format!("SQLite reported damage ({source}), although PRAGMA quick_check passes")
            }
            Err(e) => format!("the database file is damaged: {e}"),
        };
        tracing::error!(
            error = %source,
            action = %crate::integrity::advice(&self.settings.path),
            "{finding}; the relay stops claiming, records the outcomes it still can, and \
             stops (`outboxd doctor` reports the same)"
        );
        self.damaged = Some(Error::Database {
            op: "write to the database (the file is damaged)",
            source,
        });
    }

    /// On a damaged file: records each outcome and releases each claim in
    /// a transaction of its own, so the rows on sound pages are recorded;
    /// one the file refuses is given up on (trying again cannot help).
    pub(super) fn salvage(&mut self) {
        let now = self.clock.now();
        for o in std::mem::take(&mut self.pending) {
            let row_id = o.row_id;
            match self.transact(&Plan::record_only(1), &[o], &[], &[], now) {
                Ok(step) => self.apply(step, None, 0),
                Err(e) => {
                    self.forget_in_flight(row_id);
                    self.given_up.outcomes += 1;
                    self.last_error = Some(e);
                }
            }
        }
        for release in std::mem::take(&mut self.to_release) {
            let row_id = release.0;
            match self.transact(&Plan::record_only(0), &[], &[release], &[], now) {
                Ok(step) => self.apply(step, None, 0),
                Err(e) => {
                    self.forget_in_flight(row_id);
                    self.given_up.releases += 1;
                    self.last_error = Some(e);
                }
            }
        }
    }

    /// Stops tracking a row the writer gave up on.
    pub(super) fn forget_in_flight(&mut self, row_id: i64) {
        if let Some(f) = self.in_flight.remove(&row_id) {
            self.bytes_in_flight = self.bytes_in_flight.saturating_sub(f.bytes);
        }
    }
}
