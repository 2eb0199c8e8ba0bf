//! The relay's counters: written by the writer thread, read by the host (or
//! the binary's metrics endpoint) at any time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::availability::Availability;

/// Counters a host can read while the relay runs (see
/// [`RelayHandle::metrics`](super::RelayHandle::metrics)). All counts are
/// since start.
#[derive(Debug)]
pub struct Metrics {
    per_consumer: Vec<(String, ConsumerCounters)>,
    pub(crate) delivered: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) fenced_out: AtomicU64,
    pub(crate) claimed: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) busy_retries: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) claim_micros_total: AtomicU64,
    pub(crate) commit_micros_total: AtomicU64,
    pub(crate) stale_events: AtomicU64,
    pub(crate) oldest_due_ms: AtomicU64,
}

/// One consumer's results, as counters.
#[derive(Debug, Default)]
struct ConsumerCounters {
    delivered: AtomicU64,
    retried: AtomicU64,
    poisoned: AtomicU64,
    availability: Arc<Availability>,
}

/// What one consumer reported for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConsumerResult {
    Delivered,
    Retried,
    Poisoned,
}

/// A copy of the relay's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Events marked delivered (every consumer succeeded).
    pub delivered: u64,
    /// Retries scheduled.
    pub retried: u64,
    /// Events dead-lettered (poison, attempts spent, invalid, unrouted).
    pub dead_lettered: u64,
    /// Outcomes refused because the claim had passed to another relay.
    pub fenced_out: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Write transactions committed.
    pub commits: u64,
    /// Transactions retried after SQLITE_BUSY.
    pub busy_retries: u64,
    /// Write transactions that failed for another reason (and were retried).
    pub errors: u64,
    /// Total time spent in claim statements, in microseconds.
    pub claim_micros_total: u64,
    /// Total time spent in write transactions, in microseconds.
    pub commit_micros_total: u64,
    /// Due events older than the stale threshold at the last check.
    pub stale_events: u64,
    /// Age of the oldest due event at the last check, in milliseconds.
    pub oldest_due_ms: u64,
    /// Each consumer's results, in registration order.
    pub per_consumer: Vec<ConsumerMetrics>,
}

/// One consumer's results since the relay started: each delivery to it
/// counts once, as what the consumer reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConsumerMetrics {
    /// The consumer's name.
    pub name: String,
    /// Deliveries it reported as delivered.
    pub delivered: u64,
    /// Deliveries it asked to retry.
    pub retried: u64,
    /// Deliveries it rejected as poison.
    pub poisoned: u64,
    /// False while its destination is unavailable (the consumer is paused).
    pub available: bool,
    /// How long its destination has been unavailable, in milliseconds (0
    /// while available).
    pub unavailable_ms: u64,
}

impl Metrics {
    pub(crate) fn new(consumers: Vec<String>) -> Metrics {
        let z = || AtomicU64::new(0);
        Metrics {
            per_consumer: consumers
                .into_iter()
                .map(|name| (name, ConsumerCounters::default()))
                .collect(),
            delivered: z(),
            retried: z(),
            dead_lettered: z(),
            fenced_out: z(),
            claimed: z(),
            commits: z(),
            busy_retries: z(),
            errors: z(),
            claim_micros_total: z(),
            commit_micros_total: z(),
            stale_events: z(),
            oldest_due_ms: z(),
        }
    }

    /// Reads each consumer's availability from `list` (in registration
    /// order).
    pub(crate) fn with_availability(mut self, list: Vec<Arc<Availability>>) -> Metrics {
        for ((_, c), a) in self.per_consumer.iter_mut().zip(list) {
            c.availability = a;
        }
        self
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let now = Instant::now();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            delivered: g(&self.delivered),
            retried: g(&self.retried),
            dead_lettered: g(&self.dead_lettered),
            fenced_out: g(&self.fenced_out),
            claimed: g(&self.claimed),
            commits: g(&self.commits),
            busy_retries: g(&self.busy_retries),
            errors: g(&self.errors),
            claim_micros_total: g(&self.claim_micros_total),
            commit_micros_total: g(&self.commit_micros_total),
            stale_events: g(&self.stale_events),
            oldest_due_ms: g(&self.oldest_due_ms),
            per_consumer: self
                .per_consumer
                .iter()
                .map(|(name, c)| {
                    let down = c.availability.unavailable_for(now);
                    ConsumerMetrics {
                        name: name.clone(),
                        delivered: g(&c.delivered),
                        retried: g(&c.retried),
                        poisoned: g(&c.poisoned),
                        available: down.is_none(),
                        unavailable_ms: down.map_or(0, |d| d.as_millis() as u64),
                    }
                })
                .collect(),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    /// Counts one consumer's result, by the consumer's index.
    pub(crate) fn count_result(&self, consumer: usize, result: ConsumerResult) {
        let c = &self.per_consumer[consumer].1;
        let counter = match result {
            ConsumerResult::Delivered => &c.delivered,
            ConsumerResult::Retried => &c.retried,
            ConsumerResult::Poisoned => &c.poisoned,
        };
        Metrics::add(counter, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_consumer_results_land_in_their_named_counters() {
        let m = Metrics::new(vec!["a".into(), "b".into()]);
        m.count_result(1, ConsumerResult::Retried);
        m.count_result(1, ConsumerResult::Retried);
        m.count_result(1, ConsumerResult::Poisoned);
        m.count_result(0, ConsumerResult::Delivered);
        let s = m.snapshot();
        assert_eq!(
            s.per_consumer,
            [
                ConsumerMetrics {
                    name: "a".into(),
                    delivered: 1,
                    retried: 0,
                    poisoned: 0,
                    available: true,
                    unavailable_ms: 0
                },
                ConsumerMetrics {
                    name: "b".into(),
                    delivered: 0,
                    retried: 2,
                    poisoned: 1,
                    available: true,
                    unavailable_ms: 0
                }
            ]
        );
    }
}
