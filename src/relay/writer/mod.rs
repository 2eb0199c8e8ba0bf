//! The writer thread: the relay's only write connection. Its loop takes the
//! outcomes the workers send, asks the [planner](super::plan) whether a
//! write transaction is worth making ([`write`](mod@write)), makes it
//! ([`transaction`]: record outcomes, release and extend leases, claim and
//! route the next batch), hands the new jobs to the workers ([`step`]), and
//! runs [housekeeping](super::housekeeping) between transactions. The
//! decisions live in those modules, in [`router`](crate::router),
//! [`dedup`](crate::dedup) and [`retry`](super::retry); this folder is the
//! state and the I/O. See docs/relay.md for the thread and channel
//! protocol.

mod damage;
mod dispatch;
mod in_flight;
mod note;
mod record;
mod step;
mod transaction;
mod write;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use rusqlite::Connection;

use super::checkpoint::Checkpointer;
use super::claim;
use super::clock_step::{ClockWatch, Repair};
use super::housekeeping::Housekeeping;
use super::job::{Job, JobOutcome};
use super::metrics::Metrics;
use super::plan::{Limits, Planner, MAX_ERROR_BACKOFF};
use super::wake::{self, Timers, Wake};
use super::{ConsumerEntry, Control, Settings, DEFAULT_DROP_GRACE};
use crate::clock::{Clock, Timestamp};
use crate::error::{Error, Result};
use crate::router::Routes;
use in_flight::{InFlight, RowMap, RowSet};

/// A relay with nothing in flight that has not written for this long is
/// idle: housekeeping may truncate a WAL that grew.
const IDLE_AFTER: Duration = Duration::from_secs(1);
/// How long the writer waits, after it stops, for workers to return.
const WORKER_EXIT_WAIT: Duration = Duration::from_millis(500);

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

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}
