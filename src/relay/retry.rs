//! The retry rules: each consumer's policy (how long a failed delivery
//! waits, when to give up) and the verdict that combines the outcomes of
//! all the consumers a row was delivered to into one decision for the row.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::consumer::Outcome;
use crate::error::{Setting, SettingError};
use crate::limits::{
    DEFAULT_JITTER, DEFAULT_MAX_ATTEMPTS, DEFAULT_PROBE_INTERVAL, DEFAULT_PROBE_MAX_INTERVAL,
    DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX_DELAY, MAX_RETRY_ATTEMPTS, MAX_RETRY_DELAY,
};

/// When to try a failed delivery again: exponential backoff from `initial`,
/// doubling up to `max_delay`, for at most `max_attempts` attempts in all,
/// with up to `jitter` (a fraction) added at random so that many events
/// failing together do not all come back at once. An unavailable
/// destination ([`Outcome::Unavailable`]) spends no attempt: it is probed
/// again after `probe_interval`, doubling up to `probe_max_interval`, for as
/// long as the outage lasts.
///
/// ```
/// use outboxd::relay::RetryPolicy;
/// use std::time::Duration;
/// let p = RetryPolicy::default().jitter(0.0);
/// assert_eq!(p.delay_after(1), Some(Duration::from_secs(30)));
/// assert_eq!(p.delay_after(2), Some(Duration::from_secs(60)));
/// assert_eq!(p.delay_after(9), Some(Duration::from_secs(3600)));
/// assert_eq!(p.delay_after(10), None); // the 10th failure dead-letters
/// assert_eq!(p.probe_after(1), Duration::from_millis(500));
/// assert_eq!(p.probe_after(100), Duration::from_secs(30)); // never gives up
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    initial: Duration,
    max_delay: Duration,
    max_attempts: u32,
    jitter: f64,
    probe_interval: Duration,
    probe_max_interval: Duration,
}

impl Default for RetryPolicy {
    /// 30 s doubling to 1 h, 10 attempts, 10% jitter; probes of an
    /// unavailable destination 0.5 s doubling to 30 s.
    fn default() -> Self {
        RetryPolicy {
            initial: DEFAULT_RETRY_INITIAL,
            max_delay: DEFAULT_RETRY_MAX_DELAY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            jitter: DEFAULT_JITTER,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            probe_max_interval: DEFAULT_PROBE_MAX_INTERVAL,
        }
    }
}

impl RetryPolicy {
    /// A schedule for receivers that may be down for a day or more, as
    /// webhook senders use: 1 minute doubling to 12 hours, 20 attempts
    /// (the retries span about 5.2 days before jitter, up to 10% more).
    pub fn webhook() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_secs(60),
            max_delay: Duration::from_secs(12 * 3600),
            max_attempts: 20,
            ..RetryPolicy::default()
        }
    }

    /// The first delay.
    #[must_use]
    pub fn initial(mut self, d: Duration) -> Self {
        self.initial = d;
        self
    }

    /// The longest delay.
    #[must_use]
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Attempts in all, the first included; 1 means no retry.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The largest fraction added at random to each delay (0 to 1).
    #[must_use]
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The first wait before probing an unavailable destination again.
    #[must_use]
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d;
        self
    }

    /// The longest wait between probes of an unavailable destination.
    #[must_use]
    pub fn probe_max_interval(mut self, d: Duration) -> Self {
        self.probe_max_interval = d;
        self
    }

    /// The configured attempts in all.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Checks the settings; the relay builder calls it. The error names the
    /// field (`retry.initial`…); the builder adds the consumer's name for a
    /// consumer's own policy.
    pub fn validate(&self) -> Result<(), SettingError> {
        if self.max_attempts == 0 || self.max_attempts > MAX_RETRY_ATTEMPTS {
            return Err(SettingError::new(
                Setting::RetryMaxAttempts,
                format!(
                    "{} is out of range; allowed: 1 to {MAX_RETRY_ATTEMPTS} (1 means no retry)",
                    self.max_attempts
                ),
            ));
        }
        if self.initial.is_zero() {
            return Err(SettingError::new(
                Setting::RetryInitial,
                "must be longer than zero, such as 30 seconds",
            ));
        }
        if self.max_delay < self.initial {
            return Err(SettingError::new(
                Setting::RetryMaxDelay,
                format!(
                    "{} is shorter than retry.initial ({}); allowed: retry.initial or longer",
                    crate::text::duration(self.max_delay),
                    crate::text::duration(self.initial)
                ),
            ));
        }
        if self.max_delay > MAX_RETRY_DELAY {
            return Err(SettingError::new(
                Setting::RetryMaxDelay,
                format!(
                    "{:?} is too long; allowed: up to {MAX_RETRY_DELAY:?} (7 days)",
                    self.max_delay
                ),
            ));
        }
        if self.probe_interval.is_zero() {
            return Err(SettingError::new(
                Setting::RetryProbeInterval,
                "must be longer than zero, such as 500 milliseconds",
            ));
        }
        if self.probe_max_interval < self.probe_interval
            || self.probe_max_interval > MAX_RETRY_DELAY
        {
            return Err(SettingError::new(
                Setting::RetryProbeMaxInterval,
                format!(
                    "{} is out of range; allowed: retry.probe_interval ({}) to 7 days",
                    crate::text::duration(self.probe_max_interval),
                    crate::text::duration(self.probe_interval)
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(SettingError::new(
                Setting::RetryJitter,
                format!(
                    "{} is out of range; allowed: 0.0 to 1.0 (a fraction of the delay)",
                    self.jitter
                ),
            ));
        }
        Ok(())
    }

    /// The longest a retry under this policy waits: the longest delay with
    /// the most jitter (a consumer's Retry-After is honoured up to the
    /// longest delay). A retry due further ahead than this was not
    /// scheduled with the clock as it reads now.
    pub fn longest_wait(&self) -> Duration {
        self.max_delay
            .max(self.probe_max_interval)
            .mul_f64(1.0 + self.jitter.clamp(0.0, 1.0))
    }

    /// The longest a Retry-After holds an event: the longest delay.
    pub(crate) fn retry_after_cap(&self) -> Duration {
        self.max_delay
    }

    /// How long a paused consumer's held event waits at most when its
    /// resumption does not release it sooner: the longest delay, so that a
    /// long pause costs the claim nothing per probe.
    pub(crate) fn longest_hold(&self) -> Duration {
        self.max_delay.max(self.probe_max_interval)
    }

    /// The wait before the next probe of a destination found unavailable
    /// `rounds` times in a row (1 the first time), without jitter. Never
    /// longer than the longest delay: a pause must not bring a destination
    /// that is back into use later than the retry schedule would.
    pub fn probe_after(&self, rounds: u32) -> Duration {
        let doublings = rounds.saturating_sub(1).min(31);
        self.probe_interval
            .saturating_mul(1u32 << doublings)
            .min(self.probe_max_interval.min(self.max_delay))
    }

    /// The delay before the next attempt, given the number of failed
    /// attempts so far (1 after the first failure), without jitter; None
    /// when the attempts are spent and the event is to be dead-lettered.
    pub fn delay_after(&self, failures: u32) -> Option<Duration> {
        if failures >= self.max_attempts {
            return None;
        }
        let doublings = failures.saturating_sub(1).min(40);
        let delay = self.initial.saturating_mul(1u32 << doublings.min(31));
        Some(delay.min(self.max_delay))
    }

    /// [`delay_after`](Self::delay_after) with jitter drawn from `unit`, a
    /// number in [0, 1).
    pub fn delay_with_jitter(&self, failures: u32, unit: f64) -> Option<Duration> {
        let base = self.delay_after(failures)?;
        Some(base.mul_f64(1.0 + self.jitter * unit.clamp(0.0, 1.0)))
    }
}

/// One consumer's outcome for a row, with the policy that governs it.
pub(crate) struct Report<'a> {
    /// The consumer's name.
    pub consumer: &'a str,
    /// Its retry policy.
    pub policy: &'a RetryPolicy,
    /// What it reported.
    pub outcome: &'a Outcome,
    /// How many rounds in a row its destination has been unavailable, this
    /// one included (read for an unavailable outcome only).
    pub rounds: u32,
}

/// What becomes of a row once all its consumers have reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Every consumer succeeded.
    Delivered,
    /// Deliver again at `at` (to the consumers that failed: the others have
    /// their ledger entries). `attempt` is the attempt that failed.
    Retry {
        at: Timestamp,
        attempt: u32,
        reason: String,
    },
    /// Only unavailable destinations kept the row: deliver again at `at`
    /// (their probe), spending no attempt.
    Held { at: Timestamp, reason: String },
    /// A consumer said poison: dead-letter now, spending no attempt.
    Poison { reason: String },
    /// A failing consumer has spent its attempts: dead-letter, counting this
    /// attempt.
    GaveUp { attempts: u32, reason: String },
}

/// Combines the reports of one row's delivery.
///
/// - Any poison dead-letters the row (the first poison's reason).
/// - Otherwise any retry schedules one for the row, `failures_before + 1`
///   failures in all: the row waits as long as the slowest retrying
///   consumer's schedule (with jitter from `unit`, a draw in [0, 1) per
///   retrying consumer) and at least any Retry-After a consumer gave, up
///   to that consumer's longest delay (so no retry is due further ahead
///   than [`RetryPolicy::longest_wait`]).
/// - When any retrying consumer's policy has no attempt left, the row is
///   dead-lettered instead ("gave up after N attempts").
/// - An unavailable consumer alone holds the row until its next probe
///   (its Retry-After if later, up to its longest delay), spending no
///   attempt; beside a retry, the row waits for the later of the two.
pub(crate) fn verdict<'a>(
    reports: impl IntoIterator<Item = Report<'a>>,
    failures_before: u32,
    now: Timestamp,
    mut unit: impl FnMut() -> f64,
) -> Verdict {
    let failures = failures_before.saturating_add(1);
    let mut retries: Vec<(&str, &str)> = Vec::new();
    let mut held: Vec<(&str, &str)> = Vec::new();
    let mut probe = Duration::ZERO;
    // Some(wait) while every retrying consumer has attempts left.
    let mut wait = Some(Duration::ZERO);
    for r in reports {
        match r.outcome {
            Outcome::Delivered => {}
            Outcome::Poison { reason } => {
                return Verdict::Poison {
                    reason: format!("consumer {} rejected it as poison: {reason}", r.consumer),
                }
            }
            Outcome::Retry { reason, after } => {
                retries.push((r.consumer, reason));
                let delay = r.policy.delay_with_jitter(failures, unit());
                wait = match (wait, delay) {
                    (Some(w), Some(d)) => {
                        let after = after.unwrap_or_default().min(r.policy.max_delay);
                        Some(w.max(d).max(after))
                    }
                    _ => None,
                };
            }
            Outcome::Unavailable { reason, after } => {
                held.push((r.consumer, reason));
                let base = r.policy.probe_after(r.rounds);
                let delay = base.mul_f64(1.0 + r.policy.jitter * unit().clamp(0.0, 1.0));
                let cap = r.policy.max_delay.max(r.policy.probe_max_interval);
                probe = probe.max(delay).max(after.unwrap_or_default().min(cap));
            }
        }
    }
    let reasons = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(consumer, r)| format!("consumer {consumer}: {r}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if retries.is_empty() {
        if held.is_empty() {
            return Verdict::Delivered;
        }
        return Verdict::Held {
            at: now.plus(probe),
            reason: format!("unavailable: {}", reasons(&held)),
        };
    }
    retries.extend(held);
    let reason = reasons(&retries);
    match wait {
        Some(wait) => Verdict::Retry {
            at: now.plus(wait.max(probe)),
            attempt: failures,
            reason,
        },
        None => Verdict::GaveUp {
            attempts: failures,
            reason: format!("gave up after {failures} attempts: {reason}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);

    fn report<'a>(consumer: &'a str, policy: &'a RetryPolicy, outcome: &'a Outcome) -> Report<'a> {
        Report {
            consumer,
            policy,
            outcome,
            rounds: 1,
        }
    }

    #[test]
    fn a_probe_never_waits_longer_than_the_longest_delay() {
        let short = RetryPolicy::default().max_delay(Duration::from_secs(2));
        assert_eq!(short.probe_after(1), Duration::from_millis(500));
        assert_eq!(short.probe_after(3), Duration::from_secs(2));
        assert_eq!(short.probe_after(10), Duration::from_secs(2));
        let default = RetryPolicy::default();
        assert_eq!(default.probe_after(10), Duration::from_secs(30));
    }

    #[test]
    fn an_unavailable_destination_spends_no_attempt_and_never_gives_up() {
        let p = RetryPolicy::default().max_attempts(2).jitter(0.0);
        let (ok, down) = (Outcome::Delivered, Outcome::unavailable("refused"));
        // Far beyond the attempts: still held, at the capped probe interval.
        let v = verdict(
            [
                report("a", &p, &ok),
                Report {
                    rounds: 50,
                    ..report("b", &p, &down)
                },
            ],
            40,
            NOW,
            || 0.0,
        );
        assert_eq!(
            v,
            Verdict::Held {
                at: NOW.plus(Duration::from_secs(30)),
                reason: "unavailable: consumer b: refused".into()
            }
        );
        // A Retry-After is honoured up to the longest delay.
        let busy = Outcome::unavailable_after("429", Duration::from_secs(7200));
        let Verdict::Held { at, .. } = verdict([report("a", &p, &busy)], 0, NOW, || 0.0) else {
            panic!()
        };
        assert_eq!(at, NOW.plus(Duration::from_secs(3600)));
        // Beside a failure, the failure's schedule counts the attempt.
        let fail = Outcome::retry("500");
        let v = verdict(
            [report("a", &p, &fail), report("b", &p, &down)],
            0,
            NOW,
            || 0.0,
        );
        assert!(matches!(v, Verdict::Retry { attempt: 1, .. }), "{v:?}");
    }

    #[test]
    fn all_delivered_is_delivered_and_a_poison_wins_over_retries() {
        let p = RetryPolicy::default();
        let ok = Outcome::Delivered;
        let retry = Outcome::retry("down");
        let poison = Outcome::poison("bad payload");
        let v = verdict([report("a", &p, &ok), report("b", &p, &ok)], 0, NOW, || 0.0);
        assert_eq!(v, Verdict::Delivered);
        let v = verdict(
            [report("a", &p, &retry), report("b", &p, &poison)],
            0,
            NOW,
            || 0.0,
        );
        assert_eq!(
            v,
            Verdict::Poison {
                reason: "consumer b rejected it as poison: bad payload".into()
            }
        );
    }

    #[test]
    fn a_retry_waits_for_the_slowest_schedule_and_any_retry_after() {
        let fast = RetryPolicy::default()
            .initial(Duration::from_secs(1))
            .jitter(0.0);
        let slow = RetryPolicy::default()
            .initial(Duration::from_secs(60))
            .jitter(0.0);
        let down = Outcome::retry("down");
        let later = Outcome::retry_after("busy", Duration::from_secs(600));
        let v = verdict(
            [report("a", &fast, &down), report("b", &slow, &down)],
            0,
            NOW,
            || 0.0,
        );
        assert_eq!(
            v,
            Verdict::Retry {
                at: NOW.plus(Duration::from_secs(60)),
                attempt: 1,
                reason: "consumer a: down; consumer b: down".into()
            }
        );
        let v = verdict([report("a", &slow, &later)], 2, NOW, || 0.0);
        let Verdict::Retry { at, attempt, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!((at, attempt), (NOW.plus(Duration::from_secs(600)), 3));
        // Honoured up to the consumer's longest delay (here 60 s).
        let capped = slow.clone().max_delay(Duration::from_secs(60));
        let v = verdict([report("a", &capped, &later)], 2, NOW, || 0.0);
        let Verdict::Retry { at, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(at, NOW.plus(Duration::from_secs(60)));
    }

    #[test]
    fn jitter_is_drawn_per_retrying_consumer() {
        let p = RetryPolicy::default()
            .initial(Duration::from_secs(100))
            .jitter(0.5);
        let down = Outcome::retry("down");
        let mut draws = vec![0.0, 1.0].into_iter();
        let v = verdict(
            [report("a", &p, &down), report("b", &p, &down)],
            0,
            NOW,
            || draws.next().unwrap(),
        );
        let Verdict::Retry { at, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(at, NOW.plus(Duration::from_secs(150)));
    }

    #[test]
    fn a_consumer_out_of_attempts_gives_the_row_up_even_if_another_has_some_left() {
        let two = RetryPolicy::default().max_attempts(2).jitter(0.0);
        let ten = RetryPolicy::default().jitter(0.0);
        let down = Outcome::retry("down");
        let after = Outcome::retry_after("busy", Duration::from_secs(5));
        // The first failure of a 2-attempt policy still retries...
        assert!(matches!(
            verdict([report("a", &two, &down)], 0, NOW, || 0.0),
            Verdict::Retry { .. }
        ));
        // ...the second gives up, whatever the others (or Retry-After) say.
        let v = verdict(
            [report("a", &ten, &after), report("b", &two, &down)],
            1,
            NOW,
            || 0.0,
        );
        assert_eq!(
            v,
            Verdict::GaveUp {
                attempts: 2,
                reason: "gave up after 2 attempts: consumer a: busy; consumer b: down".into()
            }
        );
    }

    #[test]
    fn default_schedule_is_thirty_seconds_doubling_to_an_hour() {
        let p = RetryPolicy::default();
        let secs: Vec<u64> = (1..10)
            .map(|n| p.delay_after(n).unwrap().as_secs())
            .collect();
        assert_eq!(secs, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(p.delay_after(10), None);
    }

    #[test]
    fn webhook_schedule_spans_days() {
        let p = RetryPolicy::webhook();
        let total: Duration = (1..p.attempts()).map(|n| p.delay_after(n).unwrap()).sum();
        // As documented (and in the README): about 5.2 days.
        assert_eq!(total, Duration::from_secs(450_180), "{total:?}");
    }

    #[test]
    fn validate_names_the_field() {
        let e = RetryPolicy::default()
            .max_attempts(0)
            .validate()
            .unwrap_err();
        assert_eq!(e.setting(), Setting::RetryMaxAttempts);
        assert!(e.to_string().contains("retry.max_attempts"), "{e}");
        let e = RetryPolicy::default()
            .max_attempts(1001)
            .validate()
            .unwrap_err();
        assert_eq!(e.setting(), Setting::RetryMaxAttempts);
        assert!(RetryPolicy::default().jitter(2.0).validate().is_err());
        let e = RetryPolicy::default()
            .max_delay(MAX_RETRY_DELAY + Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert_eq!(e.setting(), Setting::RetryMaxDelay);
        assert_eq!(
            RetryPolicy::default().jitter(0.5).longest_wait(),
            Duration::from_secs(5400)
        );
    }

    proptest! {
        #[test]
        fn delays_never_shrink_stay_bounded_and_stop_at_max_attempts(
            initial_ms in 1u64..100_000,
            extra_ms in 0u64..10_000_000,
            attempts in 1u32..60,
            jitter in 0.0f64..=1.0,
            unit in 0.0f64..1.0,
        ) {
            let p = RetryPolicy::default()
                .initial(Duration::from_millis(initial_ms))
                .max_delay(Duration::from_millis(initial_ms + extra_ms))
                .max_attempts(attempts)
                .jitter(jitter);
            p.validate().unwrap();
            let mut last = Duration::ZERO;
            for n in 1..attempts {
                let d = p.delay_after(n).unwrap();
                prop_assert!(d >= last);
                prop_assert!(d >= p.initial && d <= p.max_delay);
                let j = p.delay_with_jitter(n, unit).unwrap();
                prop_assert!(j >= d && j <= d.mul_f64(1.0 + jitter) + Duration::from_nanos(1));
                last = d;
            }
            prop_assert_eq!(p.delay_after(attempts), None);
            prop_assert_eq!(p.delay_after(attempts + 1), None);
        }
    }
}
