//! How an idle writer learns of commits made by other connections (other
//! processes, or the host's own connections) without spinning.
//!
//! Another connection's commit changes `PRAGMA data_version`; the relay's
//! own do not. Reading it is cheap, but reading it every few milliseconds
//! wakes an idle relay hundreds of times a second. So the writer reads it
//! when it has a reason to:
//!
//! - **A file-system notification** on the database's `-wal` file (inotify
//!   on Linux, through rustix; other systems have only the floor): every
//!   commit in WAL mode writes that file. One small thread (64 KiB stack)
//!   reads the notifications into a stack buffer. Under glibc it still
//!   costs a malloc arena's 64 MB of address space (the thread's start-up
//!   allocates), which matters only under an address-space limit
//!   (tests/run_faults.rs leaves room for it); musl, the release binaries'
//!   libc, has no per-thread arenas. The notification comes when the commit
//!   *starts* writing, and the commit becomes visible only after its last
//!   frame (and, at `synchronous=FULL`, its fsync), so after a notification
//!   the writer reads `data_version` in a short burst: every [`BURST_STEP`]
//!   for [`BURST_STEADY`], then at doubling gaps up to the floor, until it
//!   sees the change. The relay's own commits would notify too, once per
//!   frame written, each waking the watch's thread: so during the writer's
//!   transactions the watch listens only for the file's removal
//!   ([`Wake::writing`]), and after each the watch listens again and the
//!   writer reads `data_version` in a burst, as after a notification
//!   ([`Wake::written`]): another connection's commit that began writing
//!   in between is seen so. (Housekeeping, every few seconds and often
//!   writing nothing, is left out: a burst after each tick would cost an
//!   idle relay more than the signal of a tick that wrote.)
//! - **The floor**: every poll interval (1 s by default) whatever happened,
//!   for file systems that send no notification (network file systems, a
//!   watch the kernel refused) and as a safety net.
//!
//! `RelayHandle::notify` still wakes the writer at once (the control
//! channel), and [`until_timed_work`] bounds the sleep by the work that
//! comes due by the clock (a retry, a lease renewal, housekeeping), so a
//! slow floor delays none of it.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::clock::Timestamp;

/// The gap between `data_version` reads right after a notification...
pub(crate) const BURST_STEP: Duration = Duration::from_micros(250);
/// ...for this long; then the gaps double until they reach the floor.
pub(crate) const BURST_STEADY: Duration = Duration::from_millis(2);

/// The writer's source of wake-ups for foreign commits: a watch on the
/// `-wal` file when the platform and file system give one, and the
/// schedule of `data_version` reads.
pub(super) struct Wake {
    /// Keeps the watch (and its thread) alive; None without notification.
    watch: Option<Watch>,
    signals: Receiver<()>,
    schedule: Schedule,
    /// The watch listens again after the writer's own write: read
    /// `data_version` at once and in a burst, as after a signal.
    relistened: bool,
}

impl Wake {
    /// Watches `wal` (the database's `-wal` file) when given and possible;
    /// otherwise only the floor wakes the writer. Never fails: a relay
    /// without notification still works, only slower to see foreign commits.
    pub(super) fn start(wal: Option<&Path>, floor: Duration, at: Instant) -> Wake {
        let (watch, signals) = match wal.map(Watch::start) {
            Some(Ok((w, rx))) => (Some(w), rx),
            Some(Err(e)) => {
                tracing::info!(
                    error = %e,
                    every_ms = u64::try_from(floor.as_millis()).unwrap_or(u64::MAX),
                    "no file-system notification for the WAL file; looking for other \
                     processes' commits on a timer"
                );
                (None, crossbeam_channel::never())
            }
            None => (None, crossbeam_channel::never()),
        };
        Wake {
            watch,
            signals,
            schedule: Schedule::new(floor, at),
            relistened: false,
        }
    }

    /// Whether a watch is in place.
    #[cfg(test)]
    fn watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Ready when the `-wal` file changed (for the writer's `select!`).
    pub(super) fn signals(&self) -> &Receiver<()> {
        &self.signals
    }

    /// What the writer's `select!` took from [`signals`](Self::signals):
    /// true for a signal. A disconnected channel (the watch ended: the file
    /// was removed) leaves the floor alone, rather than a channel that is
    /// always ready.
    pub(super) fn took(&mut self, r: Result<(), crossbeam_channel::RecvError>) -> bool {
        if r.is_err() {
            self.watch_ended("the watch on the WAL file ended");
        }
        r.is_ok()
    }

    /// The writer is about to write to the database. Its own commits
    /// change the `-wal` file too, and would wake the watch's thread once
    /// per frame for nothing (on a drain, a share of the writer's time in
    /// the kernel, BENCHMARKS.md): until [`written`](Self::written), the watch listens only
    /// for the file's removal.
    pub(super) fn writing(&mut self) {
        self.listen(false);
    }

    /// The writer's write is over (committed or not): the watch listens for
    /// changes again. Another connection's commit may have begun writing
    /// while it did not, and become visible only later (after its fsync),
    /// so the writer reads `data_version` at once and in a burst, as after
    /// a signal.
    pub(super) fn written(&mut self) {
        if self.watch.is_some() {
            self.listen(true);
            self.relistened = self.watch.is_some();
        }
    }

    fn listen(&mut self, changes: bool) {
        if let Some(Err(e)) = self.watch.as_mut().map(|w| w.listen(changes)) {
            self.watch_ended(&format!("cannot change the watch on the WAL file: {e}"));
        }
    }

    /// Without the watch, only the floor remains (never a closed channel,
    /// which would make the writer's `select!` spin).
    fn watch_ended(&mut self, why: &str) {
        tracing::info!("{why}; looking for commits on a timer");
        self.watch = None;
        self.signals = crossbeam_channel::never();
    }

    /// How long the writer may sleep before it must read `data_version`.
    pub(super) fn timeout(&self, at: Instant) -> Duration {
        self.schedule.next_read().saturating_duration_since(at)
    }

    /// Whether to read `data_version` now. `signalled`: the writer's
    /// `select!` took a signal (others queued behind it are taken too).
    pub(super) fn read_due(&mut self, signalled: bool, at: Instant) -> bool {
        let queued = self.signals.try_iter().count() > 0;
        let relistened = std::mem::take(&mut self.relistened);
        self.schedule
            .read_due(signalled || queued || relistened, at)
    }

    /// The read happened at `at`; `changed`: it showed a foreign commit.
    pub(super) fn read(&mut self, changed: bool, at: Instant) {
        self.schedule.read(changed, at);
    }
}

/// An inotify watch on one file whose changes (writes, truncation,
/// removal; not reads or opens) put a signal in a one-slot channel, read
/// by a thread of its own. Dropping it removes the watch, which wakes the
/// thread (`IN_IGNORED`) to end.
#[cfg(target_os = "linux")]
struct Watch {
    fd: std::sync::Arc<rustix::fd::OwnedFd>,
    wd: i32,
    file: std::path::PathBuf,
    /// Listening for changes, not only for the file's end.
    changes: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the watch listens for: every change of the file...
#[cfg(target_os = "linux")]
const CHANGES: rustix::fs::inotify::WatchFlags = rustix::fs::inotify::WatchFlags::MODIFY
    .union(rustix::fs::inotify::WatchFlags::ATTRIB)
    .union(rustix::fs::inotify::WatchFlags::CLOSE_WRITE)
    .union(END);

/// ...or, while the writer writes, only the file's end.
#[cfg(target_os = "linux")]
const END: rustix::fs::inotify::WatchFlags =
    rustix::fs::inotify::WatchFlags::DELETE_SELF.union(rustix::fs::inotify::WatchFlags::MOVE_SELF);

#[cfg(target_os = "linux")]
impl Watch {
    fn start(file: &Path) -> std::io::Result<(Watch, Receiver<()>)> {
        use rustix::fs::inotify::{self, CreateFlags};
        let fd = std::sync::Arc::new(inotify::init(CreateFlags::CLOEXEC)?);
        let wd = inotify::add_watch(&*fd, file, CHANGES)?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let reader = fd.clone();
        let thread = std::thread::Builder::new()
            .name("outboxd-wal-watch".into())
            .stack_size(WATCH_STACK)
            .spawn(move || read_events(&reader, &tx));
        match thread {
            Ok(t) => Ok((
                Watch {
                    fd,
                    wd,
                    file: file.to_path_buf(),
                    changes: true,
                    thread: Some(t),
                },
                rx,
            )),
            Err(e) => {
                let _ = inotify::remove_watch(&*fd, wd);
                Err(e)
            }
        }
    }
}

#[cfg(target_os = "linux")]
impl Watch {
    /// Listens for every change (`changes`) or only for the file's end.
    /// Fails when the file is gone or is another file now (the watch is
    /// then of no use: the caller falls back to the floor).
    fn listen(&mut self, changes: bool) -> std::io::Result<()> {
        use rustix::fs::inotify;
        if self.changes == changes {
            return Ok(());
        }
        let mask = if changes { CHANGES } else { END };
        // By path: inotify has no call that changes a watch by descriptor.
        // The same file gives the same descriptor, with its mask replaced.
        let wd = inotify::add_watch(&*self.fd, &self.file, mask)?;
        if wd != self.wd {
            let _ = inotify::remove_watch(&*self.fd, wd);
            return Err(std::io::Error::other("the file was replaced"));
        }
        self.changes = changes;
        Ok(())
    }
}

/// The watch thread's stack: it holds one event buffer and calls nothing deep.
#[cfg(target_os = "linux")]
const WATCH_STACK: usize = 64 * 1024;

/// The watch thread: a signal per batch of events, until the watch is
/// removed or the writer has gone. Allocates nothing itself.
#[cfg(target_os = "linux")]
fn read_events(fd: &rustix::fd::OwnedFd, tx: &crossbeam_channel::Sender<()>) {
    use rustix::fs::inotify::{ReadFlags, Reader};
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut events = Reader::new(fd, &mut buf);
    loop {
        match events.next() {
            Ok(e) if e.events().contains(ReadFlags::IGNORED) => return,
            Ok(_) => {
                // Full: a signal is already waiting, which is as good.
                if let Err(crossbeam_channel::TrySendError::Disconnected(())) = tx.try_send(()) {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for Watch {
    fn drop(&mut self) {
        // Removing the watch queues IN_IGNORED, which ends the thread; if
        // it has ended already (the file was removed), this fails harmlessly.
        let _ = rustix::fs::inotify::remove_watch(&*self.fd, self.wd);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// No notification on this platform: only the floor.
#[cfg(not(target_os = "linux"))]
struct Watch;

#[cfg(not(target_os = "linux"))]
impl Watch {
    fn start(_: &Path) -> std::io::Result<(Watch, Receiver<()>)> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "file-system notification is implemented for Linux only",
        ))
    }

    fn listen(&mut self, _: bool) -> std::io::Result<()> {
        Ok(())
    }
}

/// When to read `data_version`: on a signal at once, then in a burst (see
/// the module doc), and otherwise once per floor.
#[derive(Debug)]
struct Schedule {
    floor: Duration,
    last_read: Instant,
    /// During a burst: when it began and the gap before the next read.
    burst: Option<(Instant, Duration)>,
}

impl Schedule {
    fn new(floor: Duration, at: Instant) -> Schedule {
        Schedule {
            floor,
            last_read: at,
            burst: None,
        }
    }

    fn next_read(&self) -> Instant {
        let gap = self.burst.map_or(self.floor, |(_, gap)| gap);
        self.last_read + gap
    }

    fn read_due(&mut self, signalled: bool, at: Instant) -> bool {
        if signalled {
            self.burst = Some((at, BURST_STEP));
            return true;
        }
        at >= self.next_read()
    }

    fn read(&mut self, changed: bool, at: Instant) {
        self.last_read = at;
        self.burst = match self.burst {
            _ if changed => None,
            None => None,
            Some((began, gap)) => {
                let gap = if at.saturating_duration_since(began) < BURST_STEADY {
                    BURST_STEP
                } else {
                    gap * 2
                };
                (gap < self.floor).then_some((began, gap))
            }
        };
    }
}

/// The work that comes due by the clock rather than by a message: the
/// writer may sleep no longer than [`until_timed_work`] says.
pub(super) struct Timers {
    /// The wall clock now.
    pub now: Timestamp,
    /// The monotonic clock now.
    pub at: Instant,
    /// The next known time a row becomes due (a retry, a delayed event).
    pub next_due: Option<Timestamp>,
    /// The earliest lease in flight, and the lease length: a heartbeat is
    /// due once half of it has run out.
    pub earliest_lease: Option<Timestamp>,
    pub lease: Duration,
    /// The earliest monotonic renewal in flight.
    pub earliest_renewal: Option<Instant>,
    /// The next housekeeping tick.
    pub housekeeping: Instant,
}

/// How long until the first of `t`'s timed work comes due. Times already
/// past do not count: the writer's loop has just acted on them, or its
/// planner chose to wait for a message that will wake it (a full jobs
/// channel, a spent byte budget, a shutdown); counting them would spin.
pub(super) fn until_timed_work(t: &Timers) -> Duration {
    let waits = [
        Some(t.housekeeping.saturating_duration_since(t.at)),
        t.next_due.map(|due| due.since(t.now)),
        t.earliest_lease
            .map(|lease| lease.since(t.now).saturating_sub(t.lease / 2)),
        t.earliest_renewal
            .map(|renew| renew.saturating_duration_since(t.at)),
    ];
    waits
        .into_iter()
        .flatten()
        .filter(|w| !w.is_zero())
        .min()
        .unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_secs(1);

    #[test]
    fn without_a_signal_reads_once_per_floor() {
        let t0 = Instant::now();
        let mut s = Schedule::new(FLOOR, t0);
        assert!(!s.read_due(false, t0 + FLOOR / 2));
        assert_eq!(s.next_read(), t0 + FLOOR);
        assert!(s.read_due(false, t0 + FLOOR));
        s.read(false, t0 + FLOOR);
        assert_eq!(s.next_read(), t0 + 2 * FLOOR);
    }

    #[test]
    fn a_signal_reads_at_once_then_in_a_burst_that_ends_at_the_floor() {
        let t0 = Instant::now();
        let mut s = Schedule::new(FLOOR, t0);
        let mut at = t0 + Duration::from_millis(10);
        assert!(s.read_due(true, at), "a signal reads at once");
        let signal = at;
        let mut reads = 0;
        loop {
            s.read(false, at);
            reads += 1;
            let next = s.next_read();
            if s.burst.is_none() {
                assert_eq!(next, at + FLOOR, "then back to the floor");
                break;
            }
            if at.saturating_duration_since(signal) < BURST_STEADY {
                assert_eq!(next - at, BURST_STEP, "steady at first");
            } else {
                assert!(next - at > BURST_STEP, "then further apart");
            }
            at = next;
            assert!(reads < 100, "the burst ends");
        }
        assert!(
            (15..40).contains(&reads),
            "about twenty reads per burst, not {reads}"
        );
    }

    #[test]
    fn a_change_seen_ends_the_burst() {
        let t0 = Instant::now();
        let mut s = Schedule::new(FLOOR, t0);
        assert!(s.read_due(true, t0));
        s.read(false, t0);
        assert_eq!(s.next_read(), t0 + BURST_STEP);
        s.read(true, t0 + BURST_STEP);
        assert_eq!(s.next_read(), t0 + BURST_STEP + FLOOR);
    }

    #[test]
    fn timed_work_bounds_the_sleep() {
        let now = Timestamp::from_millis(1_000_000);
        let at = Instant::now();
        let idle = Timers {
            now,
            at,
            next_due: None,
            earliest_lease: None,
            lease: Duration::from_secs(30),
            earliest_renewal: None,
            housekeeping: at + Duration::from_secs(10),
        };
        assert_eq!(until_timed_work(&idle), Duration::from_secs(10));
        let retry = Timers {
            next_due: Some(Timestamp::from_millis(1_000_250)),
            ..idle
        };
        assert_eq!(until_timed_work(&retry), Duration::from_millis(250));
        let lease = Timers {
            earliest_lease: Some(Timestamp::from_millis(1_016_000)),
            ..idle
        };
        assert_eq!(until_timed_work(&lease), Duration::from_secs(1));
        let renewal = Timers {
            earliest_renewal: Some(at + Duration::from_millis(3)),
            ..idle
        };
        assert_eq!(until_timed_work(&renewal), Duration::from_millis(3));
        let overdue = Timers {
            next_due: Some(Timestamp::from_millis(999_000)),
            housekeeping: at,
            ..idle
        };
        assert_eq!(
            until_timed_work(&overdue),
            Duration::MAX,
            "what is past bounds nothing (the writer would spin)"
        );
    }

    /// A relay on a fresh database whose consumer reports each event id,
    /// and a way to commit events on another connection (never `notify`).
    struct Setup {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        seen: crossbeam_channel::Receiver<crate::EventId>,
        relay: crate::RelayHandle,
    }

    impl Setup {
        fn start(floor: Duration, watch_wal: bool) -> Setup {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("app.db");
            let mut conn = crate::connection::open(&path).unwrap();
            crate::schema::migrate(&mut conn).unwrap();
            let (tx, seen) = crossbeam_channel::unbounded();
            let relay = crate::Relay::builder(&path)
                .consumer("a", ["a.b.v1"], move |d: &crate::Delivery| {
                    tx.send(d.envelope.event_id).unwrap();
                    crate::Outcome::Delivered
                })
                .poll_interval(floor)
                .watch_wal(watch_wal)
                .housekeeping_interval(Duration::from_secs(3600))
                .build()
                .unwrap()
                .start()
                .unwrap();
            Setup {
                _dir: dir,
                path,
                seen,
                relay,
            }
        }

        /// Commits one event on a connection of its own and waits until
        /// the relay has delivered it and recorded that (so the relay has
        /// nothing left to do: what follows reaches it only by a wake-up).
        fn round_trip(&self, n: u64) {
            let mut conn = crate::connection::open(&self.path).unwrap();
            let tx = conn.transaction().unwrap();
            let event = crate::Event::new("a.b.v1", &n).unwrap();
            let id = crate::enqueue(&tx, &event).unwrap().event_id();
            tx.commit().unwrap();
            let got = self
                .seen
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("event {n} not delivered within 20 s"));
            assert_eq!(got, id);
            let deadline = Instant::now() + Duration::from_secs(20);
            while conn
                .query_row(
                    "SELECT status FROM event_outbox WHERE event_id = ?1",
                    [id.to_string()],
                    |r| r.get::<_, String>(0),
                )
                .unwrap()
                != "delivered"
            {
                assert!(Instant::now() < deadline, "event {n} not recorded");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn a_relay_with_a_minute_floor_picks_up_foreign_commits_by_notification() {
        // The floor (60 s) is three times what each round allows (20 s):
        // only the notification on the -wal file can explain a delivery.
        let s = Setup::start(super::super::MAX_POLL_INTERVAL, true);
        for n in 0..3 {
            s.round_trip(n);
        }
        s.relay.shutdown(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn without_notification_the_floor_picks_up_foreign_commits() {
        let s = Setup::start(Duration::from_millis(100), false);
        for n in 0..3 {
            s.round_trip(n);
        }
        s.relay.shutdown(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_watch_on_a_missing_file_falls_back_to_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let w = Wake::start(Some(&dir.path().join("gone-wal")), FLOOR, Instant::now());
        assert!(!w.watching());
        assert!(w.signals().try_recv().is_err());
        let at = Instant::now();
        assert!(w.timeout(at) <= FLOOR);
    }

    /// An empty `-wal` file in a directory of its own, and a wake watching it.
    fn watched_wal() -> (tempfile::TempDir, std::path::PathBuf, Wake) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.db-wal");
        std::fs::write(&file, b"").unwrap();
        let w = Wake::start(Some(&file), FLOOR, Instant::now());
        (dir, file, w)
    }

    #[test]
    fn a_write_to_the_watched_file_signals() {
        let (_dir, file, w) = watched_wal();
        assert!(w.watching());
        std::fs::write(&file, b"frame").unwrap();
        w.signals()
            .recv_timeout(Duration::from_secs(20))
            .expect("a signal for the write");
    }

    #[test]
    fn the_writers_own_writes_do_not_signal_and_a_burst_follows_them() {
        let (_dir, file, mut w) = watched_wal();
        w.writing();
        std::fs::write(&file, b"own frame").unwrap();
        // A signal comes within microseconds of a write the watch listens
        // for (the next assertion waits for one); 200 ms is ample.
        assert!(
            w.signals()
                .recv_timeout(Duration::from_millis(200))
                .is_err(),
            "the writer's own write signalled"
        );
        w.written();
        assert!(w.watching());
        let at = Instant::now();
        assert!(w.read_due(false, at), "data_version is read at once");
        w.read(false, at);
        assert_eq!(w.timeout(at), BURST_STEP, "and again in a burst");
        std::fs::write(&file, b"foreign frame").unwrap();
        w.signals()
            .recv_timeout(Duration::from_secs(20))
            .expect("a signal: the watch listens again");
    }

    #[test]
    fn a_file_replaced_while_the_writer_writes_leaves_the_floor() {
        let (_dir, file, mut w) = watched_wal();
        w.writing();
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, b"another file").unwrap();
        w.written();
        assert!(!w.watching(), "a watch on another file is of no use");
        let at = Instant::now();
        assert!(!w.read_due(false, at), "no burst without a watch");
        assert!(w.timeout(at) <= FLOOR);
        assert!(matches!(
            w.signals().try_recv(),
            Err(crossbeam_channel::TryRecvError::Empty)
        ));
    }

    #[test]
    fn a_removed_file_ends_the_watch_and_leaves_the_floor() {
        let (_dir, file, mut w) = watched_wal();
        assert!(w.watching());
        std::fs::remove_file(&file).unwrap();
        // The removal signals, then the watch ends and the channel closes.
        let end = loop {
            match w.signals().recv_timeout(Duration::from_secs(20)) {
                Ok(()) => continue,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    break Err(crossbeam_channel::RecvError)
                }
                Err(e) => panic!("the watch did not end: {e:?}"),
            }
        };
        assert!(!w.took(end), "a closed channel is no signal");
        assert!(!w.watching());
        assert!(
            matches!(
                w.signals().try_recv(),
                Err(crossbeam_channel::TryRecvError::Empty)
            ),
            "never ready again (a closed channel would make the writer spin)"
        );
    }

    #[test]
    fn dropping_a_wake_ends_its_thread() {
        let (_dir, _, w) = watched_wal();
        assert!(w.watching());
        let (done_tx, done) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            drop(w); // removes the watch and joins the thread
            done_tx.send(()).unwrap();
        });
        done.recv_timeout(Duration::from_secs(20))
            .expect("drop returns: the watch thread ended");
    }
}
