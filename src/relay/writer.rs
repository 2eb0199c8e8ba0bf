//! The writer thread: the relay's only write connection. It claims, hands
//! jobs to the workers, heartbeats leases, records outcomes in groups, and
//! runs housekeeping. See the module doc of `relay` for the protocol.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use rusqlite::{Connection, TransactionBehavior};

use super::claim;
use super::worker::{self, Job, JobOutcome};
use super::{ConsumerEntry, Control, Metrics, Settings, UnroutedPolicy, DEFAULT_SHUTDOWN_GRACE};
use crate::clock::{Clock, Timestamp};
use crate::consumer::Outcome;
use crate::error::{is_busy, Error, Result};

/// Longest reason text stored in `last_error`.
const MAX_REASON_BYTES: usize = 4096;
/// Longest pause after a failed write transaction.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);
/// While other connections are writing, the relay's write transactions
/// carry at most this many claims and this many outcomes...
const CONTENDED_GROUP: usize = 16;
/// ...and after each one the writer leaves the lock free this long, so a
/// host's commit waits for one short transaction, not a train of them.
const CONTENDED_PAUSE: Duration = Duration::from_millis(1);
/// How long after another connection's commit the writer stays polite.
const CONTENTION_WINDOW: Duration = Duration::from_millis(200);

/// A row this relay holds a claim on.
struct InFlight {
    token: Arc<str>,
    lease_until: Timestamp,
    event_key: String,
    attempts: u32,
}

pub(crate) struct Writer {
    conn: Connection,
    settings: Settings,
    consumers: Arc<Vec<ConsumerEntry>>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    control: Receiver<Control>,
    /// Event type → indexes of the consumers it routes to.
    routes: HashMap<String, Arc<[usize]>>,
    /// The most rows in flight, and the capacity of the jobs channel.
    capacity: usize,

    in_flight: HashMap<i64, InFlight>,
    pending: Vec<JobOutcome>,
    pending_since: Option<Instant>,
    to_release: Vec<(i64, Arc<str>)>,
    want_claim: bool,
    next_due: Option<Timestamp>,
    data_version: i64,
    /// When `data_version` last showed another connection's commit.
    last_foreign_write: Option<Instant>,
    /// The earliest lease among `in_flight`, to know when to heartbeat.
    earliest_lease: Option<Timestamp>,
    next_housekeeping: Instant,
    error_backoff: Duration,
    not_before: Option<Instant>,
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
    claim_full: bool,
    next_due: Option<Timestamp>,
    counts: Counts,
}

#[derive(Default)]
struct Counts {
    delivered: u64,
    retried: u64,
    dead: u64,
    fenced: u64,
    claimed: u64,
    claim_micros: u64,
    per_consumer: Vec<(usize, usize)>,
}

impl Writer {
    pub(crate) fn open(
        settings: Settings,
        consumers: Arc<Vec<ConsumerEntry>>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        control: Receiver<Control>,
    ) -> Result<Writer> {
        let conn = crate::connection::open(&settings.path)?;
        crate::schema::ensure_current(&conn)?;
        // The relay's own writes may use NORMAL: a relay commit lost to power
        // loss only moves an event back a step (a claim, a "delivered" mark),
        // which means a repeated delivery, never a lost event. Producers'
        // commits, which must survive, are made with FULL on their connections.
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(Error::db("set the relay's synchronous mode"))?;
        let data_version = data_version(&conn).map_err(Error::db("read data_version"))?;
        let capacity = settings.batch_size.max(settings.workers * 2);
        Ok(Writer {
            conn,
            consumers,
            clock,
            metrics,
            control,
            routes: HashMap::new(),
            capacity,
            in_flight: HashMap::new(),
            pending: Vec::new(),
            pending_since: None,
            to_release: Vec::new(),
            want_claim: true,
            next_due: None,
            data_version,
            earliest_lease: None,
            last_foreign_write: None,
            next_housekeeping: Instant::now(),
            error_backoff: Duration::ZERO,
            not_before: None,
            shutdown_at: None,
            settings,
        })
    }

    pub(crate) fn run(mut self) -> Result<()> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded::<Job>(self.capacity);
        let (outcomes_tx, outcomes_rx) = crossbeam_channel::unbounded::<Vec<JobOutcome>>();
        let mut workers = Vec::with_capacity(self.settings.workers);
        for n in 0..self.settings.workers {
            let (consumers, jobs, outcomes) =
                (self.consumers.clone(), jobs_rx.clone(), outcomes_tx.clone());
            let flush = self.settings.flush_interval;
            let spawned = std::thread::Builder::new()
                .name(format!("outboxd-worker-{n}"))
                .spawn(move || worker::run(consumers, jobs, outcomes, flush));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => tracing::error!(error = %e, "cannot start a worker thread"),
            }
        }
        drop(outcomes_tx);
        let mut jobs_tx = Some(jobs_tx);
        let mut last_poll = Instant::now();
        tracing::info!(
            workers = workers.len(),
            consumers = self.consumers.len(),
            "relay started"
        );

        loop {
            while let Ok(o) = outcomes_rx.try_recv() {
                self.push_outcomes(o);
            }
            if self.shutdown_at.is_some_and(|d| Instant::now() >= d) {
                self.abandon_in_flight();
            }
            self.write_if_needed(jobs_tx.as_ref());
            if let Some(deadline) = self.shutdown_at {
                let idle = self.in_flight.is_empty() && self.pending.is_empty();
                if (idle && self.to_release.is_empty())
                    || Instant::now() >= deadline + MAX_ERROR_BACKOFF
                {
                    break;
                }
            } else if Instant::now() >= self.next_housekeeping {
                self.housekeeping();
            }

            let wait = self.wait_time();
            select! {
                recv(outcomes_rx) -> o => if let Ok(o) = o { self.push_outcomes(o) },
                recv(self.control) -> c => match c {
                    Ok(Control::Notify) => self.want_claim = true,
                    Ok(Control::Shutdown(grace)) => self.begin_shutdown(grace, &mut jobs_tx, &jobs_rx),
                    Err(_) => self.begin_shutdown(DEFAULT_SHUTDOWN_GRACE, &mut jobs_tx, &jobs_rx),
                },
                default(wait) => {}
            }
            // Commits by other connections (other processes, or the host's
            // own connections) change data_version; ours do not. Checked at
            // most once per poll interval.
            if last_poll.elapsed() >= self.settings.poll_interval {
                last_poll = Instant::now();
                match data_version(&self.conn) {
                    Ok(v) if v != self.data_version => {
                        self.data_version = v;
                        self.want_claim = true;
                        self.last_foreign_write = Some(Instant::now());
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "cannot read data_version"),
                }
            }
        }

        drop(jobs_tx);
        // Each worker holds an outcomes sender: the channel disconnects when
        // the last one has ended. Wait briefly for that; a worker still inside
        // a consumer after the grace period is left behind, its row already
        // released (its late outcome would be fenced out anyway).
        let deadline = Instant::now() + Duration::from_millis(500);
        while let Ok(late) = outcomes_rx.recv_deadline(deadline) {
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
        tracing::info!("relay stopped");
        Ok(())
    }

    fn push_outcomes(&mut self, group: Vec<JobOutcome>) {
        if self.pending.is_empty() {
            self.pending_since = Some(Instant::now());
        }
        self.pending.extend(group);
    }

    fn begin_shutdown(
        &mut self,
        grace: Duration,
        jobs_tx: &mut Option<Sender<Job>>,
        jobs_rx: &Receiver<Job>,
    ) {
        if self.shutdown_at.is_some() {
            return;
        }
        tracing::info!(grace_ms = grace.as_millis() as u64, "relay shutting down");
        self.shutdown_at = Some(Instant::now() + grace);
        // Jobs no worker has started go back to the table now.
        while let Ok(job) = jobs_rx.try_recv() {
            self.to_release.push((job.row_id, job.token));
        }
        // Each worker ends after its current job.
        *jobs_tx = None;
    }

    /// After the grace period: give back every row still in flight. A
    /// worker that finishes later is fenced out by the token.
    fn abandon_in_flight(&mut self) {
        let queued: std::collections::HashSet<i64> =
            self.to_release.iter().map(|(id, _)| *id).collect();
        let done: std::collections::HashSet<i64> = self.pending.iter().map(|o| o.row_id).collect();
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

    fn wait_time(&self) -> Duration {
        let mut wait = self.settings.poll_interval;
        if let Some(since) = self.pending_since {
            wait = wait.min(self.settings.flush_interval.saturating_sub(since.elapsed()));
        }
        if let Some(nb) = self.not_before {
            wait = wait.max(nb.saturating_duration_since(Instant::now()));
        }
        if let Some(d) = self.shutdown_at {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        wait
    }

    /// Decides whether a write transaction is worth making now, and makes it.
    fn write_if_needed(&mut self, jobs_tx: Option<&Sender<Job>>) {
        if self.not_before.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let now = self.clock.now();
        let settled = self.pending.len() + self.to_release.len();
        let live = self.in_flight.len().saturating_sub(settled);
        let shutting = self.shutdown_at.is_some();
        let due = self.want_claim || self.next_due.is_some_and(|t| t <= now);
        // SQLite has one writer. While the host (or another relay) is
        // writing too, keep each transaction short and pause between them;
        // alone, take the whole batch.
        let contended = self
            .last_foreign_write
            .is_some_and(|t| t.elapsed() < CONTENTION_WINDOW);
        let group = if contended {
            CONTENDED_GROUP.min(self.settings.batch_size)
        } else {
            self.settings.batch_size
        };
        let claim_limit = if !shutting && jobs_tx.is_some() && due && live <= self.capacity / 2 {
            (self.capacity - live).min(group)
        } else {
            0
        };
        let flush = !self.pending.is_empty()
            && (shutting
                || self.pending.len() >= (self.capacity / 2).min(group)
                || self.pending.len() >= self.in_flight.len()
                || self
                    .pending_since
                    .is_some_and(|t| t.elapsed() >= self.settings.flush_interval));
        // Leases are extended when half of them has run out; the scan runs
        // only once the earliest lease is that close.
        let half = self.settings.lease.as_millis() as i64 / 2;
        let heartbeat: Vec<(i64, Arc<str>)> = if self
            .earliest_lease
            .is_some_and(|t| t.as_millis() - now.as_millis() <= half)
        {
            self.in_flight
                .iter()
                .filter(|(_, f)| f.lease_until.as_millis() - now.as_millis() <= half)
                .map(|(id, f)| (*id, f.token.clone()))
                .collect()
        } else {
            Vec::new()
        };
        if claim_limit == 0 && !flush && heartbeat.is_empty() && self.to_release.is_empty() {
            return;
        }
        let outcomes = if flush {
            let take = if contended {
                group.min(self.pending.len())
            } else {
                self.pending.len()
            };
            let rest = self.pending.split_off(take);
            std::mem::replace(&mut self.pending, rest)
        } else {
            Vec::new()
        };
        let releases = std::mem::take(&mut self.to_release);
        let started = Instant::now();
        match self.transact(&outcomes, &releases, &heartbeat, claim_limit, now) {
            Ok(step) => {
                Metrics::add(&self.metrics.commits, 1);
                Metrics::add(
                    &self.metrics.commit_micros_total,
                    started.elapsed().as_micros() as u64,
                );
                self.error_backoff = Duration::ZERO;
                // Pause only after a full-sized transaction: that is a relay
                // working through a backlog, which would otherwise take the
                // lock back at once. Small ones (an event now and then) are
                // short already, and a pause would only add latency.
                let full = step.counts.claimed as usize >= group || outcomes.len() >= group;
                self.not_before = (contended && full).then(|| Instant::now() + CONTENDED_PAUSE);
                if flush && self.pending.is_empty() {
                    self.pending_since = None;
                }
                self.apply(step, jobs_tx, claim_limit);
            }
            Err(e) => {
                // Nothing was recorded: keep everything for the next try.
                if !outcomes.is_empty() {
                    self.pending_since.get_or_insert_with(Instant::now);
                    let newer = std::mem::replace(&mut self.pending, outcomes);
                    self.pending.extend(newer);
                }
                self.to_release.extend(releases);
                if is_busy(&e) {
                    // SQLITE_BUSY is never an event failure: wait and retry.
                    Metrics::add(&self.metrics.busy_retries, 1);
                    self.error_backoff = Duration::from_millis(10);
                } else {
                    Metrics::add(&self.metrics.errors, 1);
                    self.error_backoff = (self.error_backoff * 2)
                        .clamp(Duration::from_millis(50), MAX_ERROR_BACKOFF);
                    tracing::error!(error = %e, retry_in_ms = self.error_backoff.as_millis() as u64,
                        "cannot write to the database; will retry");
                }
                self.not_before = Some(Instant::now() + self.error_backoff);
            }
        }
    }

    /// One `BEGIN IMMEDIATE` transaction: record outcomes, release and
    /// extend leases, claim the next batch.
    fn transact(
        &mut self,
        outcomes: &[JobOutcome],
        releases: &[(i64, Arc<str>)],
        heartbeat: &[(i64, Arc<str>)],
        claim_limit: usize,
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
        for o in outcomes {
            record(&tx, consumers, in_flight, o, now, &mut step)?;
            step.finished_rows.push(o.row_id);
        }
        for (id, token) in releases {
            if !claim::release(&tx, *id, token, now)? {
                tracing::warn!(
                    row_id = id,
                    "lease was already taken over; nothing to release"
                );
            }
            step.released.push(*id);
        }
        let lease_until = now.plus(settings.lease);
        for (id, token) in heartbeat {
            if claim::extend(&tx, *id, token, lease_until)? {
                step.extended.push((*id, lease_until));
            } else {
                tracing::warn!(
                    row_id = id,
                    "lease lost to another relay; its outcome will be refused"
                );
                step.extended.push((*id, Timestamp::from_millis(i64::MAX)));
            }
        }
        if claim_limit > 0 {
            let token: Arc<str> = ulid::Ulid::generate().to_string().into();
            let started = Instant::now();
            let rows = claim::claim(&tx, &token, now, lease_until, claim_limit)?;
            step.counts.claim_micros = started.elapsed().as_micros() as u64;
            step.counts.claimed = rows.len() as u64;
            step.claim_full = rows.len() == claim_limit;
            for row in rows {
                let route = route(routes, consumers, row.envelope.as_ref().ok());
                dispatch_claimed(
                    &tx,
                    consumers,
                    settings.unrouted,
                    &route,
                    row,
                    &token,
                    lease_until,
                    now,
                    &mut step,
                )?;
            }
            if !step.claim_full {
                step.next_due = claim::next_due_after(&tx, now)?;
            }
        }
        tx.commit()?;
        Ok(step)
    }

    /// Applies a committed step to the in-memory state and hands out jobs.
    fn apply(&mut self, step: Step, jobs_tx: Option<&Sender<Job>>, claim_limit: usize) {
        for id in step.finished_rows.iter().chain(&step.released) {
            self.in_flight.remove(id);
        }
        for (id, until) in step.extended {
            if let Some(f) = self.in_flight.get_mut(&id) {
                f.lease_until = until;
            }
        }
        if !step.finished_rows.is_empty() || !step.released.is_empty() {
            // A finished row may unblock the next event of its ordering key.
            self.want_claim = true;
        }
        if claim_limit > 0 {
            self.want_claim = step.claim_full;
            self.next_due = step.next_due;
        } else if let Some(t) = step.next_due {
            self.next_due = Some(self.next_due.map_or(t, |d| d.min(t)));
        }
        for (job, flight) in step.claimed {
            let id = job.row_id;
            self.in_flight.insert(id, flight);
            let sent = jobs_tx.is_some_and(|tx| tx.try_send(job).is_ok());
            if !sent {
                // Cannot happen while claims stay within capacity; give the
                // row back rather than lose track of it.
                let token = self.in_flight[&id].token.clone();
                self.to_release.push((id, token));
            }
        }
        self.earliest_lease = self.in_flight.values().map(|f| f.lease_until).min();
        let c = step.counts;
        let m = &self.metrics;
        Metrics::add(&m.delivered, c.delivered);
        Metrics::add(&m.retried, c.retried);
        Metrics::add(&m.dead_lettered, c.dead);
        Metrics::add(&m.fenced_out, c.fenced);
        Metrics::add(&m.claimed, c.claimed);
        Metrics::add(&m.claim_micros_total, c.claim_micros);
        for (consumer, result) in c.per_consumer {
            Metrics::add(&m.per_consumer[consumer][result], 1);
        }
    }

    /// Purge one batch, checkpoint the WAL, check for stale events. Each in
    /// its own short transaction; failures are logged and tried next tick.
    fn housekeeping(&mut self) {
        let now = self.clock.now();
        let mut again = self.settings.housekeeping_interval;
        if let Some(policy) = self.settings.purge.clone() {
            match crate::purge::purge_batch(&mut self.conn, &policy, now) {
                Ok(r) if r.total() > 0 => {
                    tracing::debug!(
                        delivered = r.delivered,
                        dead = r.dead,
                        dedup = r.dedup_entries,
                        "purged"
                    );
                    // More may be left: come back soon, between claims.
                    again = again.min(Duration::from_millis(100));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "purge failed; will retry"),
            }
        }
        if let Err(e) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        {
            tracing::debug!(error = %e, "checkpoint failed");
        }
        match stale(&self.conn, now, self.settings.stale_after) {
            Ok((count, oldest)) => {
                let age = oldest.map(|t| now.since(t)).unwrap_or_default();
                self.metrics.stale_events.store(count, Ordering::Relaxed);
                self.metrics
                    .oldest_due_ms
                    .store(age.as_millis() as u64, Ordering::Relaxed);
                if count > 0 {
                    tracing::warn!(
                        count,
                        oldest_due_secs = age.as_secs(),
                        threshold_secs = self.settings.stale_after.as_secs(),
                        "stale events: due events are waiting longer than the threshold"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "stale check failed"),
        }
        self.next_housekeeping = Instant::now() + again;
    }
}

/// Routes a claimed row: dead-letters an invalid or unrouted row, marks
/// delivered a row whose consumers all succeeded before (dedup), and
/// makes a job of the rest.
#[allow(clippy::too_many_arguments)]
fn dispatch_claimed(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    unrouted: UnroutedPolicy,
    routes: &[usize],
    row: claim::ClaimedRow,
    token: &Arc<str>,
    lease_until: Timestamp,
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    let envelope = match row.envelope {
        Ok(env) => env,
        Err(e) => {
            let reason = format!("invalid row: {e}");
            tracing::warn!(row_id = row.row_id, %reason, "dead-lettering a malformed row");
            claim::dead_letter(tx, row.row_id, token, &reason, now, false)?;
            step.counts.dead += 1;
            return Ok(());
        }
    };
    if routes.is_empty() {
        match unrouted {
            UnroutedPolicy::DeadLetter => {
                let reason = format!("no consumer takes event type {}", envelope.event_type);
                tracing::warn!(row_id = row.row_id, event_id = %envelope.event_id, %reason, "dead-lettering an unrouted event");
                claim::dead_letter(tx, row.row_id, token, &reason, now, false)?;
                step.counts.dead += 1;
            }
            UnroutedPolicy::Skip => {
                tracing::info!(row_id = row.row_id, event_type = %envelope.event_type, "no consumer takes this event type; skipped");
                claim::finish_delivered(tx, row.row_id, token, now)?;
                step.counts.delivered += 1;
            }
        }
        return Ok(());
    }
    let done = match row.delivered {
        Some(done) => done,
        None => claim::delivered_consumers(tx, &row.event_key)?,
    };
    let missing: Vec<usize> = routes
        .iter()
        .copied()
        .filter(|&i| !done.iter().any(|d| *d == consumers[i].name))
        .collect();
    if missing.is_empty() {
        tracing::debug!(row_id = row.row_id, event_id = %envelope.event_id, "every consumer has this event already");
        claim::finish_delivered(tx, row.row_id, token, now)?;
        step.counts.delivered += 1;
        return Ok(());
    }
    let job = Job {
        row_id: row.row_id,
        token: token.clone(),
        envelope,
        legacy: row.legacy,
        tenant_id: row.tenant_id,
        ordering_key: row.ordering_key,
        attempt: row.attempts.saturating_add(1),
        consumers: missing,
    };
    let flight = InFlight {
        token: token.clone(),
        lease_until,
        event_key: row.event_key,
        attempts: row.attempts,
    };
    step.claimed.push((job, flight));
    Ok(())
}

/// The consumers an event type routes to, cached per type.
fn route(
    routes: &mut HashMap<String, Arc<[usize]>>,
    consumers: &[ConsumerEntry],
    envelope: Option<&crate::envelope::Envelope>,
) -> Arc<[usize]> {
    let Some(env) = envelope else {
        return Arc::from([]);
    };
    let event_type = env.event_type.as_str();
    if let Some(r) = routes.get(event_type) {
        return r.clone();
    }
    let r: Arc<[usize]> = consumers
        .iter()
        .enumerate()
        .filter(|(_, c)| c.patterns.iter().any(|p| p.matches(event_type)))
        .map(|(i, _)| i)
        .collect();
    if routes.len() > 10_000 {
        routes.clear();
    }
    routes.insert(event_type.to_string(), r.clone());
    r
}

/// Records one job's outcome. The row's own update is fenced by the token
/// and made first; the consumers' progress is written only when it took, so
/// a relay that lost its lease records nothing at all.
fn record(
    tx: &Connection,
    consumers: &[ConsumerEntry],
    in_flight: &HashMap<i64, InFlight>,
    o: &JobOutcome,
    now: Timestamp,
    step: &mut Step,
) -> rusqlite::Result<()> {
    let Some(flight) = in_flight.get(&o.row_id) else {
        return Ok(());
    };
    let mut poison: Option<String> = None;
    let mut retries: Vec<(usize, &str, Option<Duration>)> = Vec::new();
    for (i, outcome) in &o.results {
        match outcome {
            Outcome::Delivered => {}
            Outcome::Retry { reason, after } => retries.push((*i, reason, *after)),
            Outcome::Poison { reason } => {
                poison.get_or_insert_with(|| {
                    format!(
                        "consumer {} rejected it as poison: {reason}",
                        consumers[*i].name
                    )
                });
            }
        }
    }
    let (kept, counter) = if let Some(reason) = poison {
        let kept = claim::dead_letter(tx, o.row_id, &o.token, clip(&reason), now, false)?;
        (kept, &mut step.counts.dead)
    } else if retries.is_empty() {
        let kept = claim::finish_delivered(tx, o.row_id, &o.token, now)?;
        (kept, &mut step.counts.delivered)
    } else {
        let failures = flight.attempts + 1;
        let reason = retries
            .iter()
            .map(|(i, r, _)| format!("consumer {}: {r}", consumers[*i].name))
            .collect::<Vec<_>>()
            .join("; ");
        // Each retrying consumer waits at least its own schedule; when any
        // has spent its attempts, the event is dead-lettered.
        let mut wait = Some(Duration::ZERO);
        for (i, _, after) in &retries {
            wait = match (
                wait,
                consumers[*i]
                    .retry
                    .delay_with_jitter(failures, rand::random()),
            ) {
                (Some(w), Some(d)) => Some(w.max(d).max(after.unwrap_or_default())),
                _ => None,
            };
        }
        match wait {
            Some(wait) => {
                let at = now.plus(wait);
                step.next_due = Some(step.next_due.map_or(at, |t| t.min(at)));
                let kept = claim::schedule_retry(tx, o.row_id, &o.token, at, clip(&reason))?;
                (kept, &mut step.counts.retried)
            }
            None => {
                let reason = format!("gave up after {failures} attempts: {reason}");
                let kept = claim::dead_letter(tx, o.row_id, &o.token, clip(&reason), now, true)?;
                (kept, &mut step.counts.dead)
            }
        }
    };
    if !kept {
        tracing::warn!(
            row_id = o.row_id,
            "outcome refused: the lease passed to another relay"
        );
        step.counts.fenced += 1;
        return Ok(());
    }
    *counter += 1;
    for (i, outcome) in &o.results {
        let result = match outcome {
            Outcome::Delivered => {
                claim::record_progress(tx, &flight.event_key, &consumers[*i].name, o.row_id, now)?;
                0
            }
            Outcome::Retry { .. } => 1,
            Outcome::Poison { .. } => 2,
        };
        step.counts.per_consumer.push((*i, result));
    }
    Ok(())
}

fn clip(s: &str) -> &str {
    if s.len() <= MAX_REASON_BYTES {
        return s;
    }
    let mut end = MAX_REASON_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}

/// Due events older than the threshold (counted up to a bound), and the
/// due time of the oldest due event. Events delayed on purpose are not due,
/// so they never count.
fn stale(
    conn: &Connection,
    now: Timestamp,
    after: Duration,
) -> rusqlite::Result<(u64, Option<Timestamp>)> {
    let cutoff = now.as_millis() - after.as_millis() as i64;
    let count: i64 = conn.query_row(
        "SELECT count(*) FROM (SELECT 1 FROM event_outbox
          WHERE status = 'pending' AND available_at <= ?1 LIMIT 1000000)",
        [cutoff],
        |r| r.get(0),
    )?;
    let oldest: Option<i64> = conn.query_row(
        "SELECT min(available_at) FROM event_outbox WHERE status = 'pending' AND available_at <= ?1",
        [now.as_millis()],
        |r| r.get(0),
    )?;
    Ok((count as u64, oldest.map(Timestamp::from_millis)))
}
