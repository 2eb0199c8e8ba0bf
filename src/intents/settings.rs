//! The settings of intent operations: the clock and the claim lease.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::senders::Senders;
use super::IntentResult;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Setting, SettingError};

/// How long a send's claim keeps other senders away by default: 5 minutes.
/// Give the post a timeout shorter than the lease, or extend the lease from
/// a long post ([`Intents::send_with_lease`]).
pub const DEFAULT_INTENT_LEASE: Duration = Duration::from_secs(5 * 60);

/// The shortest lease [`Intents::lease`] accepts.
pub const MIN_INTENT_LEASE: Duration = Duration::from_secs(1);

/// Intent operations with settings other than the defaults: the clock and
/// the claim lease. The free functions ([`record`](super::record),
/// [`send`](super::send)…) use `Intents::new()`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
/// # outboxd::schema::migrate(&mut conn)?;
/// use std::time::Duration;
/// use outboxd::intents::{IntentKey, Intents, IntentStatus};
/// let intents = Intents::new().lease(Duration::from_secs(30))?;
/// let intent = intents.record(&conn, &IntentKey::system("nightly-report/2026-11-30")?)?;
/// assert_eq!(intent.status, IntentStatus::Pending);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Intents {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) lease: Duration,
    /// This sender's lock files, shared by its clones.
    pub(super) senders: Senders,
}

impl fmt::Debug for Intents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intents")
            .field("now", &self.clock.now())
            .field("lease", &self.lease)
            .finish()
    }
}

impl Default for Intents {
    fn default() -> Self {
        Intents::new()
    }
}

impl Intents {
    /// The system clock and [`DEFAULT_INTENT_LEASE`].
    pub fn new() -> Intents {
        Intents {
            clock: Arc::new(SystemClock),
            lease: DEFAULT_INTENT_LEASE,
            senders: Senders::default(),
        }
    }

    /// Reads the time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Intents {
        self.clock = Arc::new(clock);
        self
    }

    /// How long a send's claim keeps other senders away (default
    /// [`DEFAULT_INTENT_LEASE`], at least [`MIN_INTENT_LEASE`]). A claim of
    /// a live sender stands past its end; one of a sender that ended (its
    /// process, or this value with its clones) is taken at once, and one of
    /// a process stopped for ten leases then (docs/liveness.md). The end
    /// still rules claims written by older senders, which judge every claim
    /// by it: make it longer than the slowest post, or extend it from the
    /// post ([`send_with_lease`](Intents::send_with_lease)), while such
    /// senders share the database. The claim records its own end, so
    /// senders with different leases are safe together.
    pub fn lease(mut self, lease: Duration) -> IntentResult<Intents> {
        if lease < MIN_INTENT_LEASE {
            return Err(Error::from(SettingError::new(
                Setting::IntentLease,
                format!(
                    "{} is shorter than the minimum of {}; give a lease longer than the slowest post",
                    crate::text::duration(lease),
                    crate::text::duration(MIN_INTENT_LEASE)
                ),
            ))
            .into());
        }
        self.lease = lease;
        Ok(self)
    }

    /// The lease in use.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_must_be_at_least_the_minimum() {
        assert!(Intents::new().lease(Duration::from_millis(10)).is_err());
        assert_eq!(
            Intents::new()
                .lease(MIN_INTENT_LEASE)
                .unwrap()
                .lease_duration(),
            MIN_INTENT_LEASE
        );
    }
}
