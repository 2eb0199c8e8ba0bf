//! A Prometheus text endpoint on a plain `TcpListener` thread.
//!
//! Each scrape reads the relay's counters ([`Metrics::snapshot`]) and the
//! outbox's status on a read-only connection (events by status, oldest due
//! age). One connection at a time, with short socket timeouts, so a stuck
//! client cannot hold the endpoint for long; no HTTP framework is needed
//! for `GET /metrics`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use outboxd::relay::{Metrics, MetricsSnapshot};
use outboxd::status::Status;
use outboxd::Timestamp;
use rusqlite::Connection;

/// Socket read and write timeout per scrape.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// Serves `GET /metrics` on `listener` from a background thread that lives
/// as long as the process.
pub fn spawn(
    listener: TcpListener,
    source: Arc<Metrics>,
    db: PathBuf,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("outboxd-metrics".into())
        .spawn(move || {
            let mut conn: Option<Connection> = None;
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = serve(s, &source, &db, &mut conn) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot accept a metrics connection"),
                }
            }
        })
}

fn serve(
    mut stream: TcpStream,
    source: &Metrics,
    db: &std::path::Path,
    conn: &mut Option<Connection>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => {
            ("200 OK", render(&source.snapshot(), &read_status(db, conn)))
        }
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "not found; metrics are at /metrics\n".to_string(),
        ),
        _ => ("405 Method Not Allowed", "only GET /metrics\n".to_string()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes())?;
    stream.flush()
}

/// The status on a cached read-only connection, reopened after a failure.
fn read_status(db: &std::path::Path, conn: &mut Option<Connection>) -> Result<Status, String> {
    if conn.is_none() {
        *conn = Some(outboxd::connection::open_read_only(db).map_err(|e| e.to_string())?);
    }
    let result = outboxd::status::status(conn.as_ref().expect("opened above"), Timestamp::now());
    if result.is_err() {
        *conn = None;
    }
    result.map_err(|e| e.to_string())
}

/// The exposition text: the outbox's status (when readable) and the relay's
/// counters.
pub fn render(m: &MetricsSnapshot, status: &Result<Status, String>) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |v: u64| vec![(String::new(), v as f64)];
    match status {
        Ok(s) => {
            let c = &s.counts;
            metric(
                "outboxd_status_up",
                "gauge",
                "1 when the outbox status could be read.",
                &one(1),
            );
            let by_status = [
                ("pending_due", c.pending_due),
                ("pending_delayed", c.pending_delayed),
                ("leased", c.leased),
                ("delivered", c.delivered),
                ("dead", c.dead),
            ]
            .map(|(st, n)| (format!("{{status=\"{st}\"}}"), n as f64));
            metric(
                "outboxd_events",
                "gauge",
                "Events in the outbox by status.",
                &by_status,
            );
            metric(
                "outboxd_oldest_due_age_seconds",
                "gauge",
                "How long the oldest due event has waited (0 when none is due).",
                &[(
                    String::new(),
                    s.oldest_due_age.map_or(0.0, |d| d.as_secs_f64()),
                )],
            );
            metric(
                "outboxd_leases_expired",
                "gauge",
                "Leases past their expiry, waiting to be claimed again.",
                &one(s.expired_leases),
            );
        }
        Err(e) => {
            // The reason goes to the log, not the scrape.
            tracing::warn!(error = %e, "cannot read the outbox status for metrics");
            metric(
                "outboxd_status_up",
                "gauge",
                "1 when the outbox status could be read.",
                &one(0),
            );
        }
    }
    let mut per = Vec::new();
    for consumer in &m.per_consumer {
        let c = escape(&consumer.name);
        for (result, n) in [
            ("delivered", &consumer.delivered),
            ("retry", &consumer.retried),
            ("poison", &consumer.poisoned),
        ] {
            per.push((
                format!("{{consumer=\"{c}\",result=\"{result}\"}}"),
                *n as f64,
            ));
        }
    }
    metric(
        "outboxd_deliveries_total",
        "counter",
        "Deliveries by consumer and result since start.",
        &per,
    );
    metric(
        "outboxd_events_delivered_total",
        "counter",
        "Events marked delivered (every consumer succeeded) since start.",
        &one(m.delivered),
    );
    metric(
        "outboxd_retries_total",
        "counter",
        "Retries scheduled since start.",
        &one(m.retried),
    );
    metric(
        "outboxd_dead_letters_total",
        "counter",
        "Events dead-lettered since start.",
        &one(m.dead_lettered),
    );
    metric(
        "outboxd_claimed_total",
        "counter",
        "Rows claimed since start.",
        &one(m.claimed),
    );
    metric(
        "outboxd_fenced_out_total",
        "counter",
        "Outcomes refused because the claim had passed to another relay.",
        &one(m.fenced_out),
    );
    metric(
        "outboxd_busy_retries_total",
        "counter",
        "Write transactions retried after SQLITE_BUSY.",
        &one(m.busy_retries),
    );
    metric(
        "outboxd_write_errors_total",
        "counter",
        "Write transactions that failed for another reason.",
        &one(m.errors),
    );
    metric(
        "outboxd_commits_total",
        "counter",
        "Write transactions committed.",
        &one(m.commits),
    );
    metric(
        "outboxd_claim_seconds_total",
        "counter",
        "Time spent in claim statements.",
        &[(String::new(), m.claim_micros_total as f64 / 1e6)],
    );
    metric(
        "outboxd_commit_seconds_total",
        "counter",
        "Time spent in write transactions (divide by outboxd_commits_total for the mean).",
        &[(String::new(), m.commit_micros_total as f64 / 1e6)],
    );
    metric(
        "outboxd_stale_events",
        "gauge",
        "Due events older than alerts.stale_after at the relay's last check.",
        &one(m.stale_events),
    );
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
            }],
            ..Default::default()
        };
        let text = render(&m, &Err("no such table".into()));
        assert!(text.contains("outboxd_status_up 0\n"), "{text}");
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
        assert_eq!(escape("a\"b\\"), "a\\\"b\\\\");
    }
}
