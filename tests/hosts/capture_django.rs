//! Capture under a real web framework: a Django CMS (from PyPI, in a venv
//! kept under target/) with its default SQLite database, its own migrations
//! and its ORM (tests/contract/django_cms). Its writes become events with
//! the right before and after; a Django migration that rebuilds a captured
//! table drops the triggers, which outboxd reports (`capture list` and
//! `status` exit 1) until `capture apply` restores them.

use crate::common;
use crate::common::venv;

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
    let seen: Arc<Mutex<Vec<Envelope>>> = Arc::default();
    let record = seen.clone();
    let relay = Relay::builder(db)
        .consumer("cms-feed", ["*"], move |d: &Delivery| {
            record.lock().unwrap().push(d.envelope.clone());
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
    assert!(text.contains("cannot be recovered"), "{text}");
    let status = cms.outboxd().expect(&["status"], code::PROBLEMS);
    assert!(status.contains("capture: capture of cms_page"), "{status}");
    // The comments' triggers were not touched.
    assert!(!text.contains("cms_comment: PROBLEM"), "{text}");

    let out = cms.outboxd().ok(&["capture", "apply", "--config", config]);
    assert!(out.contains("cms_page: updated"), "{out}");
    cms.outboxd().ok(&["capture", "list", "--config", config]);

    cms.host("edit", &[("CMS_WITH_SUMMARY", "1")]);
    let events = deliver(&cms.db(), 1);
    assert_eq!(
        payload(&events[0]),
        json!({"op": "u", "table": "cms_page", "key": {"id": page}, "before": hello_pub,
               "after": {"slug": "hello", "title": "After the migration", "status": "published"}})
    );
}
