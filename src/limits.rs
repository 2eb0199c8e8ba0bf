//! The bounds and defaults of the relay's settings, on the ground floor:
//! the relay, the retry policy, `status` and the binary's config all read
//! them, and none of those modules needs another to know a number.

use std::time::Duration;

/// Rows claimed per transaction by default.
pub const DEFAULT_BATCH_SIZE: usize = 256;
/// The payload bytes a relay holds in its deliveries at most, by default
/// (see [`crate::RelayBuilder::batch_bytes`]): 8 MiB.
pub const DEFAULT_BATCH_BYTES: u64 = 8 << 20;
/// The largest payload a relay loads by default (see
/// [`crate::RelayBuilder::max_payload_bytes`]): 16 MiB, sixteen times what
/// [`Enqueuer`](crate::Enqueuer) accepts by default.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 16 << 20;
/// The largest [`crate::RelayBuilder::max_payload_bytes`]: SQLite's own limit on
/// a value (`SQLITE_MAX_LENGTH`).
pub const MAX_PAYLOAD_BYTES: u64 = 1_000_000_000;
/// The largest [`crate::RelayBuilder::batch_size`].
pub const MAX_BATCH_SIZE: usize = 10_000;
/// The most [`crate::RelayBuilder::workers`].
pub const MAX_WORKERS: usize = 1024;
/// How long a claim holds a row before another relay may take it. Longer
/// deliveries extend it by heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest [`crate::RelayBuilder::lease`].
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// The longest [`crate::RelayBuilder::lease`]: 10 minutes. Deliveries longer than
/// the lease extend it by heartbeat, so a longer lease buys nothing but a
/// longer wait after a crash; and the bound lets a relay, `status` and
/// `doctor` tell a lease the system clock stepped away from (one ending
/// further ahead than any relay could have set it) from a real one.
pub const MAX_LEASE: Duration = Duration::from_secs(600);
/// How often a relay checks `PRAGMA data_version` for commits made by other
/// connections when no file-system notification tells it sooner (the
/// floor). A notification on the database's `-wal` file (inotify on Linux)
/// wakes it within a millisecond; the floor is for file systems that send
/// none, and keeps an idle relay at about one wake-up a second.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest [`crate::RelayBuilder::poll_interval`].
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// The longest [`crate::RelayBuilder::poll_interval`].
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// The longest a finished delivery waits before its outcome is committed
/// (outcomes are grouped into one transaction).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(2);
/// The longest [`crate::RelayBuilder::flush_interval`].
pub const MAX_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How often purge, checkpoint and the stale check run.
pub const DEFAULT_HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);
/// The shortest [`crate::RelayBuilder::housekeeping_interval`].
pub const MIN_HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(1);
/// The longest [`crate::RelayBuilder::housekeeping_interval`].
pub const MAX_HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(86_400);
/// How long a consumer's pause (its destination unavailable) is allowed
/// for when sizing a deduplication window: a repeat after a lost
/// acknowledgement may come this much later than the retry schedule alone
/// allows. A NATS stream outboxd creates without a `duplicate_window`
/// gets the schedule's horizon plus this.
pub const DEFAULT_MAX_PAUSE_FOR_DEDUP: Duration = Duration::from_secs(4 * 3600);
/// The oldest due event may wait this long before the stale alert fires.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(300);
/// The oldest undelivered event (due, being delivered or retrying) may be
/// this old before health says so.
pub const DEFAULT_MAX_UNDELIVERED_AGE: Duration = Duration::from_secs(3600);
/// The grace period a dropped [`crate::RelayHandle`] gives in-flight deliveries
/// (call [`crate::RelayHandle::shutdown`] to choose another).
pub const DEFAULT_DROP_GRACE: Duration = Duration::from_secs(10);

/// First retry delay of the default policy.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(30);
/// Longest retry delay of the default policy.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(3600);
/// Attempts (the first try included) before the default policy dead-letters.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// The most [`crate::RetryPolicy::max_attempts`] accepted.
pub const MAX_RETRY_ATTEMPTS: u32 = 1000;
/// First probe of an unavailable destination (an outcome that spends no
/// attempt): short, so that a failover of a few seconds costs seconds.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait between probes of an unavailable destination.
pub const DEFAULT_PROBE_MAX_INTERVAL: Duration = Duration::from_secs(30);
/// Jitter of the default policy: up to 10% added to each delay.
pub const DEFAULT_JITTER: f64 = 0.1;
/// The longest [`crate::RetryPolicy::max_delay`]: a week. A bound on the retry
/// times a relay can write (at most twice this, with full jitter) lets a
/// relay, `status` and `doctor` tell a retry the system clock stepped away
/// from (a time further ahead than any policy could give) from a real one.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * 86_400);

/// How much later than its setting allows a lease or a retry may end before
/// it counts as a clock step: relays and `status` read the clock at slightly
/// different moments.
pub const CLOCK_STEP_SLACK: Duration = Duration::from_secs(2);
