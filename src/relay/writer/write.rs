//! When the writer writes: the load it shows the planner, the leases due a
//! heartbeat, and what a failed write leaves for the next try.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::in_flight::RowSet;
use super::Writer;
use crate::error::{is_busy, is_out_of_memory};
use crate::relay::job::Job;
use crate::relay::metrics::Metrics;
use crate::relay::plan::{self, Load};
use crate::relay::wake::Wake;

impl Writer {
    /// Asks the planner whether a write transaction is worth making now, and
    /// makes it.
    pub(super) fn write_if_needed(&mut self, jobs: Option<&Sender<Job>>, wake: &mut Wake) {
        let now = self.clock.now();
        let load = Load {
            pending: self.pending.len(),
            in_flight: self.in_flight.len(),
            to_release: self.to_release.len(),
            want_claim: self.want_claim,
            next_due: self.next_due,
            earliest_lease: self.earliest_lease,
            earliest_renewal: self.earliest_renewal,
            accepting: self.shutdown_at.is_none() && jobs.is_some(),
            shutting_down: self.shutdown_at.is_some(),
            bytes_in_flight: self.bytes_in_flight,
        };
        let Some(plan) = self.planner.plan(&load, now, Instant::now()) else {
            return;
        };
        let rest = self.pending.split_off(plan.record);
        let outcomes = std::mem::replace(&mut self.pending, rest);
        let releases = std::mem::take(&mut self.to_release);
        // Only the leases this transaction keeps: the rows whose outcomes
        // or releases it writes are no longer claimed once it has (their
        // extension would fail and read as a lease lost to another relay).
        let ending: RowSet = outcomes
            .iter()
            .map(|o| o.row_id)
            .chain(releases.iter().map(|(id, _)| *id))
            .collect();
        let heartbeat: Vec<(i64, Arc<str>)> = if plan.heartbeat {
            self.in_flight
                .iter()
                .filter(|(id, f)| {
                    !ending.contains(id)
                        && (plan::heartbeat_due(f.lease_until, now, self.settings.lease)
                            || f.renew_at <= Instant::now())
                })
                .map(|(id, f)| (*id, f.token.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let started = Instant::now();
        wake.writing();
        let written = self.transact(&plan, &outcomes, &releases, &heartbeat, now);
        wake.written();
        match written {
            Ok(step) => {
                self.last_commit = Instant::now();
                Metrics::add(&self.metrics.commits, 1);
                Metrics::add(
                    &self.metrics.commit_micros_total,
                    started.elapsed().as_micros() as u64,
                );
                let claimed = step.counts.claimed as usize;
                self.planner
                    .committed(&plan, claimed, self.pending.len(), Instant::now());
                self.apply(step, jobs, plan.claim);
            }
            Err(e) => {
                // Nothing was recorded: keep everything for the next try.
                let newer = std::mem::replace(&mut self.pending, outcomes);
                self.pending.extend(newer);
                self.to_release.extend(releases);
                let busy = is_busy(&e);
                let pause = self.planner.failed(busy, Instant::now());
                let claim_oom = plan.claim > 0 && is_out_of_memory(&e);
                if claim_oom {
                    self.planner.claim_out_of_memory(Instant::now());
                }
                if busy {
                    // SQLITE_BUSY is never an event failure: wait and retry.
                    Metrics::add(&self.metrics.busy_retries, 1);
                } else if crate::error::is_damage(&e) {
                    Metrics::add(&self.metrics.errors, 1);
                    self.stop_on_damage(e);
                    return;
                } else if claim_oom {
                    Metrics::add(&self.metrics.errors, 1);
                    tracing::error!(error = %e, retry_in_ms = 2 * pause.as_millis() as u64,
                        "cannot claim events: out of memory (SQLite rewrites a claimed row whole, \
                         which needs about twice its payload); recording outcomes meanwhile, \
                         claiming again later");
                } else {
                    Metrics::add(&self.metrics.errors, 1);
                    tracing::error!(error = %e, retry_in_ms = pause.as_millis() as u64,
                        "cannot write to the database; will retry");
                }
                self.last_error = Some(e);
            }
        }
    }
}
