//! The write transaction: one `BEGIN IMMEDIATE` that records outcomes,
//! releases and extends leases, and claims the next batch and routes it.
//! Every row write in it is fenced by the row's claim token
//! ([`claim`](crate::relay::claim)), so the outcome of a claim another
//! token has taken over changes nothing. It runs on the connection and the
//! writer's state it is given; what it did comes back as a [`Step`], which
//! the writer applies once it has committed.

use std::sync::Arc;
use std::time::Instant;

use rusqlite::{Connection, TransactionBehavior};

use super::dispatch::dispatch_claimed;
use super::in_flight::{InFlight, RowMap};
use super::note::Note;
use super::record::record;
use super::step::Step;
use super::Writer;
use crate::clock::Timestamp;
use crate::relay::claim;
use crate::relay::job::JobOutcome;
use crate::relay::plan::Plan;
use crate::relay::{ConsumerEntry, Settings};
use crate::router::Routes;

/// The writer's state a transaction reads, and the routing table it fills.
pub(super) struct State<'a> {
    pub consumers: &'a [ConsumerEntry],
    pub routes: &'a mut Routes,
    /// The rows in flight: only their outcomes are recorded.
    pub in_flight: &'a RowMap<InFlight>,
    /// The lease of a claim or a renewal, and the largest payload claimed.
    pub settings: &'a Settings,
}

/// One `BEGIN IMMEDIATE` transaction: record outcomes, release and
/// extend leases, claim the next batch.
pub(super) fn run(
    conn: &mut Connection,
    state: State<'_>,
    plan: &Plan,
    outcomes: &[JobOutcome],
    releases: &[(i64, Arc<str>)],
    heartbeat: &[(i64, Arc<str>)],
    now: Timestamp,
) -> rusqlite::Result<Step> {
    let State {
        consumers,
        routes,
        in_flight,
        settings,
    } = state;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut step = Step::default();
    record(&tx, consumers, in_flight, outcomes, now, &mut step)?;
    step.finished_rows.extend(outcomes.iter().map(|o| o.row_id));
    for (id, token) in releases {
        if !claim::release(&tx, *id, token, now)? {
            step.notes.push(Note::NothingToRelease { row_id: *id });
        }
        step.released.push(*id);
    }
    let lease_until = now.plus(settings.lease);
    let renew_at = Instant::now() + settings.lease / 2;
    for (id, token) in heartbeat {
        if claim::extend(&tx, *id, token, lease_until)? {
            step.extended.push((*id, lease_until));
        } else {
            step.notes.push(Note::LeaseLost { row_id: *id });
            step.extended.push((*id, Timestamp::MAX));
        }
    }
    if plan.claim > 0 {
        let token: Arc<str> = ulid::Ulid::generate().to_string().into();
        let started = Instant::now();
        let budget = claim::Budget {
            bytes: plan.claim_bytes,
            one_anyway: plan.claim_one_anyway,
            max_payload: settings.max_payload_bytes,
        };
        let rows = claim::claim(&tx, &token, now, lease_until, plan.claim, budget)?;
        step.counts.claim_micros = started.elapsed().as_micros() as u64;
        step.counts.claimed = rows.len() as u64;
        let (taken, full) = (rows.len(), rows.len() == plan.claim);
        for row in rows {
            dispatch_claimed(
                &tx,
                consumers,
                routes,
                row,
                &token,
                (lease_until, renew_at),
                now,
                &mut step,
            )?;
        }
        step.claim_again = full || step.claimed.len() < taken;
        if !step.claim_again {
            step.next_due = claim::next_due_after(&tx, now)?;
        }
    }
    tx.commit()?;
    Ok(step)
}

impl Writer {
    /// [`run`] on the writer's connection and state.
    pub(super) fn transact(
        &mut self,
        plan: &Plan,
        outcomes: &[JobOutcome],
        releases: &[(i64, Arc<str>)],
        heartbeat: &[(i64, Arc<str>)],
        now: Timestamp,
    ) -> rusqlite::Result<Step> {
        let state = State {
            consumers: &self.consumers,
            routes: &mut self.routes,
            in_flight: &self.in_flight,
            settings: &self.settings,
        };
        run(
            &mut self.conn,
            state,
            plan,
            outcomes,
            releases,
            heartbeat,
            now,
        )
    }
}
