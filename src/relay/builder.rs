//! The relay's builder: its settings, their defaults, and the validation
//! that makes a [`Relay`].

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::consumers::{ConsumerEntry, ConsumerKind};
use super::settings::{check_duration, check_range, validate_consumer_name, Settings};
use super::{Relay, RetryPolicy, UnroutedPolicy};
use crate::clock::{Clock, SystemClock};
use crate::consumer::{Consumer, TransactionalConsumer};
use crate::error::{Result, Setting, SettingError};
use crate::limits::{
    DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, DEFAULT_FLUSH_INTERVAL, DEFAULT_HOUSEKEEPING_INTERVAL,
    DEFAULT_LEASE, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_POLL_INTERVAL, DEFAULT_STALE_AFTER,
    MAX_BATCH_SIZE, MAX_FLUSH_INTERVAL, MAX_HOUSEKEEPING_INTERVAL, MAX_LEASE, MAX_PAYLOAD_BYTES,
    MAX_POLL_INTERVAL, MAX_WORKERS, MIN_HOUSEKEEPING_INTERVAL, MIN_LEASE, MIN_POLL_INTERVAL,
};
use crate::purge::PurgePolicy;
use crate::router::{Pattern, Routes};

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
    /// dead-lettered without being loaded, its size in the reason. The
    /// relay's peak stays under 3x the larger of this and
    /// [`batch_bytes`](Self::batch_bytes), above its baseline: a delivery
    /// holds one copy of its payload and the sink at most two more (SQLite
    /// needs twice a payload for a moment to claim its row). Keep the memory
    /// the relay may use above that.
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
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting), whose [`SettingError`] names it (and the
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
                availability: Default::default(),
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
}
