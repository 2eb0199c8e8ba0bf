//! Capture under a real web framework: a Django CMS (from PyPI, in a venv
//! kept under target/) with its default SQLite database, its own migrations
//! and its ORM (tests/contract/django_cms). Its writes become events with
//! the right before and after; a Django migration that rebuilds a captured
//! table drops the triggers, which outboxd reports (`capture list` and
//! `status` exit 1) until `capture apply` restores them.

use crate::common;
use crate::common::venv;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::bin::{code, Outboxd};
use common::wait_until;
use outboxd::{Delivery, Envelope, Outcome, Relay};
use serde_json::{json, Value};

/// Django 5.2 LTS: supports the Python 3.11 of Debian 12.
const DJANGO: &str = "Django~=5.2.0";

/// The CMS project, copied to a temporary folder (makemigrations writes
/// into it).
struct Cms {
    _dir: tempfile::TempDir,
    root: PathBuf,
    python: PathBuf,
}

impl Cms {
    fn new(python: PathBuf) -> Cms {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract/django_cms");
        copy_dir(&src, dir.path());
        Cms {
            root: dir.path().to_path_buf(),
            _dir: dir,
            python,
        }
    }

    fn db(&self) -> PathBuf {
        self.root.join("db.sqlite3")
    }

    /// Runs `cms_host.py ARG` and returns its JSON report.
    fn host(&self, arg: &str, env: &[(&str, &str)]) -> Value {
        let out = Command::new(&self.python)
            .arg(self.root.join("cms_host.py"))
            .arg(arg)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cms_host.py {arg} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The outboxd binary on the CMS's database, through the tests' one
    /// harness (tests/common/bin.rs).
    fn outboxd(&self) -> Outboxd {
        Outboxd::on(self.db())
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() == "__pycache__" {
                continue;
            }
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

const CAPTURE: &str = r#"
[[capture]]
table = "cms_page"
event_type = "page.{op}.v1"
columns = ["slug", "title", "status"]

[[capture]]
table = "cms_comment"
event_type = "comment.{op}.v1"
columns = ["page_id", "author", "body"]
ordering_key = "page:{page_id}"
"#;

/// Delivers everything in the outbox to a recording consumer and returns
/// the envelopes in delivery order.
fn deliver(db: &Path, expect: usize) -> Vec<Envelope> {
    deliveries(db, expect)
        .into_iter()
        .map(|d| d.envelope)
        .collect()
}

/// The same, the whole deliveries (their ordering keys).
fn deliveries(db: &Path, expect: usize) -> Vec<Delivery> {
    let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let record = seen.clone();
    let relay = Relay::builder(db)
        .consumer("cms-feed", ["*"], move |d: &Delivery| {
            record.lock().unwrap().push(d.clone());
            Outcome::Delivered
        })
        .workers(1)
        .build()
        .unwrap()
        .start()
        .unwrap();
    wait_until(
        "the CMS's events delivered",
        Duration::from_secs(30),
        || seen.lock().unwrap().len() >= expect,
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), expect, "no more than expected");
    got
}

fn payload(e: &Envelope) -> Value {
    serde_json::from_str(e.payload.get()).unwrap()
}

#[test]
fn a_django_cms_is_captured_through_its_orm_and_its_migrations() {
    let Some(python) = venv::python_with(DJANGO, "import django") else {
        return;
    };
    let cms = Cms::new(python);
    let migrated = cms.host("migrate", &[]);
    assert_eq!(migrated["migrations"], json!(["0001_initial.py"]));

    let config = cms.root.join("capture.toml");
    std::fs::write(&config, CAPTURE).unwrap();
    let config = config.to_str().unwrap();
    cms.outboxd().ok(&["capture", "apply", "--config", config]);

    let ids = cms.host("write", &[]);
    let (page, comment, bye) = (&ids["page"], &ids["comment"], &ids["bye"]);
    let events = deliver(&cms.db(), 6);
    let got: Vec<(String, Value)> = events
        .iter()
        .map(|e| (e.event_type.to_string(), payload(e)))
        .collect();
    let hello_draft = json!({"slug": "hello", "title": "Hello", "status": "draft"});
    let hello_pub = json!({"slug": "hello", "title": "Hello, world", "status": "published"});
    let ann = json!({"page_id": page, "author": "ann", "body": "Nice!"});
    let bye_page = json!({"slug": "bye", "title": "Bye", "status": "draft"});
    let want = vec![
        (
            "page.created.v1",
            json!({"op": "c", "table": "cms_page", "key": {"id": page}, "before": null, "after": hello_draft}),
        ),
        (
            "page.updated.v1",
            json!({"op": "u", "table": "cms_page", "key": {"id": page}, "before": hello_draft, "after": hello_pub}),
        ),
        (
            "comment.created.v1",
            json!({"op": "c", "table": "cms_comment", "key": {"id": comment}, "before": null, "after": ann}),
        ),
        (
            "comment.deleted.v1",
            json!({"op": "d", "table": "cms_comment", "key": {"id": comment}, "before": ann, "after": null}),
        ),
        (
            "page.created.v1",
            json!({"op": "c", "table": "cms_page", "key": {"id": bye}, "before": null, "after": bye_page}),
        ),
        (
            "page.deleted.v1",
            json!({"op": "d", "table": "cms_page", "key": {"id": bye}, "before": bye_page, "after": null}),
        ),
    ];
    let mut want: Vec<(String, Value)> =
        want.into_iter().map(|(t, p)| (t.to_string(), p)).collect();
    // Delivery keeps each row's order (its ordering key); rows are not held
    // back for one another.
    let mut got = got;
    let row = |(_, p): &(String, Value)| (p["table"].to_string(), p["key"].to_string());
    got.sort_by_key(row);
    want.sort_by_key(row);
    assert_eq!(got, want);

    // A migration that adds a NOT NULL field: Django rebuilds cms_page
    // (new table, copy, drop, rename), and the triggers go with the old one.
    let migrated = cms.host("migrate", &[("CMS_WITH_SUMMARY", "1")]);
    assert_eq!(
        migrated["migrations"],
        json!(["0001_initial.py", "0002_page_summary.py"])
    );
    // capture list reports the drift, and exits 1.
    let text = cms
        .outboxd()
        .expect(&["capture", "list", "--config", config], code::PROBLEMS);
    assert!(text.contains("outboxd_capture_insert_cms_page"), "{text}");
    assert!(text.contains("missing since some time after"), "{text}");
    assert!(text.contains("were not captured"), "{text}");
    let status = cms.outboxd().expect(&["status"], code::PROBLEMS);
    assert!(status.contains("capture: capture of cms_page"), "{status}");
    // The comments' triggers were not touched.
    assert!(!text.contains("cms_comment: PROBLEM"), "{text}");

    // apply says what it reinstalled, and records the gap, which stays a
    // problem (status, list, doctor) until a snapshot covers it.
    let out = cms.outboxd().ok(&["capture", "apply", "--config", config]);
    assert!(out.contains("cms_page: updated"), "{out}");
    assert!(
        out.contains("reinstalled missing outboxd_capture_before_insert_cms_page, "),
        "{out}"
    );
    assert!(out.contains("gap 1 recorded"), "{out}");
    let text = cms
        .outboxd()
        .expect(&["capture", "list", "--config", config], code::PROBLEMS);
    assert!(
        text.contains("cms_page: intact; 1 open gap; matches the config"),
        "{text}"
    );
    let status = cms.outboxd().expect(&["status"], code::PROBLEMS);
    assert!(
        status.contains("capture-gap: capture cms_page of cms_page lost 1 window"),
        "{status}"
    );
    let snap = cms.outboxd().ok(&[
        "capture",
        "snapshot",
        "--config",
        config,
        "--capture",
        "cms_page",
    ]);
    assert!(
        snap.contains("completed: 1 rows read, 1 r events"),
        "{snap}"
    );
    cms.outboxd().ok(&["capture", "list", "--config", config]);
    cms.outboxd().ok(&["status"]);
    let _ = deliver(&cms.db(), 3); // the snapshot's markers and r event

    cms.host("edit", &[("CMS_WITH_SUMMARY", "1")]);
    let events = deliver(&cms.db(), 1);
    assert_eq!(
        payload(&events[0]),
        json!({"op": "u", "table": "cms_page", "key": {"id": page}, "before": hello_pub,
               "after": {"slug": "hello", "title": "After the migration", "status": "published"}})
    );
}

/// Issue 33: a snapshot of an existing Django site (3,000 pages made before
/// the capture was installed) while the CMS edits, deletes and creates
/// pages through its ORM, the snapshot process killed with SIGKILL part-way
/// and run again. Every page that existed at the start and still exists
/// has exactly one `r` event of the snapshot; each page's events are a
/// valid history in commit order (no `r` after its `d`, none before its
/// `c`), ending in the page as it is; the completed marker counts the `r`
/// events; and a relay delivers every event, in order per page.
#[test]
fn a_snapshot_killed_mid_way_while_the_cms_edits_sends_every_page_once() {
    let Some(python) = venv::python_with(DJANGO, "import django") else {
        return;
    };
    let cms = Cms::new(python.clone());
    cms.host("migrate", &[]);
    const PAGES: i64 = 3000;
    let made = Command::new(&python)
        .arg(cms.root.join("cms_host.py"))
        .args(["pages", &PAGES.to_string()])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let config = cms.root.join("capture.toml");
    std::fs::write(&config, CAPTURE).unwrap();
    let config = config.to_str().unwrap();
    cms.outboxd().ok(&["capture", "apply", "--config", config]);

    let churn = Command::new(&python)
        .arg(cms.root.join("cms_host.py"))
        .args(["churn", "12", "33"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let snapshot_args = [
        "capture", "snapshot", "--config", config, "--table", "cms_page", "--chunk", "40",
    ];
    let mut first = cms
        .outboxd()
        .command(&[&snapshot_args[..], &["--rate", "400"]].concat())
        .spawn()
        .unwrap();
    let read =
        rusqlite::Connection::open_with_flags(cms.db(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    read.busy_timeout(Duration::from_secs(5)).unwrap();
    let scanned = || -> i64 {
        read.query_row(
            "SELECT coalesce(max(scanned), 0) FROM outboxd_capture_snapshot",
            [],
            |r| r.get(0),
        )
        .unwrap_or(0)
    };
    wait_until("a third of the pages read", Duration::from_secs(60), || {
        scanned() >= PAGES / 3
    });
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let (state, at_kill): (String, i64) = read
        .query_row(
            "SELECT state, scanned FROM outboxd_capture_snapshot",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(state, "running");
    assert!(at_kill < PAGES, "killed before its end ({at_kill})");
    // Run again: it resumes, while the CMS goes on editing.
    let out = cms.outboxd().ok(&snapshot_args);
    assert!(out.contains("completed"), "{out}");
    let churned = churn.wait_with_output().unwrap();
    assert!(
        churned.status.success(),
        "{}",
        String::from_utf8_lossy(&churned.stderr)
    );
    let churned: Value = serde_json::from_slice(&churned.stdout).unwrap();
    eprintln!("the CMS meanwhile: {churned}");
    assert!(churned["updated"].as_u64().unwrap() > 50, "{churned}");

    let (id, rows): (String, i64) = read
        .query_row("SELECT id, rows FROM outboxd_capture_snapshot", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let events: Vec<(String, Value, Option<String>)> = read
        .prepare("SELECT event_type, payload, ordering_key FROM event_outbox ORDER BY id")
        .unwrap()
        .query_map([], |r| {
            let p: String = r.get(1)?;
            Ok((r.get(0)?, serde_json::from_str(&p).unwrap(), r.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let markers: Vec<&Value> = events
        .iter()
        .filter(|(t, ..)| t.starts_with("page.snapshot_"))
        .map(|(_, p, _)| p)
        .collect();
    assert_eq!(markers.len(), 2, "one start, one end, though killed once");
    assert_eq!(markers[0]["op"], "snapshot_started");
    assert_eq!(markers[1]["op"], "snapshot_completed");
    assert_eq!(markers[1]["snapshot_id"], json!(id));
    let r_events = events
        .iter()
        .filter(|(t, ..)| t == "page.snapshot.v1")
        .count() as i64;
    assert_eq!(
        (markers[1]["rows"].as_i64(), rows),
        (Some(r_events), r_events)
    );
    let mut by_page: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for (t, p, key) in &events {
        if t.starts_with("page.") && !t.starts_with("page.snapshot_") {
            let page = p["key"]["id"].as_i64().unwrap();
            assert_eq!(key.as_deref(), Some(format!("cms_page:{page}").as_str()));
            by_page.entry(page).or_default().push(p);
        }
    }
    let now: BTreeMap<i64, Value> = read
        .prepare("SELECT id, slug, title, status FROM cms_page")
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                json!({"slug": r.get::<_, String>(1)?, "title": r.get::<_, String>(2)?,
                       "status": r.get::<_, String>(3)?}),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut old_kept = 0;
    for (page, list) in &by_page {
        let ops: String = list.iter().map(|p| p["op"].as_str().unwrap()).collect();
        let r = ops.matches('r').count();
        assert!(
            !ops.contains("dr") && !ops.contains("rc"),
            "page {page}: {ops}"
        );
        match now.get(page) {
            Some(row) => {
                assert_eq!(&list.last().unwrap()["after"], row, "page {page}: {ops}");
                if *page <= PAGES {
                    assert_eq!(r, 1, "page {page} existed throughout: {ops}");
                    old_kept += 1;
                } else {
                    assert_eq!(r, 0, "page {page} was created meanwhile: {ops}");
                }
            }
            None => assert!(ops.ends_with('d') && r <= 1, "page {page}: {ops}"),
        }
    }
    let old_now = now.keys().filter(|k| **k <= PAGES).count();
    assert_eq!(
        old_kept, old_now,
        "every page that is still there has events"
    );
    assert!(old_now > 2000, "most pages kept ({old_now})");

    // Delivered: every event, each page's in commit order.
    let delivered = deliveries(&cms.db(), events.len());
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &delivered {
        if let Some(k) = &d.ordering_key {
            seen.entry(k.to_string())
                .or_default()
                .push(d.envelope.event_id.to_string());
        }
    }
    let ids: BTreeMap<String, Vec<String>> = {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut stmt = read
            .prepare("SELECT ordering_key, event_id FROM event_outbox WHERE ordering_key IS NOT NULL ORDER BY id")
            .unwrap();
        for row in stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .unwrap()
        {
            let (k, id) = row.unwrap();
            m.entry(k).or_default().push(id);
        }
        m
    };
    assert_eq!(
        seen, ids,
        "each ordering key's events delivered in commit order"
    );
}

/// The figures of BENCHMARKS.md's "Django beside outboxd" (issue 33, item
/// 5): two Django writer processes, 1,000 transactions each (a read, then
/// a write, as an admin's save does), on a captured table while `outboxd
/// run` delivers every event to a JSONL file; "database is locked" errors
/// per 1,000 operations with Django's default SQLite settings (deferred
/// transactions) and with the recommended ones (`transaction_mode =
/// "IMMEDIATE"`, `timeout = 5`), and the relay's commits per event. The
/// cases alternate, `OUTBOXD_DJANGO_ROUNDS` times
/// (default 1), so each comparison runs under the same load. Ignored: a
/// measurement, not a check.
///
///     OUTBOXD_DJANGO_ROUNDS=3 cargo test --test hosts -- --ignored capture_django::measure_lock_errors --nocapture
#[test]
#[ignore]
fn measure_lock_errors_of_two_django_writers() {
    let Some(python) = venv::python_with(DJANGO, "import django") else {
        return;
    };
    let rounds: usize = std::env::var("OUTBOXD_DJANGO_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let recommended = Some(("CMS_SQLITE_RECOMMENDED", "1"));
    for round in 1..=rounds {
        for (label, env, relay) in [
            ("defaults, outboxd stopped", None, false),
            ("defaults, outboxd running", None, true),
            ("recommended, outboxd running", recommended, true),
        ] {
            let cms = Cms::new(python.clone());
            cms.host("migrate", &[]);
            let config = cms.root.join("outboxd.toml");
            std::fs::write(
                &config,
                format!(
                    "{CAPTURE}\n[http]\nlisten = \"127.0.0.1:0\"\n[[consumer]]\nname = \"feed\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
                    cms.root.join("feed.jsonl").display()
                ),
            )
            .unwrap();
            let config = config.to_str().unwrap();
            cms.outboxd().ok(&["capture", "apply", "--config", config]);
            let mut run = relay.then(|| cms.outboxd().spawn(&["run", "--config", config]));
            let addr = run.as_mut().map(|r| r.console_address());
            let writers: Vec<_> = (0..2)
                .map(|i| {
                    let mut c = Command::new(&python);
                    c.arg(cms.root.join("cms_host.py"))
                        .args(["contend", "1000", &i.to_string()])
                        .stdout(std::process::Stdio::piped());
                    if let Some((k, v)) = env {
                        c.env(k, v);
                    }
                    c.spawn().unwrap()
                })
                .collect();
            let mut locked = 0;
            let mut seconds: f64 = 0.0;
            for w in writers {
                let out = w.wait_with_output().unwrap();
                let r: Value = serde_json::from_slice(&out.stdout).unwrap();
                locked += r["locked"].as_u64().unwrap();
                seconds = seconds.max(r["seconds"].as_f64().unwrap());
            }
            // The relay's commits once it has delivered every event.
            let commits = addr.map(|addr| {
                let events: f64 = rusqlite::Connection::open(cms.db())
                    .unwrap()
                    .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
                    .unwrap();
                let read = |name: &str| {
                    let metrics = common::http::get(&addr, "/metrics").body;
                    metrics
                        .lines()
                        .find_map(|l| l.strip_prefix(&format!("{name} ")))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        .unwrap_or(f64::NAN)
                };
                wait_until("every event delivered", Duration::from_secs(60), || {
                    read("outboxd_events_delivered_total") >= events
                });
                (read("outboxd_commits_total"), events)
            });
            if let Some(run) = run.as_mut() {
                run.signal("-TERM");
                run.wait(Duration::from_secs(30));
            }
            let relay_line = commits.map_or(String::new(), |(c, d)| {
                format!(
                    "; relay: {c} commits for {d} events ({:.2} per event)",
                    c / d
                )
            });
            eprintln!(
                "round {round}, {label}: {locked} \"database is locked\" errors in 2,000 operations ({:.1} per 1,000), {seconds:.1} s{relay_line}",
                locked as f64 / 2.0
            );
        }
    }
}
