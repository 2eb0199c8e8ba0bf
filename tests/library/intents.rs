//! Publish intents against a fake outside service (issue 7).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use outboxd::intents::{
    self, Completion, IntentError, IntentKey, IntentStatus, Intents, SendResult,
};
use outboxd::{ManualClock, Outcome, Timestamp};
use rusqlite::Connection;

use crate::common;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const WAIT: Duration = Duration::from_secs(10);

/// A database file in a temporary directory; each `open` is a new connection.
struct TestDb {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TestDb {
    fn new() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&path).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        TestDb { _dir: dir, path }
    }

    fn open(&self) -> Connection {
        outboxd::connection::open(&self.path).unwrap()
    }
}

/// The outside system: it stores posted bodies and can find one by a marker.
#[derive(Default)]
struct Service {
    bodies: Mutex<Vec<String>>,
    lookups: AtomicUsize,
}

impl Service {
    fn post(&self, body: String) -> Result<String, String> {
        let mut bodies = self.bodies.lock().unwrap();
        bodies.push(body);
        Ok(format!("post-{}", bodies.len()))
    }

    fn find_by_marker(&self, marker: &str) -> Result<Option<String>, String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let bodies = self.bodies.lock().unwrap();
        Ok(bodies
            .iter()
            .position(|b| b.contains(marker))
            .map(|i| format!("post-{}", i + 1)))
    }

    fn posts(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }
}

fn body(marker: &str) -> String {
    format!("Thanks!\n<!-- {marker} -->")
}

fn never_lookup(_: &str) -> Result<Option<String>, String> {
    panic!("the look-up must not be called")
}

fn never_post(_: &str) -> Result<String, String> {
    panic!("the post must not be called")
}

fn day(n: u32) -> Timestamp {
    // 2026-11-01T00:00:00Z plus n days.
    Timestamp::from_millis(1_793_491_200_000 + i64::from(n) * DAY.as_millis() as i64)
}

/// Removes the lock file of the sender that claims `key`: its claim is then
/// judged by its end time (docs/liveness.md).
fn forget_lock_file(db: &TestDb, key: &IntentKey) {
    let token: String = db
        .open()
        .query_row(
            "SELECT claim_token FROM publish_intents WHERE marker = ?1",
            [key.marker()],
            |r| r.get(0),
        )
        .unwrap();
    std::fs::remove_file(common::peers::lock_file(&db.path, &token)).unwrap();
}

fn status(conn: &Connection, key: &IntentKey) -> (IntentStatus, u32) {
    let i = intents::get(conn, key).unwrap().expect("the intent exists");
    (i.status, i.attempts)
}

#[test]
fn a_crash_after_the_post_is_followed_by_a_retry_that_posts_nothing() {
    let db = TestDb::new();
    let conn = db.open();
    let service = Service::default();
    let key = IntentKey::tenant("acme", "comment/article-7").unwrap();

    // The service accepts the post, then the worker dies before the result
    // is recorded.
    let died = catch_unwind(AssertUnwindSafe(|| {
        intents::send(
            &conn,
            &key,
            |m| service.find_by_marker(m),
            |m| {
                service.post(body(m)).unwrap();
                panic!("worker killed between the post and its record");
            },
        )
    }));
    assert!(died.is_err());
    assert_eq!(service.posts(), 1);
    let intent = intents::get(&conn, &key).unwrap().unwrap();
    assert_eq!(
        intent.status,
        IntentStatus::Failed,
        "the claim was released"
    );
    assert!(intent.last_error.unwrap().contains("panicked"));
    assert_eq!(intent.result, None);

    // The retry finds the comment by its marker and posts nothing.
    let retry = intents::send(&conn, &key, |m| service.find_by_marker(m), never_post).unwrap();
    assert_eq!(retry.how, Completion::Found);
    assert_eq!(retry.result(), "post-1");
    assert_eq!(retry.intent.status, IntentStatus::Completed);
    assert_eq!(retry.intent.attempts, 2);
    assert_eq!(service.posts(), 1);
}

/// A sender whose claim names no lock file (an older sender's, or its file
/// removed) holds the intent until the claim's end time, as every claim did
/// before liveness (docs/liveness.md).
#[test]
fn a_sender_without_a_lock_file_holds_the_intent_until_its_claim_ends() {
    let db = TestDb::new();
    let clock = ManualClock::new(day(1));
    let lease = Duration::from_secs(60);
    let intents = Intents::new().clock(clock.clone()).lease(lease).unwrap();
    let a_intents = Intents::new().clock(clock.clone()).lease(lease).unwrap();
    let service = Arc::new(Service::default());
    let key = IntentKey::system("ticket/42").unwrap();

    // Sender A posts, then hangs (as good as dead) before recording.
    let (a_posted, a_has_posted) = mpsc::channel();
    let (a_go, a_wait) = mpsc::channel::<()>();
    let a = thread::spawn({
        let (intents, service, key, conn) = (a_intents, service.clone(), key.clone(), db.open());
        move || {
            intents.send(
                &conn,
                &key,
                |m| service.find_by_marker(m),
                |m| {
                    service.post(body(m)).unwrap();
                    a_posted.send(()).unwrap();
                    a_wait.recv().unwrap();
                    Err::<String, _>("connection reset before the response".to_string())
                },
            )
        }
    });
    a_has_posted.recv_timeout(WAIT).unwrap();
    forget_lock_file(&db, &key);

    // While A's claim lives, nobody else looks or posts.
    let conn = db.open();
    let e = intents
        .send(&conn, &key, never_lookup, never_post)
        .unwrap_err();
    let IntentError::InFlight {
        attempt,
        until,
        wait,
        ..
    } = &e
    else {
        panic!("expected InFlight, got {e}");
    };
    assert_eq!((*attempt, *until, *wait), (1, day(1).plus(lease), lease));
    assert_eq!(e.outcome(), Outcome::retry_after(e.to_string(), lease));

    // The claim ends; sender B takes over and stops inside its look-up.
    clock.advance(lease + Duration::from_millis(1));
    let (b_looking, b_is_looking) = mpsc::channel();
    let (b_go, b_wait) = mpsc::channel::<()>();
    let b = thread::spawn({
        let (intents, service, key, conn) =
            (intents.clone(), service.clone(), key.clone(), db.open());
        move || {
            intents.send(
                &conn,
                &key,
                |m| {
                    b_looking.send(()).unwrap();
                    b_wait.recv().unwrap();
                    service.find_by_marker(m)
                },
                never_post,
            )
        }
    });
    b_is_looking.recv_timeout(WAIT).unwrap();

    // A wakes up and fails: its stale claim must not release B's.
    a_go.send(()).unwrap();
    let a_result = a.join().unwrap();
    assert!(matches!(
        a_result,
        Err(IntentError::Send { attempt: 1, .. })
    ));
    assert_eq!(status(&conn, &key), (IntentStatus::Pending, 2));
    assert!(intents
        .send(&conn, &key, never_lookup, never_post)
        .unwrap_err()
        .is_in_flight());

    // B finds A's post and completes the intent from it.
    b_go.send(()).unwrap();
    let done = b.join().unwrap().unwrap();
    assert_eq!(done.how, Completion::Found);
    assert_eq!(done.result(), "post-1");
    assert_eq!(done.intent.last_error, None);
    assert_eq!(service.posts(), 1);
}

/// Issue 10, item 17: the claim records its own end. Before, a sender that
/// found a claim judged it by its own lease, so a sender with a 1-minute
/// lease took over (and posted) two minutes into another's 10-minute claim.
#[test]
fn senders_with_different_leases_respect_each_others_claims() {
    let db = TestDb::new();
    let clock = ManualClock::new(day(1));
    let long = Intents::new()
        .clock(clock.clone())
        .lease(Duration::from_secs(600))
        .unwrap();
    let short = Intents::new()
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .unwrap();
    let service = Service::default();
    let key = IntentKey::system("ticket/7").unwrap();
    let (a, b) = (db.open(), db.open());

    let sent = long
        .send(
            &a,
            &key,
            |m| service.find_by_marker(m),
            |m| {
                // Two minutes into A's post, B (1-minute lease) tries.
                clock.advance(Duration::from_secs(120));
                let e = short.send(&b, &key, never_lookup, never_post).unwrap_err();
                let IntentError::InFlight { until, .. } = e else {
                    panic!("B must wait for A's claim, got {e}")
                };
                assert_eq!(until, day(1).plus(Duration::from_secs(600)));
                service.post(body(m))
            },
        )
        .unwrap();
    assert!(sent.posted());
    assert_eq!(sent.intent.claimed_until(), None, "completed: no claim");
    assert_eq!(service.posts(), 1);
}

/// A post that outlasts its lease extends it; once it has lost the claim
/// (it did not extend in time and another sender took over, which a claim
/// without a lock file allows), extending says so and the post stops
/// before posting.
#[test]
fn a_long_post_extends_its_lease_and_learns_when_it_lost_it() {
    let db = TestDb::new();
    let clock = ManualClock::new(day(1));
    let lease = Duration::from_secs(60);
    let intents = Intents::new().clock(clock.clone()).lease(lease).unwrap();
    let a_intents = Intents::new().clock(clock.clone()).lease(lease).unwrap();
    let service = Service::default();
    let key = IntentKey::system("upload/big").unwrap();
    let (a, b) = (db.open(), db.open());

    let a_sent = a_intents.send_with_lease(
        &a,
        &key,
        |m| service.find_by_marker(m),
        |l| {
            // Judged by the time rule from here (as an older sender is).
            forget_lock_file(&db, &key);
            clock.advance(Duration::from_secs(50));
            let until = l.extend(lease).map_err(|e| e.to_string())?;
            assert_eq!(until, day(1).plus(Duration::from_secs(110)));
            assert_eq!(
                intents::get(&b, &key).unwrap().unwrap().claimed_until(),
                Some(until)
            );
            // Past the first lease, inside the extended one: B waits.
            clock.advance(Duration::from_secs(50));
            let e = intents
                .send(&b, &key, never_lookup, never_post)
                .unwrap_err();
            assert!(e.is_in_flight(), "{e}");
            // A stalls past its extension; B takes over and posts.
            clock.advance(Duration::from_secs(20));
            let b_sent = intents
                .send(
                    &b,
                    &key,
                    |m| service.find_by_marker(m),
                    |m| service.post(body(m)),
                )
                .unwrap();
            assert!(b_sent.posted());
            // A finds out before posting.
            let lost = l.extend(lease).unwrap_err();
            assert!(matches!(lost, IntentError::LeaseLost { .. }), "{lost}");
            Err(lost.to_string())
        },
    );
    let e = a_sent.unwrap_err();
    assert!(e.to_string().contains("passed to another sender"), "{e}");
    assert_eq!(service.posts(), 1, "only B posted");
    let intent = intents::get(&a, &key).unwrap().unwrap();
    assert_eq!(
        intent.status,
        IntentStatus::Completed,
        "A's failure changed nothing"
    );
    assert_eq!(intent.result.as_deref(), Some("post-1"));
}

#[test]
fn concurrent_senders_of_one_intent_post_once() {
    const SENDERS: usize = 4;
    let db = TestDb::new();
    let service = Arc::new(Service::default());
    let key = IntentKey::tenant("acme", "welcome-mail/user-9").unwrap();
    let start = Arc::new(Barrier::new(SENDERS));
    // How many senders were turned away by a live claim at least once.
    let turned_away = Arc::new(AtomicUsize::new(0));

    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (db_path, service, key, start, turned_away) = (
                db.path.clone(),
                service.clone(),
                key.clone(),
                start.clone(),
                turned_away.clone(),
            );
            thread::spawn(move || -> SendResult {
                let conn = outboxd::connection::open(db_path).unwrap();
                let mut was_turned_away = false;
                let deadline = Instant::now() + WAIT;
                start.wait();
                loop {
                    let sent = intents::send(
                        &conn,
                        &key,
                        |m| service.find_by_marker(m),
                        |m| {
                            // Post only once every other sender has tried
                            // (or the deadline passed): without the claim
                            // they would all be here, posting.
                            while turned_away.load(Ordering::SeqCst) < SENDERS - 1
                                && Instant::now() < deadline
                            {
                                thread::yield_now();
                            }
                            service.post(body(m))
                        },
                    );
                    match sent {
                        Ok(done) => return done,
                        Err(e) if e.is_in_flight() => {
                            if !was_turned_away {
                                was_turned_away = true;
                                turned_away.fetch_add(1, Ordering::SeqCst);
                            }
                            assert!(Instant::now() < deadline + WAIT, "never completed");
                            thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            })
        })
        .collect();
    let results: Vec<SendResult> = senders.into_iter().map(|t| t.join().unwrap()).collect();

    assert_eq!(service.posts(), 1);
    assert_eq!(results.iter().filter(|r| r.posted()).count(), 1);
    assert!(results.iter().all(|r| r.result() == "post-1"));
    assert_eq!(turned_away.load(Ordering::SeqCst), SENDERS - 1);
}

#[test]
fn tenants_with_the_same_key_never_share_an_intent() {
    let db = TestDb::new();
    let conn = db.open();
    let service = Service::default();
    let keys = [
        IntentKey::tenant("acme", "invoice/1").unwrap(),
        IntentKey::tenant("globex", "invoice/1").unwrap(),
        IntentKey::system("invoice/1").unwrap(),
        IntentKey::tenant("a:b", "c").unwrap(),
        IntentKey::tenant("a", "b:c").unwrap(),
    ];
    let recorded: Vec<_> = keys
        .iter()
        .map(|k| intents::record(&conn, k).unwrap())
        .collect();
    for (i, a) in recorded.iter().enumerate() {
        assert_eq!(a.key, keys[i]);
        assert_eq!(a.marker, keys[i].marker());
        for b in &recorded[i + 1..] {
            assert_ne!(a.id, b.id);
            assert_ne!(a.marker, b.marker);
        }
    }

    // Each scope posts its own output: one tenant's output never completes
    // another's intent.
    for k in &keys {
        let sent = intents::send(
            &conn,
            k,
            |m| service.find_by_marker(m),
            |m| service.post(body(m)),
        );
        assert!(sent.unwrap().posted(), "{k}");
    }
    assert_eq!(service.posts(), keys.len());
}

#[test]
fn an_intent_completed_yesterday_returns_its_result_today_without_a_call() {
    let db = TestDb::new();
    let clock = ManualClock::new(day(1));
    let intents = Intents::new().clock(clock.clone());
    let service = Service::default();
    let key = IntentKey::tenant("acme", "comment/article-1").unwrap();
    {
        let conn = db.open();
        let sent = intents
            .send(
                &conn,
                &key,
                |m| service.find_by_marker(m),
                |m| service.post(body(m)),
            )
            .unwrap();
        assert_eq!(sent.how, Completion::Posted);
    }

    clock.set(day(2));
    let conn = db.open();
    let today = intents.send(&conn, &key, never_lookup, never_post).unwrap();
    assert_eq!(today.how, Completion::AlreadyCompleted);
    assert_eq!(today.result(), "post-1");
    assert_eq!(today.intent.completed_at, Some(day(1)));
    assert_eq!(today.intent.attempts, 1);
    assert_eq!(service.lookups.load(Ordering::SeqCst), 1);
    assert_eq!(service.posts(), 1);
}

#[test]
fn a_failed_post_is_kept_for_the_operator_and_retried() {
    let db = TestDb::new();
    let conn = db.open();
    let service = Service::default();
    let key = IntentKey::system("mail/reset-password/17").unwrap();

    let e = intents::send(
        &conn,
        &key,
        |m| service.find_by_marker(m),
        |_| Err::<String, _>("503 Service Unavailable".to_string()),
    )
    .unwrap_err();
    assert!(matches!(e, IntentError::Send { attempt: 1, .. }), "{e}");
    assert!(e.to_string().contains("503"), "{e}");
    assert!(matches!(e.outcome(), Outcome::Retry { after: None, .. }));

    let open = intents::list_open(&conn).unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].status, IntentStatus::Failed);
    assert_eq!(open[0].attempts, 1);
    assert!(open[0].last_error.as_deref().unwrap().contains("503"));

    let sent = intents::send(
        &conn,
        &key,
        |m| service.find_by_marker(m),
        |m| service.post(body(m)),
    )
    .unwrap();
    assert_eq!(sent.how, Completion::Posted);
    assert_eq!(sent.intent.attempts, 2);
    assert!(intents::list_open(&conn).unwrap().is_empty());
}

#[test]
fn a_failed_lookup_does_not_post() {
    let db = TestDb::new();
    let conn = db.open();
    let key = IntentKey::system("k").unwrap();
    let e = intents::send(
        &conn,
        &key,
        |_| Err::<Option<String>, _>("search timed out".to_string()),
        never_post,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("look-up failed: search timed out"),
        "{e}"
    );
    assert_eq!(status(&conn, &key), (IntentStatus::Failed, 1));
}

#[test]
fn record_is_idempotent_and_commits_on_its_own() {
    let db = TestDb::new();
    let mut conn = db.open();
    let key = IntentKey::tenant("acme", "k").unwrap();
    let first = intents::record(&conn, &key).unwrap();
    assert_eq!(first.status, IntentStatus::Pending);
    assert_eq!(first.attempts, 0);
    assert_eq!(intents::record(&conn, &key).unwrap(), first);
    assert_eq!(intents::list_open(&conn).unwrap(), vec![first]);

    // Inside the caller's transaction the record could roll back after the
    // post: refused, and nothing is called.
    let tx = conn.transaction().unwrap();
    let other = IntentKey::tenant("acme", "other").unwrap();
    assert!(matches!(
        intents::record(&tx, &other),
        Err(IntentError::InTransaction { .. })
    ));
    let e = intents::send(&tx, &other, never_lookup, never_post).unwrap_err();
    assert!(matches!(e, IntentError::InTransaction { .. }), "{e}");
    assert!(matches!(e.outcome(), Outcome::Poison { .. }));
    drop(tx);
    assert_eq!(intents::get(&conn, &other).unwrap(), None);
}

#[test]
fn list_open_and_purge_completed() {
    let db = TestDb::new();
    let conn = db.open();
    let clock = ManualClock::new(day(1));
    let intents = Intents::new().clock(clock.clone());
    let key = |k: &str| IntentKey::system(k).unwrap();
    let post = |_: &str| Ok::<_, String>("ok".to_string());
    let none = |_: &str| Ok::<_, String>(None);

    for (n, k) in ["done-1", "done-2", "done-3"].iter().enumerate() {
        clock.set(day(1 + n as u32));
        intents.send(&conn, &key(k), none, post).unwrap();
    }
    clock.set(day(4));
    intents
        .send(&conn, &key("failed"), none, |_| {
            Err::<String, _>("boom".into())
        })
        .unwrap_err();
    clock.set(day(5));
    intents.record(&conn, &key("pending")).unwrap();

    let open: Vec<_> = intents
        .list_open(&conn)
        .unwrap()
        .into_iter()
        .map(|i| (i.key.key().to_string(), i.status))
        .collect();
    assert_eq!(
        open,
        [
            ("failed".to_string(), IntentStatus::Failed),
            ("pending".to_string(), IntentStatus::Pending)
        ]
    );

    assert!(intents::purge_completed(&conn, day(10), 0).is_err());
    // Completed before day 3: two rows, removed one per batch.
    assert_eq!(intents::purge_completed(&conn, day(3), 1).unwrap(), 2);
    assert_eq!(intents::get(&conn, &key("done-1")).unwrap(), None);
    assert!(intents::get(&conn, &key("done-3")).unwrap().is_some());
    // Open intents are never purged, however old.
    assert_eq!(intents::purge_completed(&conn, day(100), 100).unwrap(), 1);
    assert_eq!(intents.list_open(&conn).unwrap().len(), 2);
}

#[test]
fn a_purged_intent_is_still_not_posted_twice() {
    let db = TestDb::new();
    let conn = db.open();
    let service = Service::default();
    let key = IntentKey::system("comment/1").unwrap();
    intents::send(
        &conn,
        &key,
        |m| service.find_by_marker(m),
        |m| service.post(body(m)),
    )
    .unwrap();
    let later = Timestamp::now().plus(DAY);
    assert_eq!(intents::purge_completed(&conn, later, 10).unwrap(), 1);

    let again = intents::send(&conn, &key, |m| service.find_by_marker(m), never_post).unwrap();
    assert_eq!(again.how, Completion::Found);
    assert_eq!(service.posts(), 1);
}
