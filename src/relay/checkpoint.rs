//! WAL checkpoints off the writer's commits.
//!
//! SQLite's auto-checkpoint runs inside whichever commit takes the WAL past
//! 1,000 pages, on the committing thread. On the relay's writer that put a
//! checkpoint (two fsyncs and up to 4 MiB copied) between a commit and the
//! next claim once in every few hundred transactions, which made the whole
//! tail of the pick-up latency (BENCHMARKS.md). So the writer's connection
//! hands the work to a thread of its own: its WAL hook (which replaces the
//! auto-checkpoint on that connection) wakes the checkpoint thread once the
//! WAL holds [`CHECKPOINT_AT`] pages, long before any connection's
//! auto-checkpoint would run, and the thread runs a passive checkpoint on
//! its own connection while the writer goes on.
//!
//! A checkpoint that runs beside a writer copies the pages committed before
//! it started, and SQLite starts the WAL over only at a transaction that
//! began with every page copied: while commits keep coming, the thread's
//! passive checkpoints alone never get there. So once a passive checkpoint
//! has copied every page of a WAL past [`RESTART_AT`] pages, the thread
//! runs a RESTART checkpoint, which takes the write lock for as long as it
//! copies the pages committed meanwhile (and syncs them), and starts the
//! WAL over. Without it, beside a host committing many times a second
//! (each commit followed by the relay's claim), a commit always came
//! between a checkpoint and the next transaction: the WAL stayed past
//! 1,000 pages for hundreds of commits, the writer checkpointed in every
//! one of them (below), and that was the tail of the pick-up latency
//! (BENCHMARKS.md).
//!
//! Should the restart find a reader or the lock in the way, the writer
//! still checkpoints in its own commit at [`CHECKPOINT_INLINE_AT`] pages,
//! SQLite's own threshold, as SQLite would have: by then the thread has
//! copied nearly every page, so that checkpoint copies only those committed
//! since, and when the relay is the only writer its next transaction begins
//! with every page copied and the WAL starts over (without it, the WAL
//! grows on and on). Only one connection may checkpoint at a time
//! (another gets SQLITE_BUSY at once), so the writer's commits past that
//! size stop waking the thread: it finishes the checkpoint it is in (and at
//! most one more, asked before), and the writer's next commit gets the
//! lock. What the writer commits meanwhile can be much (a checkpoint ends
//! with two fsyncs, and a writer committing without a pause goes on), so
//! at [`CHECKPOINT_WAIT_AT`] pages the writer waits for the thread's
//! checkpoint to end and runs its own: the WAL never holds much more than
//! that.
//!
//! Under glibc the thread costs a malloc arena's 64 MB of address space
//! (SQLite allocates while checkpointing), which matters only under an
//! address-space limit (tests/run_faults.rs leaves room for it).

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use rusqlite::wal::CheckpointMode;
use rusqlite::Connection;

use crate::error::{Error, Result};

/// WAL pages at which a writer's commit wakes the checkpoint thread: a
/// tenth of SQLite's auto-checkpoint threshold (1,000 pages), so the thread
/// checkpoints long before a host's connection would, and each checkpoint
/// copies about 400 KiB. Smaller checkpoints keep hosts' commits short: the
/// fsync that ends a checkpoint also holds back a host's commit fsync on
/// the same file system (ext4 commits its journal for both); a larger
/// threshold let hosts' commits stall in the host benchmark
/// (BENCHMARKS.md). The price is more writes to the database file: a page
/// changed often is copied back once per checkpoint.
pub(crate) const CHECKPOINT_AT: c_int = 100;

/// WAL pages past which the thread, once a checkpoint has copied every
/// page, starts the WAL over itself (see [`restart`] and the module's
/// documentation): half SQLite's threshold, so it does so before the writer
/// would have to.
pub(crate) const RESTART_AT: c_int = 500;

/// WAL pages at which the writer checkpoints in its own commit, to let the
/// WAL start over (see the module's documentation): SQLite's default
/// auto-checkpoint threshold.
pub(crate) const CHECKPOINT_INLINE_AT: c_int = 1_000;

/// WAL pages (8 MiB) at which the writer, finding the thread's checkpoint
/// still running, waits for it (up to [`CHECKPOINT_WAIT`]) to run its own,
/// rather than let the WAL grow (see the module's documentation).
pub(crate) const CHECKPOINT_WAIT_AT: c_int = 2_000;

/// The longest the writer waits for the thread's checkpoint to end.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// How often the waiting writer tries the checkpoint lock.
const CHECKPOINT_RETRY: Duration = Duration::from_micros(200);

/// The name of the checkpoint thread.
pub(crate) const THREAD: &str = "outboxd-checkpoint";

/// The checkpoint thread and the writer connection's WAL hook that wakes it.
pub(crate) struct Checkpointer {
    wake: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    #[cfg_attr(not(test), allow(dead_code))]
    shared: Arc<Shared>,
}

/// What the writer's hook and the thread count, for the tests.
#[derive(Default)]
struct Shared {
    /// Checkpoints the thread ran (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    done: AtomicU64,
    /// Times the thread started the WAL over (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    restarts: AtomicU64,
    /// Times it tried (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    restart_tries: AtomicU64,
    /// The most pages the WAL held after a writer's commit (read by the
    /// tests).
    #[cfg_attr(not(test), allow(dead_code))]
    most_pages: AtomicI32,
    /// The WAL's pages after the writer's last commit (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pages: AtomicI32,
}

impl Checkpointer {
    /// Opens the thread's connection to `path`, starts it with `spawn`, and
    /// sets `writer`'s WAL hook (which turns SQLite's auto-checkpoint off on
    /// that connection).
    pub(crate) fn start(
        path: &Path,
        writer: &mut Connection,
        spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> Result<JoinHandle<()>>,
    ) -> Result<Checkpointer> {
        let conn = crate::connection::open(path)?;
        crate::connection::small_cache(&conn)?;
        // The thread never waits for a lock: a passive checkpoint takes none
        // that a busy handler would wait for, and a restart that finds the
        // lock taken is tried again at the next wake-up.
        conn.busy_timeout(Duration::ZERO).map_err(Error::db(
            "turn off the checkpoint connection's busy handler",
        ))?;
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            spawn(Box::new(move || {
                let mut state = RestartState::default();
                for () in woken {
                    checkpoint(&conn, &shared, &mut state);
                }
            }))?
        };
        let (hook, hooked) = (wake.clone(), shared.clone());
        writer
            .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: c_int| {
                hooked.pages.store(pages, Ordering::Relaxed);
                hooked.most_pages.fetch_max(pages, Ordering::Relaxed);
                if pages >= CHECKPOINT_INLINE_AT {
                    // Busy means the thread's checkpoint is finishing; the
                    // next commit tries again, or past CHECKPOINT_WAIT_AT
                    // this one waits for it.
                    // (Another error, such as an I/O error, is not waited on.)
                    let deadline = Instant::now() + CHECKPOINT_WAIT;
                    while is_busy(&wal.checkpoint())
                        && pages >= CHECKPOINT_WAIT_AT
                        && Instant::now() < deadline
                    {
                        std::thread::sleep(CHECKPOINT_RETRY);
                    }
                } else if pages >= CHECKPOINT_AT {
                    request(&hook);
                }
                Ok(())
            }))
            .map_err(Error::db("set the writer's WAL hook"))?;
        Ok(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
            shared,
        })
    }

    /// Asks for a passive checkpoint soon (the housekeeping tick's, for
    /// pages other connections committed).
    pub(crate) fn request(&self) {
        if let Some(wake) = &self.wake {
            request(wake);
        }
    }

    /// Checkpoints the thread has run.
    #[cfg(test)]
    fn done(&self) -> u64 {
        self.shared.done.load(Ordering::Relaxed)
    }

    /// Times the thread started the WAL over.
    #[cfg(test)]
    fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }

    /// The WAL's pages after the writer's last commit.
    #[cfg(test)]
    fn pages(&self) -> i32 {
        self.shared.pages.load(Ordering::Relaxed)
    }

    /// The most pages the WAL held after a writer's commit.
    #[cfg(test)]
    fn most_pages(&self) -> i32 {
        self.shared.most_pages.load(Ordering::Relaxed)
    }

    /// Removes `writer`'s WAL hook (restoring SQLite's auto-checkpoint) and
    /// waits for the thread to finish its checkpoint and close its
    /// connection.
    pub(crate) fn stop(mut self, writer: &mut Connection) {
        // Dropping the hook drops its sender; the thread ends when none is left.
        let unhooked = writer
            .wal_hook(None::<fn(&mut rusqlite::hooks::Wal, c_int) -> rusqlite::Result<()>>)
            .and_then(|()| writer.execute_batch("PRAGMA wal_autocheckpoint = 1000"));
        if let Err(e) = unhooked {
            tracing::warn!(error = %e, "cannot restore the writer's auto-checkpoint");
        }
        self.wake = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// When the thread tries its next restart.
#[derive(Debug)]
struct RestartState {
    /// The WAL's pages from which to try (see [`checkpoint`]).
    at: c_int,
    /// The WAL's pages at the last restart that took: until someone writes,
    /// the WAL still reports them, and a restart then has nothing to do.
    done_at: Option<c_int>,
}

impl Default for RestartState {
    fn default() -> RestartState {
        RestartState {
            at: RESTART_AT,
            done_at: None,
        }
    }
}

/// One wake-up of the thread: a passive checkpoint, then a restart when it
/// copied every page of a WAL of `state.at` pages or more, unless the last
/// restart already covered them. After a restart that failed (the write
/// lock was taken, or a reader was still in the WAL: then the try held the
/// write lock while it copied, for nothing), the next try waits for the WAL
/// to grow by [`CHECKPOINT_AT`] pages.
fn checkpoint(conn: &Connection, shared: &Shared, state: &mut RestartState) {
    match conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
        Ok((pages, copied)) => {
            shared.done.fetch_add(1, Ordering::Relaxed);
            if pages < RESTART_AT {
                *state = RestartState::default();
            } else if pages >= state.at && copied == pages && state.done_at != Some(pages) {
                if restart(conn, shared) {
                    *state = RestartState {
                        at: RESTART_AT,
                        done_at: Some(pages),
                    };
                } else {
                    state.at = pages.saturating_add(CHECKPOINT_AT);
                }
            }
        }
        Err(e) => tracing::debug!(error = %e, "checkpoint failed; will retry"),
    }
}

/// Starts the WAL over, after a passive checkpoint copied every page it
/// found: a RESTART checkpoint takes the write lock (or, finding it taken,
/// does nothing more than a passive one), copies the few pages committed
/// since, and lets the next commit write from the WAL's start. The write
/// lock is held for that copy and its fsync only: a writer that finds it
/// taken waits as for any other writer (in its busy handler; a host's
/// deferred transaction that read before it writes gets SQLITE_BUSY at
/// once, as it would beside the relay's own writes). True when the WAL
/// will start over.
fn restart(conn: &Connection, shared: &Shared) -> bool {
    shared.restart_tries.fetch_add(1, Ordering::Relaxed);
    match conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::RESTART) {
        Ok(_) => {
            shared.restarts.fetch_add(1, Ordering::Relaxed);
            true
        }
        // A writer, or a reader still in the WAL, was in the way.
        Err(e) => {
            tracing::trace!(error = %e, "cannot start the WAL over yet");
            false
        }
    }
}

/// True when a checkpoint found the checkpoint lock taken.
fn is_busy(r: &rusqlite::Result<()>) -> bool {
    matches!(r, Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy))
}

/// Wakes the thread unless a wake-up is already waiting for it (or it has
/// ended).
fn request(wake: &Sender<()>) {
    let _ = wake.try_send(());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(f: Box<dyn FnOnce() + Send>) -> Result<JoinHandle<()>> {
        Ok(std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(f)
            .unwrap())
    }

    /// The writer's commits wake the thread, which checkpoints on its own
    /// connection; under commits without a pause the WAL stays within
    /// CHECKPOINT_WAIT_AT pages, and it starts over once they slow down.
    #[test]
    fn the_writers_commits_are_checkpointed_by_the_thread_and_the_wal_starts_over() {
        let (dir, mut writer) = crate::schema::test_db();
        let path = dir.path().join("test.db");
        let checkpointer = Checkpointer::start(&path, &mut writer, spawn).unwrap();
        let auto: i64 = writer
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(auto, 0, "the hook replaces the writer's auto-checkpoint");
        // Commits without an fsync: the test is about pages, not durability.
        writer
            .execute_batch("PRAGMA synchronous = OFF; CREATE TABLE t (x BLOB)")
            .unwrap();
        let insert = |w: &Connection| {
            w.execute("INSERT INTO t VALUES (zeroblob(3000))", [])
                .unwrap();
        };
        // 50,000 commits of a page or more (a b-tree split writes several),
        // many times the WAL's size; the most pages one commit added.
        let mut most_added = 0;
        for _ in 0..50_000 {
            let before = checkpointer.pages();
            insert(&writer);
            most_added = most_added.max(checkpointer.pages() - before);
        }
        assert!(checkpointer.done() > 0, "the thread ran no checkpoint");
        // Past CHECKPOINT_WAIT_AT the writer waited for its own checkpoint,
        // so the WAL never held more than one commit beyond it.
        assert!(
            checkpointer.most_pages() < CHECKPOINT_WAIT_AT + most_added,
            "the WAL reached {} pages (one commit adds at most {most_added})",
            checkpointer.most_pages()
        );
        // Then one commit a millisecond: the WAL must start over (a commit
        // then finds it nearly empty) within a few seconds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            insert(&writer);
            if checkpointer.pages() < CHECKPOINT_AT {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the WAL never started over: {} pages",
                checkpointer.pages()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        checkpointer.stop(&mut writer);
        let auto: i64 = writer
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(auto, 1000, "stop restores SQLite's auto-checkpoint");
    }

    /// Beside another connection committing as often as the writer, the
    /// WAL still starts over before the writer has to checkpoint in its
    /// own commits: the thread's passive checkpoints alone never find a
    /// moment with every page copied (a commit always lands during their
    /// fsync), its restart makes one.
    #[test]
    fn beside_a_busy_host_the_wal_starts_over_before_the_writer_must_checkpoint() {
        let (dir, mut writer) = crate::schema::test_db();
        let path = dir.path().join("test.db");
        writer
            .execute_batch("CREATE TABLE t (x BLOB); CREATE TABLE h (x BLOB)")
            .unwrap();
        let checkpointer = Checkpointer::start(&path, &mut writer, spawn).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let host = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let host = crate::connection::open(&path).unwrap();
                host.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    host.execute("INSERT INTO h VALUES (zeroblob(3000))", [])
                        .unwrap();
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
        };
        writer.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
        // Commit until the WAL has passed RESTART_AT and then started
        // over, or has reached the size where the writer checkpoints.
        let (mut passed, mut started_over) = (false, false);
        // Where an fsync costs nothing (a tmpfs), the passive checkpoints
        // finish between commits and the WAL starts over by itself long
        // before RESTART_AT: then there is nothing to show. 4,000 commits
        // are 8 times what passing RESTART_AT takes where fsyncs cost.
        for _ in 0..4_000 {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(3000))", [])
                .unwrap();
            let pages = checkpointer.pages();
            if pages >= CHECKPOINT_INLINE_AT {
                break;
            }
            passed |= pages >= RESTART_AT;
            if passed && pages < RESTART_AT {
                started_over = true;
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        stop.store(true, Ordering::Relaxed);
        host.join().unwrap();
        if !passed {
            eprintln!(
                "the WAL never reached {RESTART_AT} pages: fsyncs cost nothing on this \
                 file system, so the passive checkpoints start it over by themselves"
            );
            checkpointer.stop(&mut writer);
            return;
        }
        assert!(
            started_over,
            "the WAL reached {} pages before starting over ({} restarts)",
            checkpointer.pages(),
            checkpointer.restarts()
        );
        checkpointer.stop(&mut writer);
    }

    /// A reader still in the WAL makes the restart fail; the next try waits
    /// until the WAL has grown by CHECKPOINT_AT pages, a restart that took
    /// is not repeated while nobody writes, and a WAL started over resets.
    #[test]
    fn a_failed_restart_is_tried_again_only_after_the_wal_has_grown() {
        let (dir, mut writer) = crate::schema::test_db();
        let path = dir.path().join("test.db");
        writer.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        // The WAL's pages after each commit (the hook also turns the
        // writer's auto-checkpoint off).
        let wal_pages = Arc::new(AtomicI32::new(0));
        let seen = wal_pages.clone();
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, n: c_int| {
                seen.store(n, Ordering::Relaxed);
                Ok(())
            }))
            .unwrap();
        let conn = crate::connection::open(&path).unwrap();
        conn.busy_timeout(Duration::ZERO).unwrap();
        let shared = Shared::default();
        let pages = || wal_pages.load(Ordering::Relaxed);
        let grow_to = |n: i32| {
            while pages() < n {
                writer
                    .execute("INSERT INTO t VALUES (zeroblob(3000))", [])
                    .unwrap();
            }
        };
        let tries = |s: &Shared| s.restart_tries.load(Ordering::Relaxed);
        let restarts = |s: &Shared| s.restarts.load(Ordering::Relaxed);
        // A reader that reads the newest pages and stays: every page can
        // be copied, and the WAL cannot start over.
        let reader = crate::connection::open(&path).unwrap();
        let read_newest = || {
            if !reader.is_autocommit() {
                reader.execute_batch("COMMIT").unwrap();
            }
            reader.execute_batch("BEGIN").unwrap();
            reader
                .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap();
        };
        let mut state = RestartState::default();

        grow_to(RESTART_AT);
        read_newest();
        checkpoint(&conn, &shared, &mut state);
        assert_eq!((tries(&shared), restarts(&shared)), (1, 0));
        let next = state.at;
        assert!(next >= RESTART_AT + CHECKPOINT_AT, "{next}");
        // Nothing new, then less than CHECKPOINT_AT pages more: no try.
        checkpoint(&conn, &shared, &mut state);
        grow_to(next - CHECKPOINT_AT / 2);
        read_newest();
        checkpoint(&conn, &shared, &mut state);
        assert_eq!(tries(&shared), 1);
        // CHECKPOINT_AT pages more: tried again (and failed again).
        grow_to(next);
        read_newest();
        checkpoint(&conn, &shared, &mut state);
        assert_eq!((tries(&shared), restarts(&shared)), (2, 0));

        // The reader gone, the next try takes; until someone writes, the
        // WAL reports the same pages and the thread does not try again.
        reader.execute_batch("COMMIT").unwrap();
        grow_to(state.at);
        checkpoint(&conn, &shared, &mut state);
        assert_eq!((tries(&shared), restarts(&shared)), (3, 1));
        checkpoint(&conn, &shared, &mut state);
        assert_eq!(tries(&shared), 3);
        // The next commit starts the WAL over: the state resets.
        writer
            .execute("INSERT INTO t VALUES (zeroblob(3000))", [])
            .unwrap();
        assert!(pages() < 10, "{} pages", pages());
        checkpoint(&conn, &shared, &mut state);
        assert_eq!(state.at, RESTART_AT);
        assert_eq!(state.done_at, None);
    }
}
