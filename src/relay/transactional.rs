//! Transactional consumers: a consumer's own writes, the check of the
//! claim and its progress row commit in one SQLite transaction, so its
//! effect happens exactly once (see
//! [`TransactionalConsumer`](crate::consumer::TransactionalConsumer) and
//! docs/exactly-once.md).
//!
//! ## Where it runs
//!
//! On the **worker thread** that took the job, on a write connection of
//! that worker's own, opened on its first transactional delivery with
//! [`connection::open`](crate::connection::open) (WAL, outboxd's busy
//! handler, `synchronous=FULL`) and kept for the worker's life. Not on the
//! writer thread: the writer would be blocked for as long as each consumer
//! runs, and with it every claim, heartbeat and outcome of the relay.
//!
//! `synchronous=FULL`, not the writer's NORMAL: this commit is the moment
//! the consumer's effect becomes visible to the host, which may act on it
//! (serve a search hit, show a counter). Under NORMAL a power cut can undo
//! a commit others already saw. (The effect and its ledger entry would
//! still vanish together, so exactness would hold; durability would not.)
//!
//! ## One delivery, step by step
//!
//! 1. `BEGIN IMMEDIATE`: take SQLite's write lock now, so nothing below can
//!    fail for a lock (a deferred transaction that read first could not
//!    upgrade after another commit). SQLITE_BUSY after the busy handler's
//!    wait is tried again, [`BUSY_TRIES`] times in all, then reported as a
//!    retry.
//! 2. The claim: the row still carries this relay's token and is pending
//!    ([`fenced::holds`]). Otherwise another relay took the row over (or
//!    this one released it): roll back, run nothing. The writer fences the
//!    outcome out as well. Nobody can take the claim over *during* the
//!    function: that is a write, and this transaction holds the only write
//!    lock until it ends.
//! 3. The ledger: an entry for (event, consumer) means it is done already
//!    (another row with the same event id, or this row before a crash):
//!    roll back, report delivered, run nothing.
//! 4. The function, with panics caught. A commit or rollback it makes
//!    itself is vetoed (a commit hook turns it into a rollback) and the
//!    event is dead-lettered: see [`Guard`].
//! 5. Delivered: write the ledger entry ([`dedup::record`]) and commit.
//!    Anything else: roll back. Either way the outcome goes to the writer,
//!    which records the row's fate as for any consumer; its own ledger
//!    insert for a delivered transactional consumer is `INSERT OR IGNORE`
//!    of the entry committed here, so there is one entry, no conflict.
//!
//! SQLite hands its lock to no one in particular: a waiter sleeps in its
//! busy handler and tries again, while a worker that has just committed
//! begins its next delivery at once, so a worker draining a backlog would
//! take the lock back again and again while the host's commit and the
//! relay's writer sleep. So a worker whose `BEGIN IMMEDIATE` had to wait
//! ([`CONTENDED_WAIT`]) leaves the lock free for [`CONTENDED_PAUSE`] after
//! its commit, as the writer does after a full transaction under
//! contention.
//!
//! A crash between step 5's commit and the writer's record leaves the row
//! pending under an expiring lease. Its next claim reads the ledger
//! ([`dedup::delivered_to_sql!`](crate::dedup)) and does not route the row
//! to this consumer again.

use crate::relay::fenced;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::job::Job;
use super::panic::panic_message;
use super::plan::CONTENDED_PAUSE;
use crate::clock::Clock;
use crate::consumer::{Delivery, Outcome, TransactionalConsumer};

/// How many times `BEGIN IMMEDIATE` is tried when each try ends in
/// SQLITE_BUSY after the busy handler's wait
/// ([`DEFAULT_BUSY_TIMEOUT`](crate::connection::DEFAULT_BUSY_TIMEOUT)), before
/// the delivery is reported as a retry.
const BUSY_TRIES: u32 = 3;

/// A `BEGIN IMMEDIATE` that waited this long met another writer: after
/// its commit the worker leaves the lock free for [`CONTENDED_PAUSE`].
const CONTENDED_WAIT: Duration = Duration::from_micros(200);

/// After [`BUSY_TRIES`], the retry waits at least this long.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A worker's transactional state: its connection, opened when first
/// needed, and the guard watching it.
pub(crate) struct Session {
    path: Arc<PathBuf>,
    clock: Arc<dyn Clock>,
    conn: Option<(Connection, Arc<Guard>)>,
}

/// Watches the worker's connection for a transaction the consumer's function
/// ends itself. While the function runs (`in_function`), a commit hook
/// vetoes every commit (SQLite rolls it back and the statement fails with
/// SQLITE_CONSTRAINT_COMMITHOOK) and a rollback hook notes every rollback:
/// either way `ended` is set, and the delivery is dead-lettered, since the
/// function's writes can no longer commit with their ledger entry and the
/// claim check. Without the veto, `COMMIT; BEGIN` inside the function
/// would commit half its effect with no ledger entry, and a retry would
/// apply it twice.
///
/// A rollback SQLite makes itself, after an error that takes the whole
/// transaction down (out of memory, a full disk, an I/O error), is no
/// consumer's doing: [`rolled_back_by_sqlite`] tells it apart, and the
/// consumer's verdict stands (never delivered: nothing of it remains).
#[derive(Default)]
struct Guard {
    in_function: AtomicBool,
    ended: AtomicBool,
    /// A commit was vetoed: the function ran COMMIT (or END) itself.
    vetoed: AtomicBool,
}

impl Guard {
    fn install(conn: &mut Connection) -> rusqlite::Result<Arc<Guard>> {
        let guard = Arc::new(Guard::default());
        let g = guard.clone();
        conn.commit_hook(Some(move || {
            let inside = g.in_function.load(Ordering::Relaxed);
            if inside {
                g.ended.store(true, Ordering::Relaxed);
                g.vetoed.store(true, Ordering::Relaxed);
            }
            inside // true turns the commit into a rollback
        }))?;
        let g = guard.clone();
        conn.rollback_hook(Some(move || {
            if g.in_function.load(Ordering::Relaxed) {
                g.ended.store(true, Ordering::Relaxed);
            }
        }))?;
        Ok(guard)
    }
}

impl Session {
    pub(crate) fn new(path: Arc<PathBuf>, clock: Arc<dyn Clock>) -> Session {
        Session {
            path,
            clock,
            conn: None,
        }
    }

    /// The worker's connection, opened (and guarded) on first use.
    fn connection(&mut self) -> crate::Result<&mut (Connection, Arc<Guard>)> {
        if self.conn.is_none() {
            let mut conn = crate::connection::open(&*self.path)?;
            let guard = Guard::install(&mut conn)
                .map_err(crate::Error::db("watch the consumer's transaction"))?;
            self.conn = Some((conn, guard));
        }
        Ok(self.conn.as_mut().expect("opened above"))
    }

    /// One delivery to a transactional consumer registered as `name`; see
    /// the module doc for the steps.
    pub(crate) fn deliver(
        &mut self,
        consumer: &dyn TransactionalConsumer,
        name: &str,
        job: &Job,
        delivery: &Delivery,
    ) -> Outcome {
        let clock = self.clock.clone();
        let (conn, guard) = match self.connection() {
            Ok(c) => c,
            Err(e) => return Outcome::retry(format!("cannot open the consumer's connection: {e}")),
        };
        let asked = Instant::now();
        let tx = match begin(conn) {
            Ok(tx) => tx,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
                return Outcome::retry_after(
                    format!(
                        "the database stayed locked by another connection through {BUSY_TRIES} \
                         waits of {:?}; nothing was written",
                        crate::connection::DEFAULT_BUSY_TIMEOUT
                    ),
                    BUSY_RETRY_AFTER,
                )
            }
            Err(e) => {
                return Outcome::retry(format!("cannot begin the consumer's transaction: {e}"))
            }
        };
        let waited = asked.elapsed();
        match fenced::holds(&tx, job.row_id, &job.token) {
            Ok(true) => {}
            // The writer's record of this outcome is fenced out too.
            Ok(false) => {
                return Outcome::retry(
                    "the claim passed to another relay before the transaction began; \
                     nothing was written",
                )
            }
            Err(e) => return Outcome::retry(format!("cannot check the claim: {e}")),
        }
        match crate::dedup::is_recorded(&tx, &job.event_key, name) {
            Ok(false) => {}
            Ok(true) => {
                tracing::debug!("the ledger has this event for the consumer already; not run");
                return Outcome::Delivered;
            }
            Err(e) => return Outcome::retry(format!("cannot read the ledger: {e}")),
        }

        guard.ended.store(false, Ordering::Relaxed);
        guard.vetoed.store(false, Ordering::Relaxed);
        guard.in_function.store(true, Ordering::Relaxed);
        let ran = catch_unwind(AssertUnwindSafe(|| consumer.deliver(&tx, delivery)));
        guard.in_function.store(false, Ordering::Relaxed);
        let ended = guard.ended.load(Ordering::Relaxed) || tx.is_autocommit();
        let by_sqlite = (ended && !guard.vetoed.load(Ordering::Relaxed))
            .then(|| rolled_back_by_sqlite(&tx))
            .flatten();
        if let Some(error) = by_sqlite {
            return match ran {
                Ok(Outcome::Retry { reason, after }) => Outcome::Retry {
                    reason: format!("{reason} (SQLite rolled the transaction back)"),
                    after,
                },
                Ok(poison @ Outcome::Poison { .. }) => poison,
                Ok(_) => Outcome::retry(format!(
                    "SQLite rolled the consumer's transaction back after an error ({error}); \
                     nothing it wrote remains"
                )),
                Err(panic) => Outcome::retry(format!(
                    "consumer panicked: {} (SQLite had rolled the transaction back after an \
                     error: {error})",
                    panic_message(&*panic)
                )),
            };
        }
        if ended {
            // A vetoed commit has rolled back already; anything else the
            // function left open is rolled back when `tx` drops.
            return Outcome::poison(
                "the consumer ended outboxd's transaction itself (COMMIT, ROLLBACK or END); \
                 its writes were rolled back; a transactional consumer must leave the \
                 transaction to outboxd (use SAVEPOINT for a partial undo), then requeue",
            );
        }
        let outcome = ran.unwrap_or_else(|panic| {
            Outcome::retry(format!("consumer panicked: {}", panic_message(&*panic)))
        });
        if outcome != Outcome::Delivered {
            if let Err(e) = tx.rollback() {
                // The connection rolls an unfinished transaction back on
                // its next BEGIN failure or on close; say so, go on.
                tracing::warn!(error = %e, "cannot roll the consumer's transaction back");
            }
            return outcome;
        }
        let committed = crate::dedup::record(&tx, &job.event_key, name, job.row_id, clock.now())
            .and_then(|()| tx.commit());
        match committed {
            Ok(()) => {
                if waited >= CONTENDED_WAIT {
                    // Others wait for the lock (this transaction had to):
                    // leave it free a moment, or this worker, not asleep
                    // in a busy handler as they are, takes it straight
                    // back for its next delivery.
                    std::thread::sleep(CONTENDED_PAUSE);
                }
                Outcome::Delivered
            }
            // Dropping `tx` rolled back whatever had not committed.
            Err(e) => Outcome::retry(format!(
                "cannot commit the consumer's transaction (rolled back): {e}"
            )),
        }
    }
}

/// The error after which SQLite rolled the transaction back by itself, as
/// the connection's last error says: out of memory, a full disk, an I/O
/// error or an interrupt, which end a whole transaction (not only their
/// statement). None for anything else, such as a ROLLBACK the function ran
/// (which succeeds, leaving no error).
fn rolled_back_by_sqlite(conn: &Connection) -> Option<String> {
    use rusqlite::ffi;
    // SAFETY: the handle is valid while `conn` lives and is used on this
    // thread only; the message is copied before any other call on it.
    let (code, message) = unsafe {
        let db = conn.handle();
        let message = std::ffi::CStr::from_ptr(ffi::sqlite3_errmsg(db));
        (
            ffi::sqlite3_extended_errcode(db) & 0xff,
            message.to_string_lossy().into_owned(),
        )
    };
    matches!(
        code,
        ffi::SQLITE_NOMEM | ffi::SQLITE_FULL | ffi::SQLITE_IOERR | ffi::SQLITE_INTERRUPT
    )
    .then_some(message)
}

/// `BEGIN IMMEDIATE`, tried [`BUSY_TRIES`] times while it meets SQLITE_BUSY.
fn begin(conn: &Connection) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    let mut tries = 1;
    loop {
        // `new_unchecked` borrows the connection shared, so a failed try
        // does not hold it (rusqlite's `&mut` form cannot be retried in a
        // loop that returns its transaction). The connection is this
        // worker's alone and never has a transaction open here.
        match rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && tries < BUSY_TRIES =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}
