//! A value measured on a thread of its own, on demand, and shared.
//!
//! The outbox's status counts every row (on a million events it takes well
//! over the 50 ms a page may), so the overview, `/metrics` and `/healthz`
//! read the latest measure instead of starting one per request. A request
//! that finds the measure older than it accepts asks for a new one and
//! waits for it up to its own limit (a page a few milliseconds, a health
//! check seconds); it never starts a second measure itself. Nothing is
//! measured while nobody asks, and a slow measure is not repeated back to
//! back: the thread rests as long as the last one took.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use outboxd::Timestamp;

/// One measure and when it was taken.
#[derive(Debug)]
pub(crate) struct Measured<T> {
    /// The value.
    pub(crate) value: T,
    /// When the measure started.
    pub(crate) at: Timestamp,
    /// How long it took.
    pub(crate) took: Duration,
    started: Instant,
}

struct State<T> {
    latest: Option<Arc<Measured<T>>>,
    wanted: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves a whole value behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A value kept fresh on demand by its own thread.
pub(crate) struct Cached<T> {
    shared: Arc<Shared<T>>,
}

impl<T: Send + Sync + 'static> Cached<T> {
    /// Starts the thread that runs `measure` when asked. It ends once the
    /// `Cached` is dropped.
    pub(crate) fn start(
        name: &str,
        mut measure: impl FnMut() -> T + Send + 'static,
    ) -> std::io::Result<Cached<T>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                latest: None,
                wanted: false,
            }),
            changed: Condvar::new(),
        });
        let weak: Weak<Shared<T>> = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let Some(shared) = weak.upgrade() else { return };
                {
                    let mut st = shared.lock();
                    while !st.wanted {
                        // Wake now and then to notice the owner is gone.
                        st = shared
                            .changed
                            .wait_timeout(st, Duration::from_secs(1))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        if Arc::strong_count(&shared) == 1 {
                            return;
                        }
                    }
                    st.wanted = false;
                }
                let (at, started) = (Timestamp::now(), Instant::now());
                let value = measure();
                let took = started.elapsed();
                shared.lock().latest = Some(Arc::new(Measured {
                    value,
                    at,
                    took,
                    started,
                }));
                shared.changed.notify_all();
                drop(shared);
                // Rate limit, not synchronisation: at most half of this
                // thread's time goes to measuring.
                std::thread::sleep(took);
            })?;
        Ok(Cached { shared })
    }

    /// The latest measure if it started at most `fresh` ago; otherwise asks
    /// for a new one and waits up to `wait` for it (not at all when the last
    /// one took longer than `wait`), then returns the latest there is
    /// (older, or None before the first measure ends).
    pub(crate) fn get(&self, fresh: Duration, wait: Duration) -> Option<Arc<Measured<T>>> {
        let asked = Instant::now();
        let is_fresh = |m: &Measured<T>| asked.saturating_duration_since(m.started) <= fresh;
        let mut st = self.shared.lock();
        if st.latest.as_deref().is_some_and(is_fresh) {
            return st.latest.clone();
        }
        st.wanted = true;
        self.shared.changed.notify_all();
        // A measure that took longer than we may wait will not be ready in
        // time: answer with the last one at once.
        if st.latest.as_deref().is_some_and(|m| m.took > wait) {
            return st.latest.clone();
        }
        let deadline = asked + wait;
        loop {
            if st.latest.as_deref().is_some_and(is_fresh) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.latest.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn measures_on_demand_and_reuses_a_fresh_value() {
        let runs = Arc::new(AtomicU64::new(0));
        let r = runs.clone();
        let cached =
            Cached::start("test-cache", move || r.fetch_add(1, Ordering::SeqCst) + 1).unwrap();
        let first = cached
            .get(Duration::from_secs(60), Duration::from_secs(10))
            .unwrap();
        assert_eq!(first.value, 1);
        let again = cached
            .get(Duration::from_secs(60), Duration::from_secs(10))
            .unwrap();
        assert_eq!(again.value, 1, "a fresh value is reused");
        let newer = cached.get(Duration::ZERO, Duration::from_secs(10)).unwrap();
        assert_eq!(newer.value, 2, "a stale one is measured again");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_slow_measure_returns_the_previous_value_within_the_wait() {
        let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
        let mut n = 0;
        let cached = Cached::start("test-cache-slow", move || {
            n += 1;
            if n > 1 {
                // Blocks until the test lets it finish.
                let _ = go_rx.recv();
            }
            n
        })
        .unwrap();
        assert_eq!(
            cached
                .get(Duration::ZERO, Duration::from_secs(10))
                .unwrap()
                .value,
            1
        );
        // The slow measure cannot end before go_tx sends, so the value 1 is
        // proof that get did not wait for it.
        let stale = cached
            .get(Duration::ZERO, Duration::from_millis(50))
            .unwrap();
        assert_eq!(
            stale.value, 1,
            "the older value, not a wait for the slow one"
        );
        go_tx.send(()).unwrap();
        // Once it ends, the slow measure's value is the one served (a
        // bounded poll: it lands on the cache's own thread).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let latest = cached
                .get(Duration::from_secs(3600), Duration::ZERO)
                .unwrap();
            if latest.value == 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the slow measure's value never replaced the first: still {}",
                latest.value
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
