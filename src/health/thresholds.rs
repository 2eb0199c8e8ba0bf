//! The thresholds a monitor alerts on, with the one set of defaults.

use std::time::Duration;

/// The limits a monitor alerts on. One set of defaults for every surface,
/// with or without a config: stale after 5 minutes, any dead letter, an
/// event undelivered after an hour.
///
/// ```
/// use outboxd::health::Thresholds;
/// use std::time::Duration;
/// let t = Thresholds::new(Duration::from_secs(60), Some(10));
/// assert_eq!(t.max_dead, Some(10));
/// assert_eq!(Thresholds::default().max_dead, Some(0));
/// assert_eq!(Thresholds::default().stale_after, Duration::from_secs(300));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Thresholds {
    /// Unhealthy when the oldest due event has waited longer than this.
    pub stale_after: Duration,
    /// Unhealthy when there are more dead letters than this; None: no limit.
    pub max_dead: Option<u64>,
    /// Unhealthy when the oldest undelivered event (due, being delivered,
    /// or failed at least once) was created longer ago than this: events
    /// waiting for a retry are not due, so `stale_after` does not see them.
    pub max_undelivered_age: Duration,
    /// The longest lease a relay may have set: a lease ending further
    /// ahead is a clock step. Default [`MAX_LEASE`](crate::limits::MAX_LEASE);
    /// a config's own lease is tighter.
    pub max_lease: Duration,
    /// The longest wait a retry may have been given: a retry due further
    /// ahead is a clock step. Default twice
    /// [`MAX_RETRY_DELAY`](crate::limits::MAX_RETRY_DELAY) (the longest delay
    /// with full jitter); a config's own policies are tighter
    /// ([`RetryPolicy::longest_wait`](crate::RetryPolicy::longest_wait)).
    pub max_retry_wait: Duration,
}

/// The default dead-letter limit: any dead letter is a problem.
pub const DEFAULT_MAX_DEAD: u64 = 0;

impl Thresholds {
    /// Thresholds with these limits, and the clock-step bounds of any
    /// relay setting.
    pub fn new(stale_after: Duration, max_dead: Option<u64>) -> Thresholds {
        Thresholds {
            stale_after,
            max_dead,
            max_undelivered_age: crate::limits::DEFAULT_MAX_UNDELIVERED_AGE,
            max_lease: crate::limits::MAX_LEASE,
            max_retry_wait: crate::limits::MAX_RETRY_DELAY * 2,
        }
    }

    /// The same, with another limit on the oldest undelivered event's age.
    ///
    /// ```
    /// use outboxd::health::Thresholds;
    /// use std::time::Duration;
    /// let t = Thresholds::default().max_undelivered_age(Duration::from_secs(600));
    /// assert_eq!(t.max_undelivered_age, Duration::from_secs(600));
    /// assert_eq!(Thresholds::default().max_undelivered_age, Duration::from_secs(3600));
    /// ```
    #[must_use]
    pub fn max_undelivered_age(mut self, age: Duration) -> Thresholds {
        self.max_undelivered_age = age;
        self
    }

    /// The same, with the clock-step bounds of the relays' own settings:
    /// their lease and their retry policies' longest wait.
    ///
    /// ```
    /// use outboxd::health::Thresholds;
    /// use std::time::Duration;
    /// let t = Thresholds::default().relay_settings(Duration::from_secs(30), Duration::from_secs(3960));
    /// assert_eq!(t.max_lease, Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn relay_settings(mut self, lease: Duration, longest_retry_wait: Duration) -> Thresholds {
        self.max_lease = lease;
        self.max_retry_wait = longest_retry_wait;
        self
    }
}

impl Default for Thresholds {
    /// Stale after [`DEFAULT_STALE_AFTER`](crate::limits::DEFAULT_STALE_AFTER)
    /// (5 minutes), any dead letter ([`DEFAULT_MAX_DEAD`]), undelivered after
    /// [`DEFAULT_MAX_UNDELIVERED_AGE`](crate::limits::DEFAULT_MAX_UNDELIVERED_AGE)
    /// (an hour).
    fn default() -> Self {
        Thresholds::new(crate::limits::DEFAULT_STALE_AFTER, Some(DEFAULT_MAX_DEAD))
    }
}
