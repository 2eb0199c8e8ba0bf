//! The write transaction: one `BEGIN IMMEDIATE` that records outcomes,
//! releases and extends leases, and claims the next batch and routes it.
//! Every row write in it is fenced by the row's claim token ([`claim`]),
//! so the outcome of a claim another token has taken over changes
//! nothing. It runs on the connection and the writer's state it is given;
//! what it did comes back as a [`Step`], which the writer applies once it
//! has committed.

use crate::relay::fenced;
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
use crate::relay::claim::{self, Standing, TimeRule};
use crate::relay::job::JobOutcome;
use crate::relay::owners::Owners;
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
    /// Whose leases stand ([`crate::liveness`]); None: the time rule.
    pub owners: Option<&'a mut Owners>,
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
        mut owners,
    } = state;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let taken = match owners.as_deref_mut() {
        Some(o) if plan.claim > 0 => o.take_over(&tx, now)?,
        _ => Vec::new(),
    };
    let mut step = Step::default();
    record(&tx, consumers, in_flight, outcomes, now, &mut step)?;
    step.finished_rows.extend(outcomes.iter().map(|o| o.row_id));
    for (id, token) in releases {
        if !fenced::release(&tx, *id, token, now)? {
            step.notes.push(Note::NothingToRelease { row_id: *id });
        }
        step.released.push(*id);
    }
    let lease_until = now.plus(settings.lease);
    let renew_at = Instant::now() + settings.lease / 2;
    for (id, token) in heartbeat {
        if fenced::extend(&tx, *id, token, lease_until)? {
            step.extended.push((*id, lease_until));
        } else {
            step.notes.push(Note::LeaseLost { row_id: *id });
            step.extended.push((*id, Timestamp::MAX));
        }
    }
    if plan.claim > 0 {
        let token: Arc<str> = match owners.as_deref() {
            Some(o) => o.token().into(),
            None => ulid::Ulid::generate().to_string().into(),
        };
        let started = Instant::now();
        let budget = claim::Budget {
            bytes: plan.claim_bytes,
            one_anyway: plan.claim_one_anyway,
            max_payload: settings.max_payload_bytes,
        };
        let standing: &mut dyn Standing = match owners.as_deref_mut() {
            Some(o) => o,
            None => &mut TimeRule,
        };
        let rows = claim::claim(&tx, &token, now, lease_until, plan.claim, budget, standing)?;
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
            step.next_due = fenced::next_due_after(&tx, now)?;
        }
    }
    tx.commit()?;
    if let Some(o) = owners {
        o.taken(&taken);
    }
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
            owners: self.owners.as_mut(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::consumer::{Delivery, Outcome};
    use crate::relay::job::Job;
    use crate::relay::metrics::ConsumerResult;
    use crate::relay::{ConsumerKind, RetryPolicy};
    use crate::router::{Pattern, UnroutedPolicy};

    const LEASE: Duration = Duration::from_secs(30);

    /// A migrated database and the writer's state for two consumers: `a`
    /// takes `a.*.v1`, `b` takes `a.b.v1` and `x.*.v1`; both retry after
    /// 30 s, 3 attempts in all, no jitter. No thread runs: each test calls
    /// [`run`] itself, as the writer would.
    struct Fixture {
        _dir: tempfile::TempDir,
        conn: Connection,
        consumers: Vec<ConsumerEntry>,
        routes: Routes,
        settings: Settings,
        in_flight: RowMap<InFlight>,
    }

    /// A row's columns the transaction writes.
    #[derive(Debug, PartialEq)]
    struct Row {
        status: String,
        token: Option<String>,
        lease_until: Option<i64>,
        available_at: i64,
        attempts: i64,
        last_error: Option<String>,
    }

    impl Fixture {
        fn new() -> Fixture {
            let (dir, conn) = crate::schema::test_db();
            claim::stable_plans(&conn).unwrap();
            let retry = RetryPolicy::default()
                .initial(Duration::from_secs(30))
                .max_attempts(3)
                .jitter(0.0);
            let consumer = |name: &str| ConsumerEntry {
                name: name.into(),
                consumer: ConsumerKind::Plain(Box::new(|_: &Delivery| Outcome::Delivered)),
                retry: retry.clone(),
                availability: Default::default(),
            };
            let patterns = |ps: &[&str]| -> Vec<Pattern> {
                ps.iter().map(|p| Pattern::parse(p).unwrap()).collect()
            };
            Fixture {
                consumers: vec![consumer("a"), consumer("b")],
                routes: Routes::new(
                    vec![patterns(&["a.*.v1"]), patterns(&["a.b.v1", "x.*.v1"])],
                    UnroutedPolicy::DeadLetter,
                ),
                settings: Settings {
                    path: dir.path().join("test.db"),
                    workers: 1,
                    batch_size: 10,
                    batch_bytes: u64::MAX,
                    max_payload_bytes: crate::limits::DEFAULT_MAX_PAYLOAD_BYTES,
                    lease: LEASE,
                    poll_interval: Duration::from_secs(1),
                    watch_wal: false,
                    flush_interval: Duration::ZERO,
                    housekeeping_interval: Duration::from_secs(60),
                    stale_after: Duration::from_secs(300),
                    purge: None,
                },
                in_flight: RowMap::default(),
                conn,
                _dir: dir,
            }
        }

        /// Enqueues a due event of `event_type`; its row id.
        fn put(&self, event_type: &str) -> i64 {
            crate::Enqueuer::new()
                .allow_autocommit(true)
                .enqueue(&self.conn, &crate::Event::new(event_type, &1).unwrap())
                .unwrap();
            self.conn
                .query_row("SELECT max(id) FROM event_outbox", [], |r| r.get(0))
                .unwrap()
        }

        /// One transaction, as the writer makes it.
        fn run(
            &mut self,
            plan: &Plan,
            outcomes: &[JobOutcome],
            releases: &[(i64, Arc<str>)],
            heartbeat: &[(i64, Arc<str>)],
            now: Timestamp,
        ) -> Step {
            let state = State {
                consumers: &self.consumers,
                routes: &mut self.routes,
                in_flight: &self.in_flight,
                settings: &self.settings,
                owners: None,
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
            .unwrap()
        }

        /// A transaction that claims up to `n` rows; the rows it hands to
        /// workers are in flight afterwards, as the writer's apply leaves
        /// them, and their jobs come back.
        fn claim(&mut self, n: usize, now: Timestamp) -> (Step, Vec<Job>) {
            let mut step = self.run(&claiming(n), &[], &[], &[], now);
            let mut jobs = Vec::new();
            for (job, flight) in std::mem::take(&mut step.claimed) {
                self.in_flight.insert(job.row_id, flight);
                jobs.push(job);
            }
            (step, jobs)
        }

        fn row(&self, id: i64) -> Row {
            self.conn
                .query_row(
                    "SELECT status, claim_token, lease_until, available_at, attempts, last_error
                       FROM event_outbox WHERE id = ?1",
                    [id],
                    |r| {
                        Ok(Row {
                            status: r.get(0)?,
                            token: r.get(1)?,
                            lease_until: r.get(2)?,
                            available_at: r.get(3)?,
                            attempts: r.get(4)?,
                            last_error: r.get(5)?,
                        })
                    },
                )
                .unwrap()
        }

        /// The consumers the ledger has for a row, by name.
        fn ledger(&self, id: i64) -> Vec<String> {
            self.conn
                .prepare("SELECT consumer FROM delivered_events WHERE outbox_id = ?1 ORDER BY 1")
                .unwrap()
                .query_map([id], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        }
    }

    /// A transaction that claims up to `n` rows (and records what it is given).
    fn claiming(n: usize) -> Plan {
        Plan {
            claim: n,
            claim_bytes: u64::MAX,
            claim_one_anyway: true,
            ..Plan::record_only(0)
        }
    }

    fn outcome(job: &Job, results: Vec<(usize, Outcome)>) -> JobOutcome {
        JobOutcome {
            held: Vec::new(),
            row_id: job.row_id,
            token: job.token.clone(),
            results,
            invalid: None,
        }
    }

    /// A second from now: every row enqueued so far is due.
    fn soon() -> Timestamp {
        Timestamp::now().plus(Duration::from_secs(1))
    }

    /// The claim stamps each row with one token and the lease, and routes
    /// it: a job for the consumers that lack it; a row every consumer of
    /// its type has is finished delivered, one nobody takes is
    /// dead-lettered, both in the same transaction.
    #[test]
    fn a_claim_routes_each_row_to_the_consumers_that_lack_it() {
        let mut f = Fixture::new();
        let both = f.put("a.b.v1");
        let only_b = f.put("x.y.v1");
        let b_missing = f.put("a.b.v1");
        let a_has_it = f.put("a.c.v1");
        let nobody = f.put("q.q.v1");
        let now = soon();
        crate::dedup::record_many(&f.conn, &[("a", b_missing), ("a", a_has_it)], now).unwrap();

        let (step, jobs) = f.claim(10, now);
        let routed: Vec<(i64, Vec<usize>)> = jobs
            .iter()
            .map(|j| (j.row_id, j.consumers.clone()))
            .collect();
        assert_eq!(
            routed,
            [(both, vec![0, 1]), (only_b, vec![1]), (b_missing, vec![1])]
        );
        assert_eq!(
            (step.counts.claimed, step.counts.delivered, step.counts.dead),
            (5, 1, 1)
        );
        let token = jobs[0].token.clone();
        assert!(jobs.iter().all(|j| j.token == token), "one token a claim");
        let until = now.plus(LEASE).as_millis();
        for job in &jobs {
            let row = f.row(job.row_id);
            assert_eq!(row.status, "pending");
            assert_eq!(row.token.as_deref(), Some(&*token));
            assert_eq!((row.lease_until, row.available_at), (Some(until), until));
            let flight = &f.in_flight[&job.row_id];
            assert_eq!(
                (&*flight.token, flight.lease_until),
                (&*token, now.plus(LEASE))
            );
            assert_eq!(job.attempt, 1);
        }
        assert_eq!(f.row(a_has_it).status, "delivered");
        assert_eq!(f.row(a_has_it).token, None);
        let dead = f.row(nobody);
        assert_eq!(dead.status, "dead");
        assert_eq!(
            dead.last_error.as_deref(),
            Some("no consumer takes event type q.q.v1")
        );
        assert_eq!(dead.attempts, 0, "an unrouted row spends no attempt");
        // It finished rows itself, which may free rows it passed over.
        assert!(step.claim_again);

        // Nothing is due now: the next claim finds nothing and says when
        // a row is next due (the leases' end).
        let (step, jobs) = f.claim(10, now);
        assert!(jobs.is_empty() && !step.claim_again);
        assert_eq!(step.next_due, Some(now.plus(LEASE)));
    }

    /// A claim that takes all it asked for claims again at once; the rows
    /// beyond it wait for that claim.
    #[test]
    fn a_full_claim_claims_again() {
        let mut f = Fixture::new();
        let first = f.put("a.b.v1");
        f.put("a.b.v1");
        let (step, jobs) = f.claim(1, soon());
        assert_eq!(jobs.iter().map(|j| j.row_id).collect::<Vec<_>>(), [first]);
        assert!(step.claim_again);
        assert_eq!(step.next_due, None);
    }

    /// Outcomes become the rows' fates: delivered (ledger entries for
    /// both consumers), a retry (one attempt spent, due after the backoff,
    /// the delivering consumer's entry kept), poison and an invalid row
    /// (dead, no attempt spent), and a retry with the attempts spent (dead,
    /// the attempt counted). The lease is released in every case.
    #[test]
    fn outcomes_are_recorded_delivered_retried_or_dead() {
        let mut f = Fixture::new();
        let ids: Vec<i64> = (0..5).map(|_| f.put("a.b.v1")).collect();
        // The last row has failed twice already: one more failure is its third.
        f.conn
            .execute(
                "UPDATE event_outbox SET attempts = 2 WHERE id = ?1",
                [ids[4]],
            )
            .unwrap();
        let now = soon();
        let (_, jobs) = f.claim(10, now);
        assert_eq!(jobs.len(), 5);
        let mut invalid = outcome(&jobs[3], Vec::new());
        invalid.invalid = Some("invalid row: payload is not valid JSON".into());
        let outcomes = [
            outcome(
                &jobs[0],
                vec![(0, Outcome::Delivered), (1, Outcome::Delivered)],
            ),
            outcome(
                &jobs[1],
                vec![(0, Outcome::Delivered), (1, Outcome::retry("down"))],
            ),
            outcome(
                &jobs[2],
                vec![(0, Outcome::poison("bad")), (1, Outcome::Delivered)],
            ),
            invalid,
            outcome(&jobs[4], vec![(0, Outcome::retry("still down"))]),
        ];
        let later = now.plus(Duration::from_secs(2));
        let step = f.run(&Plan::record_only(5), &outcomes, &[], &[], later);

        assert_eq!(step.finished_rows, ids);
        let c = &step.counts;
        assert_eq!((c.delivered, c.retried, c.dead, c.fenced), (1, 1, 3, 0));
        let delivered = f.row(ids[0]);
        assert_eq!(
            (delivered.status.as_str(), delivered.token),
            ("delivered", None)
        );
        assert_eq!(f.ledger(ids[0]), ["a", "b"]);

        let retry_at = later.plus(Duration::from_secs(30));
        let retried = f.row(ids[1]);
        assert_eq!(
            retried,
            Row {
                status: "pending".into(),
                token: None,
                lease_until: None,
                available_at: retry_at.as_millis(),
                attempts: 1,
                last_error: Some("consumer b: down".into()),
            }
        );
        assert_eq!(step.next_due, Some(retry_at));
        assert_eq!(f.ledger(ids[1]), ["a"], "only the consumer that delivered");

        let poisoned = f.row(ids[2]);
        assert_eq!((poisoned.status.as_str(), poisoned.attempts), ("dead", 0));
        assert_eq!(
            poisoned.last_error.as_deref(),
            Some("consumer a rejected it as poison: bad")
        );
        assert_eq!(f.ledger(ids[2]), ["b"]);

        let invalid = f.row(ids[3]);
        assert_eq!((invalid.status.as_str(), invalid.attempts), ("dead", 0));
        assert_eq!(
            invalid.last_error.as_deref(),
            Some("invalid row: payload is not valid JSON")
        );
        assert!(f.ledger(ids[3]).is_empty(), "no consumer ran");

        let gave_up = f.row(ids[4]);
        assert_eq!((gave_up.status.as_str(), gave_up.attempts), ("dead", 3));
        assert_eq!(
            gave_up.last_error.as_deref(),
            Some("gave up after 3 attempts: consumer a: still down")
        );
        for id in &ids {
            assert_eq!(f.row(*id).lease_until, None, "row {id} keeps no lease");
        }
        let per_consumer: Vec<(usize, ConsumerResult)> = step.counts.per_consumer.clone();
        assert_eq!(
            per_consumer,
            [
                (0, ConsumerResult::Delivered),
                (1, ConsumerResult::Retried),
                (0, ConsumerResult::Poisoned),
                (1, ConsumerResult::Delivered),
                (0, ConsumerResult::Retried),
                (0, ConsumerResult::Delivered),
                (1, ConsumerResult::Delivered),
            ],
            "the rows recorded one by one first, then the ones delivered to all"
        );
    }

    /// A release gives the row back, due now and its attempts unchanged; a
    /// heartbeat moves the lease (and so when the row is next due) to a
    /// lease from now. Under a token the row no longer carries, neither
    /// changes it, and the step says the lease was lost.
    #[test]
    fn leases_are_released_and_extended_under_their_own_token_only() {
        let mut f = Fixture::new();
        let ids: Vec<i64> = (0..4).map(|_| f.put("a.b.v1")).collect();
        let now = soon();
        let (_, jobs) = f.claim(10, now);
        let token = jobs[0].token.clone();
        let stale: Arc<str> = "another relay's token".into();
        let later = now.plus(Duration::from_secs(20));
        let step = f.run(
            &Plan::record_only(0),
            &[],
            &[(ids[0], token.clone()), (ids[1], stale.clone())],
            &[(ids[2], token.clone()), (ids[3], stale.clone())],
            later,
        );

        let released = f.row(ids[0]);
        assert_eq!(
            released,
            Row {
                status: "pending".into(),
                token: None,
                lease_until: None,
                available_at: later.as_millis(),
                attempts: 0,
                last_error: None,
            }
        );
        let claimed_until = now.plus(LEASE).as_millis();
        let untouched = f.row(ids[1]);
        assert_eq!(untouched.token.as_deref(), Some(&*token));
        assert_eq!(untouched.lease_until, Some(claimed_until));
        assert_eq!(step.released, [ids[0], ids[1]]);
        assert!(matches!(
            step.notes[..],
            [Note::NothingToRelease { row_id }, Note::LeaseLost { row_id: lost }]
                if row_id == ids[1] && lost == ids[3]
        ));

        let renewed_until = later.plus(LEASE);
        let extended = f.row(ids[2]);
        assert_eq!(extended.token.as_deref(), Some(&*token));
        assert_eq!(
            (extended.lease_until, extended.available_at),
            (Some(renewed_until.as_millis()), renewed_until.as_millis())
        );
        assert_eq!(f.row(ids[3]).lease_until, Some(claimed_until));
        assert_eq!(
            step.extended,
            [(ids[2], renewed_until), (ids[3], Timestamp::MAX)],
            "a lost lease is marked so, never renewed again"
        );
    }

    /// The fence: a row whose lease ran out and which another claim took
    /// over keeps the new claim whatever the old token's outcome says
    /// (delivered, retry, poison, invalid), and the ledger gets no entry
    /// for it; every such outcome is counted as fenced.
    #[test]
    fn an_outcome_under_a_stale_token_overwrites_nothing() {
        let mut f = Fixture::new();
        let ids: Vec<i64> = (0..5).map(|_| f.put("a.b.v1")).collect();
        let now = soon();
        let (_, old) = f.claim(10, now);
        // The leases run out; another claim takes every row over.
        let after = now.plus(LEASE).plus(Duration::from_secs(1));
        let (_, new) = f.claim(10, after);
        assert_eq!(new.len(), 5, "the expired rows are claimed again");
        let token = new[0].token.clone();
        assert_ne!(token, old[0].token);

        let mut invalid = outcome(&old[3], Vec::new());
        invalid.invalid = Some("invalid row: whatever".into());
        let outcomes = [
            outcome(
                &old[0],
                vec![(0, Outcome::Delivered), (1, Outcome::Delivered)],
            ),
            outcome(
                &old[1],
                vec![(0, Outcome::Delivered), (1, Outcome::retry("down"))],
            ),
            outcome(&old[2], vec![(0, Outcome::poison("bad"))]),
            invalid,
            // One delivered row alone takes the one-row form of the update.
            outcome(
                &old[4],
                vec![(0, Outcome::Delivered), (1, Outcome::Delivered)],
            ),
        ];
        let later = after.plus(Duration::from_secs(1));
        let mut step = f.run(&Plan::record_only(4), &outcomes[..4], &[], &[], later);
        let last = f.run(&Plan::record_only(1), &outcomes[4..], &[], &[], later);
        step.counts.fenced += last.counts.fenced;

        let until = after.plus(LEASE).as_millis();
        for id in &ids {
            assert_eq!(
                f.row(*id),
                Row {
                    status: "pending".into(),
                    token: Some(token.to_string()),
                    lease_until: Some(until),
                    available_at: until,
                    attempts: 0,
                    last_error: None,
                },
                "row {id} keeps the new claim"
            );
            assert!(f.ledger(*id).is_empty(), "row {id}: no ledger entry");
        }
        let c = &step.counts;
        assert_eq!((c.delivered, c.retried, c.dead, c.fenced), (0, 0, 0, 5));
        assert!(
            c.per_consumer.is_empty(),
            "no consumer's progress is counted"
        );
        assert!(step.notes.iter().all(|n| matches!(n, Note::Fenced { .. })));
    }

    /// An outcome for a row no longer in flight (released at shutdown, say)
    /// is not recorded: its row is left as it is.
    #[test]
    fn an_outcome_for_a_row_not_in_flight_is_dropped() {
        let mut f = Fixture::new();
        let id = f.put("a.b.v1");
        let now = soon();
        let (_, jobs) = f.claim(10, now);
        f.in_flight.clear();
        let done = outcome(
            &jobs[0],
            vec![(0, Outcome::Delivered), (1, Outcome::Delivered)],
        );
        let step = f.run(&Plan::record_only(1), &[done], &[], &[], now);
        assert_eq!(f.row(id).status, "pending");
        assert_eq!(f.row(id).token.as_deref(), Some(&*jobs[0].token));
        assert_eq!(step.counts.delivered + step.counts.fenced, 0);
    }
}
