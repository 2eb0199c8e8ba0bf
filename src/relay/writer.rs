//! The writer thread: the relay's only write connection. Its loop takes the
//! outcomes the workers send, asks the [planner](super::plan) whether a
//! write transaction is worth making, makes it (record outcomes, release and
//! extend leases, claim and route the next batch), hands the new jobs to the
//! workers, and runs [housekeeping](super::housekeeping) between
//! transactions. The decisions live in those modules, in
//! [`router`](crate::router), [`dedup`](crate::dedup) and
//! [`retry`](super::retry); this file is the state and the I/O. See the
//! module doc of `relay` for the thread and channel protocol.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use rusqlite::{Connection, TransactionBehavior};

use super::checkpoint::Checkpointer;
use super::claim;
use super::clock_step::{ClockWatch, Repair};
use super::housekeeping::Housekeeping;
use super::job::{Job, JobOutcome};
use super::metrics::{ConsumerResult, Metrics};
use super::plan::{self, Limits, Load, Plan, Planner, MAX_ERROR_BACKOFF};
use super::retry::{self, Verdict};
use super::wake::{self, Timers, Wake};
use super::{ConsumerEntry, Control, Settings, DEFAULT_DROP_GRACE};
use crate::clock::{Clock, Timestamp};
use crate::consumer::Outcome;
use crate::envelope::{check_head, check_row, EnvelopeError, EventId};
use crate::error::{is_busy, Error, Result};
use crate::integrity::Depth;
use crate::router::{Dispatch, Finish, Routes};
use crate::text::{clip, Keep};

/// The writer's maps and sets keyed by row id, hashed by [`RowIdHasher`].
type RowMap<V> = HashMap<i64, V, BuildHasherDefault<RowIdHasher>>;
type RowSet = HashSet<i64, BuildHasherDefault<RowIdHasher>>;

/// Hashes a row id with one multiplication by an odd constant (Fibonacci
/// hashing): a bijection, so ids that differ only in their low bits (as
/// the rows of one claim do) never share a bucket, and the high bits the
/// table also reads are mixed. The default SipHash cost the writer ~1.1 k
/// instructions per event (BENCHMARKS.md, section 2). Its resistance to
/// chosen keys is not needed: these maps hold at most the rows in flight
/// (the jobs channel's capacity), so even ids picked to collide cost a
/// few microseconds.
#[derive(Default)]
struct RowIdHasher(u64);

impl Hasher for RowIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_i64` is used (the keys are i64); this serves any
        // other key type correctly, if slowly.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(FIBONACCI);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// 2^64 divided by the golden ratio, made odd.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// Longest reason text stored in `last_error`.
const MAX_REASON_BYTES: usize = 4096;
/// A relay with nothing in flight that has not written for this long is
/// idle: housekeeping may truncate a WAL that grew.
const IDLE_AFTER: Duration = Duration::from_secs(1);
/// How long the writer waits, after it stops, for workers to return.
const WORKER_EXIT_WAIT: Duration = Duration::from_millis(500);

/// A row this relay holds a claim on.
struct InFlight {
    token: Arc<str>,
    lease_until: Timestamp,
    /// When to renew the lease by the monotonic clock: half a lease after
    /// the claim or the last renewal, whatever the wall clock did meanwhile.
    renew_at: Instant,
    event_id: EventId,
    attempts: u32,
    /// Its payload's size while its delivery runs; 0 once its outcome is in.
    bytes: u64,
}

/// The channels and threads the writer works with (made by `Relay::start`).
pub(crate) struct Pool {
    /// Jobs to the workers. Dropped at shutdown, so each worker ends after
    /// its current job.
    pub jobs: Sender<Job>,
    /// The same channel's receiving end, to take back jobs no worker has
    /// started when shutting down.
    pub unstarted: Receiver<Job>,
    /// Outcomes from the workers, in groups.
    pub outcomes: Receiver<Vec<JobOutcome>>,
    /// The worker threads.
    pub workers: Vec<JoinHandle<()>>,
}

pub(crate) struct Writer {
    conn: Connection,
    /// Runs the WAL checkpoints the writer's commits call for; stopped
    /// when the writer ends.
    checkpointer: Option<Checkpointer>,
    settings: Settings,
    consumers: Arc<Vec<ConsumerEntry>>,
    routes: Routes,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    control: Receiver<Control>,
    planner: Planner,
    housekeeping: Housekeeping,
    /// The most rows in flight, and the capacity of the jobs channel.
    capacity: usize,

    in_flight: RowMap<InFlight>,
    pending: Vec<JobOutcome>,
    to_release: Vec<(i64, Arc<str>)>,
    want_claim: bool,
    next_due: Option<Timestamp>,
    data_version: i64,
    /// The earliest lease among `in_flight`, to know when to heartbeat.
    earliest_lease: Option<Timestamp>,
    /// The earliest monotonic renewal among `in_flight`.
    earliest_renewal: Option<Instant>,
    /// Notices steps of the system clock.
    clock_watch: ClockWatch,
    /// The sum of `in_flight`'s `bytes`: payloads held by deliveries.
    bytes_in_flight: u64,
    /// Set when SQLite said the file is damaged: the writer stops claiming,
    /// records what it can, and ends with this error.
    damaged: Option<Error>,
    /// When the last write transaction committed.
    last_commit: Instant,
    /// The last error a write transaction met, for the shutdown's report.
    last_error: Option<rusqlite::Error>,
    /// Outcomes and releases given up on (one at a time, on a damaged file).
    given_up: Unwritten,
    shutdown_at: Option<Instant>,
}

/// What one write transaction did, applied to the writer's state only after
/// it committed.
#[derive(Default)]
struct Step {
    claimed: Vec<(Job, InFlight)>,
    finished_rows: Vec<i64>,
    extended: Vec<(i64, Timestamp)>,
    released: Vec<i64>,
    /// Claim again at once: the claim took all it asked for, or finished
    /// rows itself (a dead letter, a row whose consumers all had it), which
    /// may release rows it passed over: the next event of an ordering key,
    /// a later row of the same event id.
    claim_again: bool,
    next_due: Option<Timestamp>,
    counts: Counts,
    /// Log lines about what the transaction decided, written once it committed.
    notes: Vec<Note>,
}

#[derive(Default)]
struct Counts {
    delivered: u64,
    retried: u64,
    dead: u64,
    fenced: u64,
    claimed: u64,
    claim_micros: u64,
    per_consumer: Vec<(usize, ConsumerResult)>,
}

/// Something worth a log line, decided inside a transaction.
enum Note {
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
    fn log(&self) {
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

impl Writer {
    /// Opens the write connection and checks the schema.
    pub(crate) fn open(
        settings: Settings,
        consumers: Arc<Vec<ConsumerEntry>>,
        routes: Routes,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        control: Receiver<Control>,
    ) -> Result<Writer> {
        let mut conn = crate::connection::open(&settings.path)?;
        crate::schema::ensure_current(&conn)?;
        // The relay's own writes may use NORMAL: a relay commit lost to power
        // loss only moves an event back a step (a claim, a "delivered" mark),
        // which means a repeated delivery, never a lost event. Producers'
        // commits, which must survive, are made with FULL on their connections.
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(Error::db("set the relay's synchronous mode"))?;
        claim::stable_plans(&conn).map_err(Error::db("set the relay's query planning"))?;
        let data_version = data_version(&conn).map_err(Error::db("read data_version"))?;
        let checkpointer = Checkpointer::start(&settings.path, &mut conn, |f| {
            super::spawn(super::checkpoint::THREAD.into(), f)
        })?;
        let capacity = settings.batch_size.max(settings.workers * 2);
        let planner = Planner::new(Limits {
            batch_size: settings.batch_size,
            capacity,
            flush_interval: settings.flush_interval,
            lease: settings.lease,
            batch_bytes: settings.batch_bytes,
        });
        let housekeeping = Housekeeping::new(
            settings.housekeeping_interval,
            settings.stale_after,
            settings.purge.clone(),
            settings.max_payload_bytes,
            Repair::new(
                settings.lease,
                consumers
                    .iter()
                    .map(|c| c.retry.longest_wait())
                    .max()
                    .unwrap_or_default(),
            ),
            conn.path()
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(format!("{p}-wal"))),
            Instant::now(),
        );
        Ok(Writer {
            conn,
            checkpointer: Some(checkpointer),
            consumers,
            routes,
            clock,
            metrics,
            control,
            planner,
            housekeeping,
            capacity,
            in_flight: RowMap::default(),
            pending: Vec::new(),
            to_release: Vec::new(),
            want_claim: true,
            next_due: None,
            data_version,
            earliest_lease: None,
            earliest_renewal: None,
            clock_watch: ClockWatch::default(),
            bytes_in_flight: 0,
            damaged: None,
            last_commit: Instant::now(),
            last_error: None,
            given_up: Unwritten::default(),
            shutdown_at: None,
            settings,
        })
    }

    /// The capacity of the jobs channel the writer expects.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn run(mut self, pool: Pool) -> Result<()> {
        let Pool {
            jobs,
            unstarted,
            outcomes,
            workers,
        } = pool;
        let mut jobs = Some(jobs);
        let mut wake = Wake::start(
            self.settings
                .watch_wal
                .then(|| self.housekeeping.wal())
                .flatten(),
            self.settings.poll_interval,
            Instant::now(),
        );
        tracing::info!(
            workers = workers.len(),
            consumers = self.consumers.len(),
            "relay started"
        );

        loop {
            while let Ok(o) = outcomes.try_recv() {
                self.push_outcomes(o);
            }
            if self.shutdown_at.is_some_and(|d| Instant::now() >= d) {
                self.abandon_in_flight();
            }
            if let Some(back) = self
                .clock_watch
                .stepped_back(self.clock.now(), Instant::now())
            {
                tracing::warn!(
                    stepped_back_ms = u64::try_from(back.as_millis()).unwrap_or(u64::MAX),
                    "the system clock stepped back; renewing leases by the monotonic clock and \
                     looking for leases and retries left far ahead"
                );
                self.housekeeping.clock_stepped(Instant::now());
                self.want_claim = true;
            }
            if self.damaged.is_some() {
                // Stop claiming; let the deliveries in flight finish and
                // record what the file still takes.
                self.begin_shutdown(DEFAULT_DROP_GRACE, &mut jobs, &unstarted);
                self.salvage();
            } else {
                self.write_if_needed(jobs.as_ref(), &mut wake);
            }
            if let Some(deadline) = self.shutdown_at {
                let idle = self.in_flight.is_empty() && self.pending.is_empty();
                if (idle && self.to_release.is_empty())
                    || Instant::now() >= deadline + MAX_ERROR_BACKOFF
                {
                    break;
                }
            } else if self.housekeeping.due(Instant::now()) {
                let idle = self.in_flight.is_empty()
                    && self.pending.is_empty()
                    && self.last_commit.elapsed() >= IDLE_AFTER;
                let in_flight = &self.in_flight;
                let tick = self.housekeeping.run(
                    &mut self.conn,
                    self.clock.now(),
                    &self.metrics,
                    idle,
                    |id| in_flight.contains_key(&id),
                );
                // Pages other connections committed (their own commits
                // checkpoint only past 1,000 pages).
                if let Some(checkpointer) = &self.checkpointer {
                    checkpointer.request();
                }
                // Rows a clock step left waiting may be due now.
                self.want_claim |= tick.made_due;
                // A row dead-lettered there may have held back its ordering key.
                self.want_claim |= tick.dead_lettered > 0;
                if let Some(e) = tick.damage {
                    self.stop_on_damage(e);
                }
            }

            // Sleep until a message, a notification, the next data_version
            // read or the next timed work (relay/wake.rs).
            let at = Instant::now();
            let timed = wake::until_timed_work(&Timers {
                now: self.clock.now(),
                at,
                next_due: self.next_due,
                earliest_lease: self.earliest_lease,
                lease: self.settings.lease,
                earliest_renewal: self.earliest_renewal,
                housekeeping: self.housekeeping.next_at(),
            });
            let wait = self
                .planner
                .wait(wake.timeout(at).min(timed), self.shutdown_at, at);
            let mut signalled = false;
            select! {
                recv(outcomes) -> o => if let Ok(o) = o { self.push_outcomes(o) },
                recv(self.control) -> c => match c {
                    Ok(Control::Notify) => self.want_claim = true,
                    Ok(Control::Shutdown(grace)) => self.begin_shutdown(grace, &mut jobs, &unstarted),
                    Err(_) => self.begin_shutdown(DEFAULT_DROP_GRACE, &mut jobs, &unstarted),
                },
                recv(wake.signals()) -> r => signalled = wake.took(r),
                default(wait) => {}
            }
            // Commits by other connections (other processes, or the host's
            // own connections) change data_version; ours do not.
            if wake.read_due(signalled, Instant::now()) {
                let changed = match data_version(&self.conn) {
                    Ok(v) if v != self.data_version => {
                        self.data_version = v;
                        self.want_claim = true;
                        self.planner.foreign_write(Instant::now());
                        true
                    }
                    Ok(_) => false,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read data_version");
                        false
                    }
                };
                wake.read(changed, Instant::now());
            }
        }

        drop(jobs);
        // Each worker holds an outcomes sender: the channel disconnects when
        // the last one has ended. Wait briefly for that; a worker still inside
        // a consumer after the grace period is left behind, its row already
        // released (its late outcome would be fenced out anyway).
        let deadline = Instant::now() + WORKER_EXIT_WAIT;
        while let Ok(late) = outcomes.recv_deadline(deadline) {
            tracing::debug!(
                count = late.len(),
                "outcomes after shutdown; their rows were released"
            );
        }
        for w in workers {
            if w.is_finished() {
                let _ = w.join();
            } else {
                tracing::warn!("a consumer is still running after the grace period; leaving it");
            }
        }
        self.finish()
    }

    /// The relay's end: what it could not write is said at ERROR and in the
    /// error returned (the binary exits non-zero), since those deliveries
    /// will be made again.
    fn finish(mut self) -> Result<()> {
        if let Some(checkpointer) = self.checkpointer.take() {
            checkpointer.stop(&mut self.conn);
        }
        let unwritten = Unwritten {
            outcomes: self.given_up.outcomes + self.pending.len(),
            releases: self.given_up.releases + self.to_release.len(),
        };
        if unwritten.any() {
            let error = self.last_error.as_ref().map(ToString::to_string);
            tracing::error!(
                outcomes = unwritten.outcomes,
                leases = unwritten.releases,
                error = error.as_deref().unwrap_or("none"),
                "could not record the outcomes of {} finished deliveries nor release {} \
                 claims before stopping: those events will be delivered again once their \
                 leases expire",
                unwritten.outcomes,
                unwritten.releases
            );
        }
        if let Some(e) = self.damaged.take() {
            tracing::info!("relay stopped: the database file is damaged");
            return Err(e);
        }
        if unwritten.any() {
            tracing::info!("relay stopped without recording every outcome");
            return Err(Error::Unwritten {
                outcomes: unwritten.outcomes,
                releases: unwritten.releases,
                source: self.last_error.take(),
            });
        }
        tracing::info!("relay stopped");
        Ok(())
    }

    /// SQLite said the file is damaged (SQLITE_CORRUPT, SQLITE_NOTADB):
    /// trying again cannot help. Logs what `outboxd doctor` would say, and
    /// makes the writer stop claiming and end with the error.
    fn stop_on_damage(&mut self, source: rusqlite::Error) {
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
    fn salvage(&mut self) {
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
    fn forget_in_flight(&mut self, row_id: i64) {
        if let Some(f) = self.in_flight.remove(&row_id) {
            self.bytes_in_flight = self.bytes_in_flight.saturating_sub(f.bytes);
        }
    }

    fn push_outcomes(&mut self, group: Vec<JobOutcome>) {
        self.planner.outcomes_waiting(Instant::now());
        // A reported delivery holds its payload no longer.
        for o in &group {
            if let Some(f) = self.in_flight.get_mut(&o.row_id) {
                self.bytes_in_flight = self
                    .bytes_in_flight
                    .saturating_sub(std::mem::take(&mut f.bytes));
            }
        }
        self.pending.extend(group);
    }

    fn begin_shutdown(
        &mut self,
        grace: Duration,
        jobs: &mut Option<Sender<Job>>,
        unstarted: &Receiver<Job>,
    ) {
        if self.shutdown_at.is_some() {
            return;
        }
        tracing::info!(
            grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            "relay shutting down"
        );
        let now = Instant::now();
        self.shutdown_at = Some(now.checked_add(grace).unwrap_or(now + MAX_GRACE));
        // Jobs no worker has started go back to the table now.
        while let Ok(job) = unstarted.try_recv() {
            self.to_release.push((job.row_id, job.token));
        }
        // Each worker ends after its current job.
        *jobs = None;
    }

    /// After the grace period: give back every row still in flight. A
    /// worker that finishes later is fenced out by the token.
    fn abandon_in_flight(&mut self) {
        let queued: RowSet = self.to_release.iter().map(|(id, _)| *id).collect();
        let done: RowSet = self.pending.iter().map(|o| o.row_id).collect();
        for (id, f) in &self.in_flight {
            if !queued.contains(id) && !done.contains(id) {
                tracing::warn!(
                    row_id = id,
                    "delivery still running after the grace period; releasing its lease"
                );
                self.to_release.push((*id, f.token.clone()));
            }
        }
    }

    /// Asks the planner whether a write transaction is worth making now, and
    /// makes it.
    fn write_if_needed(&mut self, jobs: Option<&Sender<Job>>, wake: &mut Wake) {
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
                if busy {
                    // SQLITE_BUSY is never an event failure: wait and retry.
                    Metrics::add(&self.metrics.busy_retries, 1);
                } else if crate::integrity::is_damage(&e) {
                    Metrics::add(&self.metrics.errors, 1);
                    self.stop_on_damage(e);
                    return;
                } else {
                    Metrics::add(&self.metrics.errors, 1);
                    tracing::error!(error = %e, retry_in_ms = pause.as_millis() as u64,
                        "cannot write to the database; will retry");
                }
                self.last_error = Some(e);
            }
        }
    }

    /// One `BEGIN IMMEDIATE` transaction: record outcomes, release and
    /// extend leases, claim the next batch.
    fn transact(
        &mut self,
        plan: &Plan,
        outcomes: &[JobOutcome],
        releases: &[(i64, Arc<str>)],
        heartbeat: &[(i64, Arc<str>)],
        now: Timestamp,
    ) -> rusqlite::Result<Step> {
        let Writer {
            conn,
            consumers,
            routes,
            in_flight,
            settings,
            ..
        } = self;
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

    /// Applies a committed step to the in-memory state and hands out jobs.
    fn apply(&mut self, step: Step, jobs: Option<&Sender<Job>>, claim_limit: usize) {
        for note in &step.notes {
            note.log();
        }
        for id in step.finished_rows.iter().chain(&step.released) {
            if let Some(f) = self.in_flight.remove(id) {
                self.bytes_in_flight = self.bytes_in_flight.saturating_sub(f.bytes);
            }
        }
        let renew_at = Instant::now() + self.settings.lease / 2;
        for (id, until) in step.extended {
            if let Some(f) = self.in_flight.get_mut(&id) {
                f.lease_until = until;
                // A lost lease is not renewed again.
                f.renew_at = if until == Timestamp::MAX {
                    Instant::now() + MAX_GRACE
                } else {
                    renew_at
                };
            }
        }
        if !step.finished_rows.is_empty() || !step.released.is_empty() {
            // A finished row may unblock the next event of its ordering key.
            self.want_claim = true;
        }
        if claim_limit > 0 {
            self.want_claim = step.claim_again;
            self.next_due = step.next_due;
        } else if let Some(t) = step.next_due {
            self.next_due = Some(self.next_due.map_or(t, |d| d.min(t)));
        }
        for (job, flight) in step.claimed {
            let id = job.row_id;
            let token = flight.token.clone();
            self.bytes_in_flight += flight.bytes;
            self.in_flight.insert(id, flight);
            let sent = jobs.is_some_and(|tx| tx.try_send(job).is_ok());
            if !sent {
                // Cannot happen while claims stay within capacity; give the
                // row back rather than lose track of it.
                self.to_release.push((id, token));
            }
        }
        self.earliest_lease = self.in_flight.values().map(|f| f.lease_until).min();
        self.earliest_renewal = self.in_flight.values().map(|f| f.renew_at).min();
        let c = step.counts;
        let m = &self.metrics;
        Metrics::add(&m.delivered, c.delivered);
        Metrics::add(&m.retried, c.retried);
        Metrics::add(&m.dead_lettered, c.dead);
        Metrics::add(&m.fenced_out, c.fenced);
        Metrics::add(&m.claimed, c.claimed);
        Metrics::add(&m.claim_micros_total, c.claim_micros);
        for (consumer, result) in c.per_consumer {
            m.count_result(consumer, result);
        }
    }
}

/// Outcomes not recorded and claims not released when the writer stopped.
#[derive(Debug, Default, Clone, Copy)]
struct Unwritten {
    outcomes: usize,
    releases: usize,
}

impl Unwritten {
    fn any(&self) -> bool {
        self.outcomes + self.releases > 0
    }
}

/// The longest shutdown grace the writer keeps time for (a longer one would
/// overflow `Instant`; no shutdown waits that long anyway).
const MAX_GRACE: Duration = Duration::from_secs(365 * 86_400);

/// Routes a claimed row ([`Routes::dispatch`]) and carries the decision
/// out: a dead letter, a delivered mark, or a job for the workers. Routing
/// needs only the event type and id ([`check_head`]); a row going to a
/// worker is checked whole there, one finished here is checked whole
/// here, and a row whose columns make no valid envelope is dead-lettered
/// with the reason ([`check_row`]) either way.
#[allow(clippy::too_many_arguments)]
fn dispatch_claimed(
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
        claim::dead_letter(tx, row_id, token, &reason, now, false)?;
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
            claim::finish_delivered(tx, row_id, token, now)?;
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
            claim::dead_letter(tx, row_id, token, &reason, now, false)?;
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

/// Records the outcomes of finished jobs (those of rows still in flight).
/// Each row's own update is fenced by its token and made first; the
/// consumers' progress is written only for the rows whose update took, so
/// a relay that lost a lease records nothing for that row. The common
/// case, a row delivered to every consumer, is grouped: the rows' updates
/// take one statement per claim token, and the ledger entries of all rows
/// one per consumer, each over an [`IdList`](crate::connection::IdList) of
/// the rows. (The same over a JSON array, with `json_each` and `->>`, cost
/// 6 % more instructions per event than one execution per row, for
/// parsing the JSON back; with id lists the writer does 10 % fewer.
/// BENCHMARKS.md, section 2.)
fn record(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    in_flight: &RowMap<InFlight>,
    outcomes: &[JobOutcome],
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    let mut delivered: Vec<&JobOutcome> = Vec::new();
    let mut ledger: Vec<(&str, i64)> = Vec::new();
    for o in outcomes {
        let Some(flight) = in_flight.get(&o.row_id) else {
            continue;
        };
        if o.invalid.is_none() && o.results.iter().all(|(_, r)| *r == Outcome::Delivered) {
            delivered.push(o);
        } else if record_one(tx, consumers, flight, o, now, step)? {
            progress(consumers, o, step, &mut ledger);
        }
    }
    let group: Vec<(i64, &str)> = delivered.iter().map(|o| (o.row_id, &*o.token)).collect();
    let kept: RowSet = claim::finish_delivered_many(tx, &group, now)?
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
            Outcome::Retry { .. } => ConsumerResult::Retried,
            Outcome::Poison { .. } => ConsumerResult::Poisoned,
        };
        step.counts.per_consumer.push((*i, result));
    }
}

/// Records one job's outcome other than "delivered to all": the row's
/// fenced update for its verdict (retry, dead letter). True when the
/// update took (the caller then records the consumers' progress).
fn record_one(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    flight: &InFlight,
    o: &JobOutcome,
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<bool> {
    let (row_id, event_id) = (o.row_id, flight.event_id);
    if let Some(reason) = &o.invalid {
        // The worker found the row invalid: no consumer ran.
        if claim::dead_letter(tx, row_id, &o.token, reason, now, false)? {
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
    let reports = o.results.iter().map(|(i, outcome)| retry::Report {
        consumer: &consumers[*i].name,
        policy: &consumers[*i].retry,
        outcome,
    });
    let verdict = retry::verdict(reports, flight.attempts, now, rand::random);
    let kept = match &verdict {
        Verdict::Delivered => claim::finish_delivered(tx, row_id, &o.token, now)?,
        Verdict::Retry { at, reason, .. } => {
            step.next_due = Some(step.next_due.map_or(*at, |t| t.min(*at)));
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            claim::schedule_retry(tx, row_id, &o.token, *at, &reason)?
        }
        Verdict::Poison { reason } => {
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            claim::dead_letter(tx, row_id, &o.token, &reason, now, false)?
        }
        Verdict::GaveUp { reason, .. } => {
            let reason = clip(reason, MAX_REASON_BYTES, Keep::Head);
            claim::dead_letter(tx, row_id, &o.token, &reason, now, true)?
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

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of one claim are consecutive ids: none of them share a
    /// bucket of a table that size, and the set finds every one.
    #[test]
    fn consecutive_row_ids_spread_over_every_bucket() {
        let hash = |id: i64| {
            let mut h = RowIdHasher::default();
            h.write_i64(id);
            h.finish()
        };
        for start in [1_i64, 1_000_003, i64::MAX - 300] {
            let buckets: HashSet<u64> = (start..start + 256).map(|id| hash(id) & 255).collect();
            assert_eq!(buckets.len(), 256, "ids from {start}");
        }
        let set: RowSet = (1..=1000).collect();
        assert!((1..=1000).all(|id| set.contains(&id)) && !set.contains(&0));
    }
}
