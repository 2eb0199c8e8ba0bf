//! The duplicate window: how long JetStream remembers a message id, against
//! how late outboxd may publish an event again.
//!
//! A repeat happens when a publish was stored but its acknowledgement never
//! came back (a timeout, a lost connection, a crash before the outcome was
//! recorded): the event is retried, and JetStream drops the repeat only if
//! it comes within the stream's `duplicate_window` of the stored message.

use std::fmt::Write as _;
use std::time::Duration;

use crate::relay::RetryPolicy;

/// JetStream's duplicate window when a stream does not set one.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The latest a consumer may publish an event again after its first
/// publish, against a stream's duplicate window.
///
/// The horizon is the sum, over every retry the policy allows, of the
/// longest delay (jitter included) and one `ack_timeout` (the wait that
/// ended the attempt before), plus the relay's lease (after a crash, a
/// claimed event is published again once its lease expires).
///
/// ```
/// use outboxd::sinks::nats::DuplicateWindowCheck;
/// use outboxd::RetryPolicy;
/// use std::time::Duration;
/// let policy = RetryPolicy::default().initial(Duration::from_secs(1))
///     .max_delay(Duration::from_secs(4)).max_attempts(3).jitter(0.0);
/// let c = DuplicateWindowCheck::new(&policy, Duration::from_secs(30), Duration::from_secs(5),
///     Duration::from_secs(120));
/// assert_eq!(c.horizon(), Duration::from_secs(30 + (5 + 1) + (5 + 2)));
/// assert!(c.warning("EVENTS", "nats").is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DuplicateWindowCheck {
    duplicate_window: Duration,
    horizon: Duration,
    first_retry: Duration,
    longest_delay: Duration,
    retries: u32,
    lease: Duration,
    ack_timeout: Duration,
}

impl DuplicateWindowCheck {
    /// Compares a consumer's retry policy, the relay's lease and the sink's
    /// ack timeout with a stream's duplicate window.
    pub fn new(
        retry: &RetryPolicy,
        lease: Duration,
        ack_timeout: Duration,
        duplicate_window: Duration,
    ) -> DuplicateWindowCheck {
        let retries = retry.attempts().saturating_sub(1);
        let delays: Vec<Duration> = (1..=retries)
            .filter_map(|n| retry.delay_with_jitter(n, 1.0))
            .collect();
        let horizon = delays
            .iter()
            .fold(lease, |sum, d| sum.saturating_add(*d + ack_timeout));
        DuplicateWindowCheck {
            duplicate_window,
            horizon,
            first_retry: delays.first().map_or(Duration::ZERO, |d| *d + ack_timeout),
            longest_delay: delays.iter().copied().max().unwrap_or(Duration::ZERO),
            retries,
            lease,
            ack_timeout,
        }
    }

    /// The latest a repeat may come after the first publish.
    pub fn horizon(&self) -> Duration {
        self.horizon
    }

    /// The stream's duplicate window.
    pub fn duplicate_window(&self) -> Duration {
        self.duplicate_window
    }

    /// True when every repeat falls inside the window.
    pub fn is_covered(&self) -> bool {
        self.horizon <= self.duplicate_window
    }

    /// The warning to show when a repeat may fall outside the window, with
    /// the numbers and what to change; None when it cannot.
    pub fn warning(&self, stream: &str, consumer: &str) -> Option<String> {
        if self.is_covered() {
            return None;
        }
        let mut s = format!(
            "stream {stream} forgets message ids after {} (its duplicate_window), but consumer \
             {consumer} may publish an event again up to {} after the first publish: {} \
             retries, each after up to {} (the first after {}, the longest delay {}, jitter \
             included), and {} (relay.lease) after a crash; ",
            human(self.duplicate_window),
            crate::clock::format_duration_at_least(self.horizon),
            self.retries,
            format_args!("ack_timeout {} + the retry delay", human(self.ack_timeout)),
            human(self.first_retry),
            human(self.longest_delay),
            human(self.lease),
        );
        if self.first_retry > self.duplicate_window || self.lease > self.duplicate_window {
            s.push_str("even the first repeat can come after the window closes; ");
        }
        let _ = write!(
            s,
            "a repeat after {} is stored twice. Set the stream's duplicate_window to at least {} \
             (create_stream.duplicate_window, or `nats stream edit`), or shorten the consumer's \
             retry schedule (retry.max_attempts, retry.max_delay); downstream consumers should \
             deduplicate on Nats-Msg-Id either way",
            human(self.duplicate_window),
            crate::clock::format_duration_at_least(self.horizon),
        );
        Some(s)
    }
}

pub(crate) use crate::clock::format_duration as human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_outlives_the_default_window_and_says_by_how_much() {
        let c = DuplicateWindowCheck::new(
            &RetryPolicy::default(),
            Duration::from_secs(30),
            Duration::from_secs(5),
            DEFAULT_DUPLICATE_WINDOW,
        );
        // 30+60+120+240+480+960+1920+3600+3600 s = 11010 s, +10% jitter,
        // + 9 × 5 s ack timeouts + 30 s lease.
        assert_eq!(c.horizon(), Duration::from_secs(12_111 + 45 + 30));
        let w = c.warning("EVENTS", "nats").unwrap();
        for needle in [
            "EVENTS",
            "nats",
            "2m",
            "3h 24m",
            "9 retries",
            "relay.lease",
            "38s",
        ] {
            assert!(w.contains(needle), "{needle:?} missing from: {w}");
        }
        assert!(!w.contains("even the first"), "{w}");
    }

    #[test]
    fn a_first_retry_beyond_the_window_is_called_out() {
        let p = RetryPolicy::default()
            .initial(Duration::from_secs(300))
            .jitter(0.0);
        let c = DuplicateWindowCheck::new(
            &p,
            Duration::from_secs(30),
            Duration::from_secs(5),
            DEFAULT_DUPLICATE_WINDOW,
        );
        assert!(c
            .warning("S", "c")
            .unwrap()
            .contains("even the first repeat"));
    }

    #[test]
    fn a_short_schedule_fits() {
        let p = RetryPolicy::default()
            .initial(Duration::from_secs(1))
            .max_delay(Duration::from_secs(10))
            .max_attempts(5)
            .jitter(0.5);
        // 1.5 + 3 + 6 + 12 = 22.5 s of delays, 4 × 2 s, 10 s lease.
        let c = DuplicateWindowCheck::new(
            &p,
            Duration::from_secs(10),
            Duration::from_secs(2),
            Duration::from_secs(60),
        );
        assert_eq!(c.horizon(), Duration::from_millis(40_500));
        assert!(c.is_covered());
        assert!(c.warning("S", "c").is_none());
        let tight = DuplicateWindowCheck::new(
            &p,
            Duration::from_secs(10),
            Duration::from_secs(2),
            Duration::from_secs(40),
        );
        assert!(tight.warning("S", "c").unwrap().contains("40s 500ms"));
    }

    /// The README's suggestion for a broker in the same network.
    #[test]
    fn the_readme_schedule_repeats_within_ten_minutes_and_a_half() {
        let p = RetryPolicy::default()
            .initial(Duration::from_secs(1))
            .max_delay(Duration::from_secs(30))
            .max_attempts(20);
        let c = DuplicateWindowCheck::new(
            &p,
            Duration::from_secs(30),
            Duration::from_secs(5),
            DEFAULT_DUPLICATE_WINDOW,
        );
        assert_eq!(human(c.horizon()), "10m 21s");
    }
}
