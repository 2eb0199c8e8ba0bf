//! The relay: claims due events, delivers them to their consumers on a pool
//! of worker threads, and records the outcomes.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! use outboxd::{enqueue, Delivery, Event, Outcome, Relay};
//! use std::time::Duration;
//!
//! let mut conn = outboxd::connection::open(&path)?;
//! outboxd::schema::migrate(&mut conn)?;
//!
//! let (seen_tx, seen) = crossbeam_channel::unbounded();
//! let relay = Relay::builder(&path)
//!     .consumer("indexer", ["article.*.v1"], move |d: &Delivery| {
//!         seen_tx.send(d.envelope.event_id).unwrap();
//!         Outcome::Delivered
//!     })
//!     .workers(2)
//!     .build()?
//!     .start()?;
//!
//! let tx = conn.transaction().unwrap();
//! let id = enqueue(&tx, &Event::new("article.created.v1", &7)?)?.event_id();
//! tx.commit().unwrap();
//! relay.notify(); // a producer in the same process wakes the relay at once
//!
//! assert_eq!(seen.recv_timeout(Duration::from_secs(10)).unwrap(), id);
//! relay.shutdown(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! ## Threads and channels
//!
//! [`Relay::start`] starts the **workers** and then one **writer** thread,
//! which owns the relay's only write connection; if any thread cannot
//! start, nothing is left running and `start` fails.
//!
//! - The writer claims batches of due rows and sends one job per row into a
//!   bounded `jobs` channel. It claims no more rows than that channel
//!   holds, so its sends never block.
//! - Workers take jobs, run the consumers (catching panics) and send the
//!   outcomes back on the unbounded `outcomes` channel, so a worker never
//!   blocks either. A worker that has more jobs waiting holds its outcomes
//!   briefly and sends them as a group, so the writer wakes once per group.
//!   Workers never write to SQLite, with one exception: a transactional
//!   consumer runs inside a transaction on its worker's own connection,
//!   holding SQLite's write lock while it runs (`transactional`).
//! - The writer records the outcomes gathered so far, extends leases that
//!   are half spent, and claims the next batch, all in one `BEGIN
//!   IMMEDIATE` transaction (group commit).
//! - A `control` channel carries `notify` and `shutdown` from the handle.
//! - A **checkpoint** thread, started with the writer and on its own
//!   connection, copies the WAL back into the database file when the
//!   writer's commits have grown it (`checkpoint`), so those copies and
//!   their fsyncs do not sit between a commit and the next claim.
//!
//! While another connection is writing (seen through `data_version`), the
//! writer's transactions carry at most 16 rows, and after a full one it
//! leaves the lock free for a millisecond, so a host's commit waits for one
//! short transaction rather than a train of them.
//!
//! Shutdown: the writer stops claiming, takes the jobs no worker has started
//! back out of the channel and releases their leases, drops the jobs sender
//! (so each worker ends after its current job), records the outcomes that
//! arrive within the grace period, releases whatever is still leased after
//! it, and ends.
//!
//! ## Where each decision lives
//!
//! - `writer`: the thread, its state and the SQL transaction; no policy.
//! - `plan`: whether to write now, and what (claim, record, heartbeat).
//! - [`router`](crate::router): which consumers take a claimed row, and what
//!   happens to one nobody takes ([`UnroutedPolicy`]).
//! - [`dedup`](crate::dedup): which of them had the event already.
//! - `retry`: [`RetryPolicy`] and the verdict over a row's outcomes
//!   (delivered, retry when, or dead letter and why).
//! - `housekeeping`: purge ticks, the stale check.
//! - `checkpoint`: WAL checkpoints on a thread of their own, off the
//!   writer's commits.
//! - `clock_step`: noticing a step of the system clock, and the repair of
//!   the leases and retry times it left far ahead.
//! - `claim`: the claim (find, read and stamp due rows) and the token-fenced writes.
//! - `worker`: running consumers.
//! - `transactional`: a transactional consumer's transaction (claim check,
//!   ledger entry, commit or rollback), on its worker's connection.
//! - `metrics`: the counters behind [`RelayHandle::metrics`].

mod checkpoint;
pub(crate) mod claim;
mod clock_step;
mod housekeeping;
mod job;
mod metrics;
mod panic;
mod plan;
mod retry;
mod transactional;
mod wake;
mod worker;
mod writer;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

pub use crate::router::UnroutedPolicy;
pub use metrics::{ConsumerMetrics, Metrics, MetricsSnapshot};
pub use retry::RetryPolicy;
// The 0.1 paths of the bounds and defaults, which live in `crate::limits`.
pub use crate::limits::{
    DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, DEFAULT_DROP_GRACE, DEFAULT_FLUSH_INTERVAL,
    DEFAULT_HOUSEKEEPING_INTERVAL, DEFAULT_JITTER, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_POLL_INTERVAL, DEFAULT_RETRY_INITIAL,
    DEFAULT_RETRY_MAX_DELAY, DEFAULT_STALE_AFTER, MAX_BATCH_SIZE, MAX_FLUSH_INTERVAL,
    MAX_HOUSEKEEPING_INTERVAL, MAX_LEASE, MAX_PAYLOAD_BYTES, MAX_POLL_INTERVAL, MAX_RETRY_ATTEMPTS,
    MAX_RETRY_DELAY, MAX_WORKERS, MIN_HOUSEKEEPING_INTERVAL, MIN_LEASE, MIN_POLL_INTERVAL,
};

use crate::clock::{Clock, SystemClock};
use crate::consumer::{Consumer, TransactionalConsumer};
use crate::error::{Error, Result, Setting, SettingError};
use crate::purge::PurgePolicy;
use crate::router::{Pattern, Routes};

/// A registered consumer, as the workers run it.
pub(crate) struct ConsumerEntry {
    pub name: String,
    pub consumer: ConsumerKind,
    pub retry: RetryPolicy,
}

/// How a consumer is run.
pub(crate) enum ConsumerKind {
    /// On its own: [`Consumer::deliver`].
    Plain(Box<dyn Consumer>),
    /// Inside a transaction on the worker's connection ([`transactional`]).
    Transactional(Box<dyn TransactionalConsumer>),
}

/// The relay's validated settings.
pub(crate) struct Settings {
    pub path: PathBuf,
    pub workers: usize,
    pub batch_size: usize,
    pub batch_bytes: u64,
    pub max_payload_bytes: u64,
    pub lease: Duration,
    pub poll_interval: Duration,
    /// Watch the `-wal` file for other connections' commits.
    pub watch_wal: bool,
    pub flush_interval: Duration,
    pub housekeeping_interval: Duration,
    pub stale_after: Duration,
    pub purge: Option<PurgePolicy>,
}

/// Builds a [`Relay`]. Every setting has a named default; [`build`]
/// validates them all and returns an error naming the first bad one.
///
/// [`build`]: RelayBuilder::build
#[must_use = "a builder does nothing until build() is called"]
pub struct RelayBuilder {
    path: PathBuf,
    consumers: Vec<(String, Vec<String>, ConsumerKind)>,
    retry: RetryPolicy,
    retry_overrides: Vec<(String, RetryPolicy)>,
    workers: Option<usize>,
    batch_size: usize,
    batch_bytes: u64,
    max_payload_bytes: u64,
    lease: Duration,
    poll_interval: Duration,
    watch_wal: bool,
    flush_interval: Duration,
    housekeeping_interval: Duration,
    stale_after: Duration,
    purge: Option<PurgePolicy>,
    unrouted: UnroutedPolicy,
    clock: Arc<dyn Clock>,
}

impl RelayBuilder {
    /// Registers a consumer under a unique name for the event types it
    /// takes: exact types or patterns (see [`Pattern`]).
    pub fn consumer<I, S>(self, name: &str, types: I, consumer: impl Consumer) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.add(name, types, ConsumerKind::Plain(Box::new(consumer)))
    }

    /// Registers a transactional consumer: its function runs inside a
    /// `BEGIN IMMEDIATE` transaction on the relay's database, which outboxd
    /// commits together with the consumer's progress row only while this
    /// relay still holds the event's claim, and rolls back on a retry, a
    /// poison or a panic. Its effect therefore happens exactly once, even
    /// across crashes. See [`TransactionalConsumer`] for what the function
    /// may do, and docs/exactly-once.md.
    ///
    /// ```
    /// # fn main() -> outboxd::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("app.db");
    /// use outboxd::{enqueue, Delivery, Event, Outcome, Relay};
    /// use std::time::Duration;
    ///
    /// let mut conn = outboxd::connection::open(&path)?;
    /// outboxd::schema::migrate(&mut conn)?;
    /// conn.execute_batch("CREATE TABLE views (article INTEGER PRIMARY KEY, n INTEGER NOT NULL)").unwrap();
    ///
    /// let relay = Relay::builder(&path)
    ///     .transactional_consumer("views", ["article.viewed.v1"],
    ///         |tx: &rusqlite::Transaction<'_>, d: &Delivery| {
    ///             let article: i64 = match d.envelope.payload_as() {
    ///                 Ok(id) => id,
    ///                 Err(e) => return Outcome::poison(format!("not an article id: {e}")),
    ///             };
    ///             match tx.execute(
    ///                 "INSERT INTO views VALUES (?1, 1) ON CONFLICT (article) DO UPDATE SET n = n + 1",
    ///                 [article],
    ///             ) {
    ///                 Ok(_) => Outcome::Delivered,
    ///                 Err(e) => Outcome::retry(e.to_string()),
    ///             }
    ///         })
    ///     .build()?
    ///     .start()?;
    ///
    /// let tx = conn.transaction().unwrap();
    /// enqueue(&tx, &Event::new("article.viewed.v1", &7)?)?;
    /// tx.commit().unwrap();
    /// relay.notify();
    ///
    /// let deadline = std::time::Instant::now() + Duration::from_secs(10);
    /// let views = || conn.query_row("SELECT count(*) FROM views WHERE n = 1", [], |r| r.get::<_, i64>(0)).unwrap();
    /// while views() == 0 && std::time::Instant::now() < deadline {
    ///     std::thread::sleep(Duration::from_millis(5));
    /// }
    /// assert_eq!(views(), 1);
    /// relay.shutdown(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn transactional_consumer<I, S>(
        self,
        name: &str,
        types: I,
        consumer: impl TransactionalConsumer,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.add(name, types, ConsumerKind::Transactional(Box::new(consumer)))
    }

    fn add<I, S>(mut self, name: &str, types: I, consumer: ConsumerKind) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let types = types.into_iter().map(|s| s.as_ref().to_string()).collect();
        self.consumers.push((name.to_string(), types, consumer));
        self
    }

    /// The retry policy of every consumer without its own.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// A retry policy for one consumer, by name.
    pub fn retry_policy_for(mut self, consumer: &str, policy: RetryPolicy) -> Self {
        self.retry_overrides.push((consumer.to_string(), policy));
        self
    }

    /// Worker threads that run consumers (default: the available cores).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Rows claimed per transaction, and the most deliveries in flight
    /// (default [`DEFAULT_BATCH_SIZE`]).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// The most payload bytes the relay holds in deliveries at once
    /// (default [`DEFAULT_BATCH_BYTES`]): a claim takes rows only while
    /// their payloads fit in what is left, so a batch of large foreign
    /// payloads cannot exhaust memory. A relay with nothing in flight still
    /// takes one row, whatever its size (up to
    /// [`max_payload_bytes`](Self::max_payload_bytes)), so no row is stuck.
    /// Sizes are measured in SQL, without loading the payloads.
    pub fn batch_bytes(mut self, n: u64) -> Self {
        self.batch_bytes = n;
        self
    }

    /// The largest payload the relay loads (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`]). A row whose payload is larger is
    /// dead-lettered without being loaded, its size in the reason. Keep it
    /// a few times below the memory the relay may use: a delivery holds the
    /// payload, its envelope and the sink's copy.
    pub fn max_payload_bytes(mut self, n: u64) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// The lease of a claim (default [`DEFAULT_LEASE`]; [`MIN_LEASE`] to
    /// [`MAX_LEASE`]). The relay renews the leases of its deliveries every
    /// half lease of its own monotonic clock, so a step of the system clock
    /// does not leave them ending far away.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }

    /// How often the relay looks for other connections' commits when no
    /// file-system notification comes (default [`DEFAULT_POLL_INTERVAL`],
    /// 1 s). On Linux a notification on the `-wal` file wakes the relay at
    /// once; this floor matters on file systems that send none.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// Whether the relay watches the database's `-wal` file for other
    /// connections' commits (default true; where the platform or file
    /// system has no notification, the relay falls back to
    /// [`poll_interval`](Self::poll_interval) on its own). Off, it looks
    /// only every poll interval: for a file system whose notifications
    /// misbehave, or to measure the difference.
    pub fn watch_wal(mut self, on: bool) -> Self {
        self.watch_wal = on;
        self
    }

    /// The longest an outcome waits to be committed with others (default
    /// [`DEFAULT_FLUSH_INTERVAL`]).
    pub fn flush_interval(mut self, d: Duration) -> Self {
        self.flush_interval = d;
        self
    }

    /// How often purge, checkpoint and the stale check run (default
    /// [`DEFAULT_HOUSEKEEPING_INTERVAL`]).
    pub fn housekeeping_interval(mut self, d: Duration) -> Self {
        self.housekeeping_interval = d;
        self
    }

    /// The age of the oldest due event that raises the stale alert (default
    /// [`DEFAULT_STALE_AFTER`]).
    pub fn stale_after(mut self, d: Duration) -> Self {
        self.stale_after = d;
        self
    }

    /// The TTL purge the relay runs in its housekeeping (default
    /// [`PurgePolicy::default`]); None turns it off.
    pub fn purge(mut self, policy: Option<PurgePolicy>) -> Self {
        self.purge = policy;
        self
    }

    /// What to do with events no consumer takes (default: dead-letter).
    pub fn unrouted(mut self, policy: UnroutedPolicy) -> Self {
        self.unrouted = policy;
        self
    }

    /// The clock (default: the system clock; tests pass a
    /// [`ManualClock`](crate::ManualClock)).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Validates every setting. A bad one is reported as
    /// [`Error::InvalidSetting`], whose [`SettingError`] names it (and the
    /// consumer, for a consumer's own setting).
    pub fn build(self) -> Result<Relay> {
        let workers = self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        check_range(Setting::Workers, workers, 1, MAX_WORKERS)?;
        check_range(Setting::BatchSize, self.batch_size, 1, MAX_BATCH_SIZE)?;
        if self.batch_bytes == 0 {
            return Err(SettingError::new(
                Setting::BatchBytes,
                "must be at least 1 byte, such as 8388608 (8 MiB)",
            )
            .into());
        }
        check_range(
            Setting::MaxPayloadBytes,
            self.max_payload_bytes,
            1,
            MAX_PAYLOAD_BYTES,
        )?;
        check_duration(Setting::Lease, self.lease, MIN_LEASE, MAX_LEASE)?;
        check_duration(
            Setting::PollInterval,
            self.poll_interval,
            MIN_POLL_INTERVAL,
            MAX_POLL_INTERVAL,
        )?;
        check_duration(
            Setting::FlushInterval,
            self.flush_interval,
            Duration::ZERO,
            MAX_FLUSH_INTERVAL,
        )?;
        check_duration(
            Setting::HousekeepingInterval,
            self.housekeeping_interval,
            MIN_HOUSEKEEPING_INTERVAL,
            MAX_HOUSEKEEPING_INTERVAL,
        )?;
        if self.stale_after.is_zero() {
            return Err(SettingError::new(
                Setting::StaleAfter,
                "must be longer than zero, such as 5 minutes",
            )
            .into());
        }
        if self.consumers.is_empty() {
            return Err(SettingError::new(
                Setting::Consumers,
                "no consumer is registered; register at least one",
            )
            .into());
        }
        self.retry.validate()?;
        if let Some(p) = &self.purge {
            p.validate()?;
        }
        let mut names = HashSet::new();
        let mut consumers = Vec::with_capacity(self.consumers.len());
        let mut patterns = Vec::with_capacity(self.consumers.len());
        for (position, (name, types, consumer)) in self.consumers.into_iter().enumerate() {
            validate_consumer_name(&name).map_err(|e| e.consumer_at(position))?;
            if !names.insert(name.clone()) {
                return Err(SettingError::new(
                    Setting::ConsumerName,
                    format!("{name:?} is registered twice; names must be unique"),
                )
                .for_consumer(&name)
                .consumer_at(position)
                .into());
            }
            if types.is_empty() {
                return Err(SettingError::new(
                    Setting::ConsumerTypes,
                    "takes no event types; list event types or patterns such as \
                     article.*.v1, or * for every type",
                )
                .for_consumer(&name)
                .consumer_at(position)
                .into());
            }
            let parsed = types
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    Pattern::parse(t).map_err(|e| {
                        SettingError::new(Setting::ConsumerTypes, e.to_string())
                            .for_consumer(&name)
                            .consumer_at(position)
                            .at(i)
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            patterns.push(parsed);
            consumers.push(ConsumerEntry {
                name,
                consumer,
                retry: self.retry.clone(),
            });
        }
        for (name, policy) in self.retry_overrides {
            let found = consumers
                .iter_mut()
                .enumerate()
                .find(|(_, c)| c.name == name);
            let Some((position, entry)) = found else {
                return Err(SettingError::new(
                    Setting::RetryPolicyFor,
                    format!("no consumer is named {name:?}"),
                )
                .for_consumer(&name)
                .into());
            };
            policy
                .validate()
                .map_err(|e| e.for_consumer(&name).consumer_at(position))?;
            entry.retry = policy;
        }
        Ok(Relay {
            settings: Settings {
                path: self.path,
                workers,
                batch_size: self.batch_size,
                batch_bytes: self.batch_bytes,
                max_payload_bytes: self.max_payload_bytes,
                lease: self.lease,
                poll_interval: self.poll_interval,
                watch_wal: self.watch_wal,
                flush_interval: self.flush_interval,
                housekeeping_interval: self.housekeeping_interval,
                stale_after: self.stale_after,
                purge: self.purge,
            },
            consumers,
            routes: Routes::new(patterns, self.unrouted),
            clock: self.clock,
        })
    }
}

/// Checks a consumer name: 1 to 128 characters of A-Z, a-z, 0-9, `_`, `-`
/// and `.`. [`RelayBuilder::build`] applies it to every consumer.
///
/// ```
/// use outboxd::relay::validate_consumer_name;
/// assert!(validate_consumer_name("search-index.v2").is_ok());
/// assert!(validate_consumer_name("search index").is_err());
/// ```
pub fn validate_consumer_name(name: &str) -> std::result::Result<(), SettingError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if name.is_empty() || name.len() > 128 || !name.bytes().all(allowed) {
        return Err(SettingError::new(
            Setting::ConsumerName,
            format!(
                "{name:?} is not allowed; use 1 to 128 characters of A-Z, a-z, 0-9, _, - and ."
            ),
        )
        .for_consumer(name));
    }
    Ok(())
}

fn check_range<T: PartialOrd + std::fmt::Display>(
    setting: Setting,
    n: T,
    lo: T,
    hi: T,
) -> Result<()> {
    if n < lo || n > hi {
        return Err(SettingError::new(
            setting,
            format!("{n} is out of range; allowed: {lo} to {hi}"),
        )
        .into());
    }
    Ok(())
}

fn check_duration(setting: Setting, d: Duration, lo: Duration, hi: Duration) -> Result<()> {
    if d < lo || d > hi {
        return Err(SettingError::new(
            setting,
            format!(
                "{} is out of range; allowed: {} to {}",
                crate::text::duration(d),
                crate::text::duration(lo),
                crate::text::duration(hi)
            ),
        )
        .into());
    }
    Ok(())
}

/// A configured relay, ready to [`start`](Relay::start).
#[must_use = "a relay does nothing until it is started"]
pub struct Relay {
    settings: Settings,
    consumers: Vec<ConsumerEntry>,
    routes: Routes,
    clock: Arc<dyn Clock>,
}

impl Relay {
    /// A builder for a relay on the database at `path`.
    pub fn builder(path: impl Into<PathBuf>) -> RelayBuilder {
        RelayBuilder {
            path: path.into(),
            consumers: Vec::new(),
            retry: RetryPolicy::default(),
            retry_overrides: Vec::new(),
            workers: None,
            batch_size: DEFAULT_BATCH_SIZE,
            batch_bytes: DEFAULT_BATCH_BYTES,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            lease: DEFAULT_LEASE,
            poll_interval: DEFAULT_POLL_INTERVAL,
            watch_wal: true,
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            housekeeping_interval: DEFAULT_HOUSEKEEPING_INTERVAL,
            stale_after: DEFAULT_STALE_AFTER,
            purge: Some(PurgePolicy::default()),
            unrouted: UnroutedPolicy::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Opens the write connection, checks the schema is current, and starts
    /// the worker threads and the writer thread. Fails, with nothing left
    /// running, when the database cannot be used or a thread cannot be
    /// started ([`Error::Spawn`]).
    pub fn start(self) -> Result<RelayHandle> {
        let Relay {
            settings,
            consumers,
            routes,
            clock,
        } = self;
        let metrics = Arc::new(Metrics::new(
            consumers.iter().map(|c| c.name.clone()).collect(),
        ));
        let (control_tx, control_rx) = crossbeam_channel::bounded(64);
        let (workers, flush_interval) = (settings.workers, settings.flush_interval);
        let path = Arc::new(settings.path.clone());
        let consumers = Arc::new(consumers);
        let writer = writer::Writer::open(
            settings,
            consumers.clone(),
            routes,
            clock.clone(),
            metrics.clone(),
            control_rx,
        )?;
        // The writer claims no more rows than this channel holds, so its
        // sends never block; outcomes are unbounded, so a worker never blocks.
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded(writer.capacity());
        let (outcomes_tx, outcomes_rx) = crossbeam_channel::unbounded();
        let mut pool = Vec::with_capacity(workers);
        for n in 0..workers {
            let (consumers, jobs, outcomes) =
                (consumers.clone(), jobs_rx.clone(), outcomes_tx.clone());
            let session = transactional::Session::new(path.clone(), clock.clone());
            let spawned = spawn(format!("outboxd-worker-{n}"), move || {
                worker::run(consumers, jobs, outcomes, flush_interval, session)
            });
            match spawned {
                Ok(handle) => pool.push(handle),
                Err(e) => {
                    // A relay short of workers would claim rows it cannot
                    // deliver: stop the ones started (they end when the jobs
                    // channel closes) and report.
                    drop(jobs_tx);
                    for handle in pool {
                        let _ = handle.join();
                    }
                    return Err(e);
                }
            }
        }
        drop(outcomes_tx);
        let pool = writer::Pool {
            jobs: jobs_tx,
            unstarted: jobs_rx,
            outcomes: outcomes_rx,
            workers: pool,
        };
        // If this spawn fails, the closure (and with it the jobs sender) is
        // dropped, and the workers end on their own.
        let thread = spawn(WRITER_THREAD.into(), move || writer.run(pool))?;
        Ok(RelayHandle {
            control: control_tx,
            thread: Some(thread),
            metrics,
        })
    }
}

/// The writer thread's name.
const WRITER_THREAD: &str = "outboxd-writer";

/// Starts a named thread of the relay.
fn spawn<T, F>(name: String, f: F) -> Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    #[cfg(test)]
    if tests::spawn_fails(&name) {
        return Err(Error::Spawn {
            thread: name,
            source: std::io::Error::other("refused by the test"),
        });
    }
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| Error::Spawn {
            thread: name,
            source,
        })
}

/// Messages from the handle to the writer.
pub(crate) enum Control {
    Notify,
    Shutdown(Duration),
}

/// A running relay. Dropping it shuts the relay down with
/// [`DEFAULT_DROP_GRACE`] and waits for it: keep it for as long as the
/// relay should run.
#[must_use = "dropping the handle stops the relay at once"]
pub struct RelayHandle {
    control: Sender<Control>,
    thread: Option<JoinHandle<Result<()>>>,
    metrics: Arc<Metrics>,
}

impl RelayHandle {
    /// Wakes the relay to claim at once: call it after committing events in
    /// the same process. Cheap, and never blocks.
    pub fn notify(&self) {
        let _ = self.control.try_send(Control::Notify);
    }

    /// Stops claiming, lets in-flight deliveries finish within `grace`,
    /// records their outcomes, releases the rest, and waits for the threads.
    pub fn shutdown(mut self, grace: Duration) -> Result<()> {
        let _ = self.control.send(Control::Shutdown(grace));
        self.join_inner()
    }

    /// Waits for the relay to stop without asking it to. The writer ends by
    /// itself only when it fails ([`Error::Panicked`]): pair it with
    /// [`is_finished`](Self::is_finished) to notice a relay that died.
    pub fn join(mut self) -> Result<()> {
        self.join_inner()
    }

    /// True once the relay's writer thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// The relay's counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// A shared view of the counters, for a metrics endpoint that outlives
    /// borrows of the handle.
    pub fn metrics_source(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn join_inner(&mut self) -> Result<()> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|panic| {
                Err(Error::Panicked {
                    thread: WRITER_THREAD.into(),
                    message: panic::panic_message(&*panic),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.control.send(Control::Shutdown(DEFAULT_DROP_GRACE));
            let _ = self.join_inner();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::consumer::{Delivery, Outcome};

    thread_local! {
        /// The thread whose start `Relay::start` on this thread fails.
        static REFUSE: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    pub(super) fn spawn_fails(name: &str) -> bool {
        REFUSE.with(|r| r.borrow().as_deref() == Some(name))
    }

    /// A row the writer finishes without a delivery (no consumer takes its
    /// type, skipped; or every consumer has it) is checked whole there, as
    /// one going to a worker is checked on the worker: an invalid payload
    /// or tenant is dead-lettered with its reason either way, never marked
    /// delivered.
    #[test]
    fn an_invalid_row_is_dead_lettered_whether_or_not_a_worker_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        let mut conn = crate::connection::open(&path).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_type, payload) VALUES (1, 'a.b.v1', '{oops');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (2, 'x.y.v1', '{oops');
             INSERT INTO event_outbox (id, event_type, payload, tenant_id)
                  VALUES (3, 'x.y.v1', '{}', X'FF');
             INSERT INTO event_outbox (id, event_type, payload, tenant_id)
                  VALUES (4, 'a.b.v1', '{}', X'FF');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (5, 'x.y.v1', '{}');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (6, 'a.b.v1', '{}');",
        )
        .unwrap();
        let (seen_tx, seen) = crossbeam_channel::unbounded();
        let relay = Relay::builder(&path)
            .consumer("a", ["a.*.v1"], move |d: &Delivery| {
                seen_tx.send(d.envelope.payload.get().to_string()).unwrap();
                Outcome::Delivered
            })
            .unrouted(UnroutedPolicy::Skip)
            .poll_interval(Duration::from_millis(1))
            .build()
            .unwrap()
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let pending = || -> i64 {
            conn.query_row(
                "SELECT count(*) FROM event_outbox WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        while pending() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay settles every row"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        relay.shutdown(Duration::from_secs(5)).unwrap();
        let rows: Vec<(i64, String, Option<String>)> = conn
            .prepare("SELECT id, status, last_error FROM event_outbox ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let reason = |i: usize| rows[i].2.clone().unwrap_or_default();
        for (i, needle) in [
            (0, "payload is not valid JSON"),
            (1, "payload is not valid JSON"),
            (2, "tenant_id is not valid UTF-8"),
            (3, "tenant_id is not valid UTF-8"),
        ] {
            assert_eq!(rows[i].1, "dead", "row {}: {rows:?}", i + 1);
            assert!(
                reason(i).starts_with("invalid row: ") && reason(i).contains(needle),
                "row {}: {rows:?}",
                i + 1
            );
        }
        assert_eq!(
            (rows[4].1.as_str(), rows[5].1.as_str()),
            ("delivered", "delivered")
        );
        assert_eq!(
            seen.try_iter().collect::<Vec<_>>(),
            ["{}"],
            "only row 6 reached the consumer"
        );
    }

    /// Regression (issue 10): a worker that could not start was logged and
    /// the relay ran on, claiming and heart-beating rows it had too few
    /// workers for (with none, forever); a writer that could not start was
    /// reported as an invalid setting. Now `start` fails with the thread's
    /// name, and nothing runs.
    #[test]
    fn a_relay_that_cannot_start_a_thread_stops_and_says_which() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut conn = crate::connection::open(&path).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        crate::Enqueuer::new()
            .allow_autocommit(true)
            .enqueue(&conn, &crate::Event::new("a.b.v1", &1).unwrap())
            .unwrap();
        for thread in ["outboxd-worker-0", "outboxd-worker-2", WRITER_THREAD] {
            REFUSE.with(|r| *r.borrow_mut() = Some(thread.to_string()));
            let (seen_tx, seen) = crossbeam_channel::unbounded();
            let started = Relay::builder(&path)
                .consumer("a", ["*"], move |_: &Delivery| {
                    seen_tx.send(()).unwrap();
                    Outcome::Delivered
                })
                .workers(3)
                .build()
                .unwrap()
                .start();
            let Err(Error::Spawn { thread: name, .. }) = &started else {
                panic!("start must fail when {thread} cannot start");
            };
            assert_eq!(name, thread);
            assert!(started.err().unwrap().to_string().contains(thread));
            // Nothing claimed, nothing delivered: the relay never ran.
            let touched: i64 = conn
                .query_row(
                    "SELECT count(*) FROM event_outbox
                      WHERE claim_token IS NOT NULL OR status <> 'pending'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(touched, 0, "{thread}");
            assert!(seen.try_recv().is_err(), "{thread}");
        }
        REFUSE.with(|r| *r.borrow_mut() = None);
    }
}
