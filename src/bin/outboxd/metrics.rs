//! The Prometheus text exposition (format 0.0.4) of `/metrics`, from one
//! table of metric definitions.
//!
//! Each row names a metric, its type and help, and says how to read its
//! samples from the outbox's status (read on the console's read-only pool),
//! the health verdict (a gauge per problem kind and per captured table),
//! and the relay's counters ([`MetricsSnapshot`], absent under
//! `outboxd console`, which runs no relay). A row whose source is missing
//! is left out whole. The names are an interface: dashboards and alerts
//! use them, so a row may be added but never renamed.
//!
//! The server that answers `GET /metrics` is the console's
//! ([`crate::console`]).

use std::fmt::Write as _;
use std::path::Path;

use outboxd::health::{Verdict, KINDS};
use outboxd::relay::MetricsSnapshot;
use outboxd::status::Status;

/// What a scrape reads from.
pub struct Inputs<'a> {
    /// The outbox's status, or why it could not be read.
    pub status: Result<&'a Status, &'a dyn std::fmt::Display>,
    /// The relay's counters since start; None without a relay.
    pub relay: Option<&'a MetricsSnapshot>,
    /// The health verdict (`outboxd::health::check`), when it could be read.
    pub health: Option<&'a Verdict>,
    /// The database file: its stem is the `database` label.
    pub db: &'a Path,
}

/// One sample: its labels (`{a="b"}` or empty) and value.
type Sample = (String, f64);

/// Where a metric's samples come from.
enum Read {
    /// Whether the status could be read.
    Up,
    /// The status, when it could be read.
    Status(fn(&Status) -> Vec<Sample>),
    /// One value of the relay's counters, when a relay runs.
    Relay(fn(&MetricsSnapshot) -> f64),
    /// Labelled values of the relay's counters.
    RelayLabelled(fn(&MetricsSnapshot) -> Vec<Sample>),
    /// The health verdict, with the database's name, when it could be read.
    Health(fn(&Verdict, &str) -> Vec<Sample>),
}

/// One metric of the exposition.
struct Metric {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    read: Read,
}

const fn gauge(name: &'static str, help: &'static str, read: Read) -> Metric {
    Metric {
        name,
        kind: "gauge",
        help,
        read,
    }
}

const fn counter(name: &'static str, help: &'static str, read: Read) -> Metric {
    Metric {
        name,
        kind: "counter",
        help,
        read,
    }
}

/// Every metric, in the order they are written.
const METRICS: &[Metric] = &[
    gauge(
        "outboxd_status_up",
        "1 when the outbox status could be read.",
        Read::Up,
    ),
    gauge(
        "outboxd_events",
        "Events in the outbox by status.",
        Read::Status(by_status),
    ),
    gauge(
        "outboxd_oldest_due_age_seconds",
        "How long the oldest due event has waited (0 when none is due).",
        Read::Status(|s| one(s.oldest_due_age.map_or(0.0, |d| d.as_secs_f64()))),
    ),
    gauge(
        "outboxd_oldest_undelivered_age_seconds",
        "How long ago the oldest event that is due, being delivered or waiting for a retry was written (0 when none).",
        Read::Status(|s| one(s.oldest_undelivered_age.map_or(0.0, |d| d.as_secs_f64()))),
    ),
    gauge(
        "outboxd_leases_expired",
        "Leases past their expiry, waiting to be claimed again.",
        Read::Status(|s| one(s.expired_leases as f64)),
    ),
    counter(
        "outboxd_deliveries_total",
        "Deliveries by consumer and result since start.",
        Read::RelayLabelled(per_consumer),
    ),
    gauge(
        "outboxd_consumer_available",
        "0 while the consumer's destination is unavailable (the consumer is paused and probed), 1 otherwise.",
        Read::RelayLabelled(|m| by_consumer(m, |c| if c.available { 1.0 } else { 0.0 })),
    ),
    gauge(
        "outboxd_consumer_unavailable_seconds",
        "How long the consumer's destination has been unavailable (0 while available).",
        Read::RelayLabelled(|m| by_consumer(m, |c| c.unavailable_ms as f64 / 1000.0)),
    ),
    counter(
        "outboxd_events_delivered_total",
        "Events marked delivered (every consumer succeeded) since start.",
        Read::Relay(|m| m.delivered as f64),
    ),
    counter(
        "outboxd_retries_total",
        "Retries scheduled since start.",
        Read::Relay(|m| m.retried as f64),
    ),
    counter(
        "outboxd_dead_letters_total",
        "Events dead-lettered since start.",
        Read::Relay(|m| m.dead_lettered as f64),
    ),
    counter(
        "outboxd_claimed_total",
        "Rows claimed since start.",
        Read::Relay(|m| m.claimed as f64),
    ),
    counter(
        "outboxd_fenced_out_total",
        "Outcomes refused because the claim had passed to another relay.",
        Read::Relay(|m| m.fenced_out as f64),
    ),
    counter(
        "outboxd_busy_retries_total",
        "Write transactions retried after SQLITE_BUSY.",
        Read::Relay(|m| m.busy_retries as f64),
    ),
    counter(
        "outboxd_write_errors_total",
        "Write transactions that failed for another reason.",
        Read::Relay(|m| m.errors as f64),
    ),
    counter(
        "outboxd_commits_total",
        "Write transactions committed.",
        Read::Relay(|m| m.commits as f64),
    ),
    counter(
        "outboxd_claim_seconds_total",
        "Time spent in claim statements.",
        Read::Relay(|m| m.claim_micros_total as f64 / 1e6),
    ),
    counter(
        "outboxd_commit_seconds_total",
        "Time spent in write transactions (divide by outboxd_commits_total for the mean).",
        Read::Relay(|m| m.commit_micros_total as f64 / 1e6),
    ),
    gauge(
        "outboxd_stale_events",
        "Due events older than alerts.stale_after at the relay's last check.",
        Read::Relay(|m| m.stale_events as f64),
    ),
    gauge(
        "outboxd_health_problem",
        "1 when a problem of this kind crosses its threshold (the verdict of /healthz and `outboxd status`).",
        Read::Health(problem_kinds),
    ),
    gauge(
        "outboxd_capture_intact",
        "1 when every trigger of the table's capture is installed as recorded.",
        Read::Health(capture_intact),
    ),
    gauge(
        "outboxd_capture_gaps",
        "Open gaps of the capture: windows its triggers were missing, not yet covered by a snapshot nor acknowledged.",
        Read::Health(capture_gaps),
    ),
];

fn one(v: f64) -> Vec<Sample> {
    vec![(String::new(), v)]
}

fn by_status(s: &Status) -> Vec<Sample> {
    let c = s.counts;
    [
        ("pending_due", c.pending_due),
        ("pending_delayed", c.pending_delayed),
        ("leased", c.leased),
        ("delivered", c.delivered),
        ("dead", c.dead),
    ]
    .iter()
    .map(|(st, n)| (format!("{{status=\"{st}\"}}"), *n as f64))
    .collect()
}

/// Every kind, crossed or not.
fn problem_kinds(v: &Verdict, _database: &str) -> Vec<Sample> {
    KINDS
        .iter()
        .map(|k| (format!("{{kind=\"{k}\"}}"), f64::from(u8::from(v.has(k)))))
        .collect()
}

fn capture_intact(v: &Verdict, database: &str) -> Vec<Sample> {
    let database = escape(database);
    v.captures
        .iter()
        .map(|c| {
            (
                format!(
                    "{{database=\"{database}\",table=\"{}\",capture=\"{}\"}}",
                    escape(&c.table),
                    escape(&c.capture)
                ),
                f64::from(u8::from(c.intact)),
            )
        })
        .collect()
}

fn capture_gaps(v: &Verdict, database: &str) -> Vec<Sample> {
    let database = escape(database);
    v.captures
        .iter()
        .map(|c| {
            (
                format!(
                    "{{database=\"{database}\",table=\"{}\",capture=\"{}\",name=\"{}\"}}",
                    escape(&c.table),
                    escape(&c.capture),
                    escape(&c.name)
                ),
                c.open_gaps as f64,
            )
        })
        .collect()
}

/// The `database` label: the database file's stem (`app` for /x/app.db).
fn database_name(db: &Path) -> String {
    db.file_stem().map_or_else(
        || db.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// One sample per consumer.
fn by_consumer(m: &MetricsSnapshot, f: fn(&outboxd::relay::ConsumerMetrics) -> f64) -> Vec<Sample> {
    m.per_consumer
        .iter()
        .map(|c| (format!("{{consumer=\"{}\"}}", escape(&c.name)), f(c)))
        .collect()
}

fn per_consumer(m: &MetricsSnapshot) -> Vec<Sample> {
    let mut samples = Vec::new();
    for consumer in &m.per_consumer {
        let c = escape(&consumer.name);
        for (result, n) in [
            ("delivered", &consumer.delivered),
            ("retry", &consumer.retried),
            ("poison", &consumer.poisoned),
        ] {
            samples.push((
                format!("{{consumer=\"{c}\",result=\"{result}\"}}"),
                *n as f64,
            ));
        }
    }
    samples
}

impl Read {
    /// The samples, or None when their source is missing.
    fn samples(&self, i: &Inputs<'_>) -> Option<Vec<Sample>> {
        match self {
            Read::Up => Some(one(if i.status.is_ok() { 1.0 } else { 0.0 })),
            Read::Status(f) => i.status.ok().map(f),
            Read::Relay(f) => i.relay.map(|m| one(f(m))),
            Read::RelayLabelled(f) => i.relay.map(f),
            Read::Health(f) => i.health.map(|v| f(v, &database_name(i.db))),
        }
    }
}

/// The exposition text.
pub fn render(inputs: &Inputs<'_>) -> String {
    let mut out = String::new();
    for m in METRICS {
        let Some(samples) = m.read.samples(inputs) else {
            continue;
        };
        let _ = writeln!(out, "# HELP {} {}", m.name, m.help);
        let _ = writeln!(out, "# TYPE {} {}", m.name, m.kind);
        for (labels, value) in samples {
            let _ = writeln!(out, "{}{labels} {value}", m.name);
        }
    }
    out
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_per_consumer_and_an_unreadable_status() {
        let m = MetricsSnapshot {
            commit_micros_total: 1_500_000,
            commits: 3,
            per_consumer: vec![outboxd::relay::ConsumerMetrics {
                name: "hook".into(),
                delivered: 4,
                retried: 2,
                poisoned: 1,
                available: false,
                unavailable_ms: 90_500,
            }],
            ..Default::default()
        };
        let text = render(&Inputs {
            status: Err(&"no such table"),
            relay: Some(&m),
            health: None,
            db: Path::new("app.db"),
        });
        assert!(text.contains("outboxd_status_up 0\n"), "{text}");
        assert!(!text.contains("outboxd_events{"), "{text}");
        assert!(
            text.contains("outboxd_deliveries_total{consumer=\"hook\",result=\"retry\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("outboxd_commit_seconds_total 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE outboxd_commits_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("outboxd_consumer_available{consumer=\"hook\"} 0\n")
                && text.contains("outboxd_consumer_unavailable_seconds{consumer=\"hook\"} 90.5\n"),
            "{text}"
        );
        assert_eq!(escape("a\"b\\"), "a\\\"b\\\\");
    }

    #[test]
    fn without_a_relay_only_the_status_gauges_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = outboxd::connection::open(dir.path().join("m.db")).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        let status = outboxd::status::status(&conn, outboxd::Timestamp::now()).unwrap();
        let thresholds = outboxd::health::Thresholds::default();
        let health = outboxd::health::check(&conn, &thresholds, status.now).unwrap();
        let text = render(&Inputs {
            status: Ok(&status),
            relay: None,
            health: Some(&health),
            db: Path::new("/srv/app.db"),
        });
        for kind in KINDS {
            assert!(
                text.contains(&format!("outboxd_health_problem{{kind=\"{kind}\"}} 0\n")),
                "{text}"
            );
        }
        assert!(
            text.contains("outboxd_events{status=\"dead\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("outboxd_status_up 1\n"), "{text}");
        assert!(!text.contains("outboxd_commits_total"), "{text}");
    }

    #[test]
    fn every_name_is_unique_and_help_and_type_precede_samples() {
        let mut names: Vec<_> = METRICS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
        let m = MetricsSnapshot::default();
        let text = render(&Inputs {
            status: Err(&"x"),
            relay: Some(&m),
            health: None,
            db: Path::new("app.db"),
        });
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} has no TYPE line"
            );
        }
    }
}
