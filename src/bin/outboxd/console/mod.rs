//! The operator console, Prometheus `/metrics` and `/healthz`, served over
//! HTTP by `outboxd run` (`[http] listen` or `--http`) and by
//! `outboxd console` (the console alone, beside a relay that runs
//! elsewhere).
//!
//! ## Layout
//!
//! - [`server`]: the HTTP server (hyper on the console's own one-thread
//!   tokio runtime, the handlers on a bounded pool of blocking threads),
//!   limits, security headers.
//! - [`auth`]: the token, the session cookie, the Host, Origin and CSRF checks.
//! - [`routes`]: paths to handlers; reads on the pool, writes through the
//!   library's operations (dead-letter requeue and discard, replay).
//! - [`pages`]: the HTML, from maud templates that escape every value.
//! - [`queries`]: the SQL of the pages, each bounded on a million events.
//! - [`cache`]: the status measured on demand on its own thread.
//! - [`chart`]: the last hour per minute, and its SVG.
//!
//! Reads go through an r2d2 pool of read-only connections, so the console
//! can never write by accident and never holds the write lock; each action
//! opens a write connection of its own for its one library call.

pub mod auth;
pub mod cache;
pub mod chart;
pub mod pages;
pub mod queries;
pub mod routes;
pub mod server;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use outboxd::connection::ConnectionManager;
use outboxd::relay::Metrics;
use outboxd::router::Subscriptions;
use outboxd::status::Status;
use outboxd::Timestamp;

use crate::config::alerts::Verdict;
use crate::config::HttpServe;
use cache::Cached;
use chart::{Counts, History};
use outboxd::status::Thresholds;

/// The read-only pool.
pub type Pool = r2d2::Pool<ConnectionManager>;

/// Connections in the read pool: one per handler thread, and one each for
/// the background measures.
const POOL_SIZE: u32 = 6;

/// Where to serve: the console (with /metrics and /healthz), and the
/// legacy `[metrics] listen` address (/metrics and /healthz alone, without
/// a token). One [`App`] and one server's threads answer both.
#[derive(Default)]
pub struct Listeners {
    /// The console's listener, with its address, token and read-only switch.
    pub console: Option<(TcpListener, HttpServe)>,
    /// The `[metrics] listen` listener.
    pub probes: Option<TcpListener>,
}

/// What the server is started with.
pub struct Settings {
    /// The database.
    pub db: PathBuf,
    /// The health thresholds (as `outboxd status` takes them).
    pub thresholds: Thresholds,
    /// The configured consumers and the types they take (empty without a
    /// config).
    pub consumers: Subscriptions,
    /// The running relay's counters, under `outboxd run`.
    pub relay: Option<Arc<Metrics>>,
}

/// Why a background measure could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// No read connection could be had from the pool.
    #[error("no read connection to the database: {0}")]
    Pool(#[from] r2d2::Error),
    /// The library's status failed.
    #[error(transparent)]
    Status(#[from] outboxd::Error),
    /// One of the console's own queries failed.
    #[error(transparent)]
    Query(#[from] rusqlite::Error),
}

/// The status and its health verdict, or why it could not be read.
pub type StatusView = std::result::Result<(Status, Verdict), MeasureError>;

/// What the overview adds to the status, measured in the background.
#[derive(Debug, Default)]
pub struct Extras {
    /// Per configured consumer (retrying, dead) not yet delivered by it, and
    /// whether a bound cut the count short.
    pub backlog: Option<std::result::Result<queries::Backlog, MeasureError>>,
    /// The chart's rows from the table (`outboxd console`, no relay).
    pub chart_rows: Option<std::result::Result<Vec<(i64, Counts)>, MeasureError>>,
}

/// Everything the handlers share.
pub struct App {
    /// The database.
    pub db: PathBuf,
    /// Read-only connections.
    pub pool: Pool,
    /// Access rules.
    pub auth: auth::Auth,
    /// Hide every action.
    pub read_only: bool,
    /// Configured consumers.
    pub consumers: Subscriptions,
    /// The relay's counters.
    pub relay: Option<Arc<Metrics>>,
    /// The relay's per-minute history.
    pub history: Option<Arc<History>>,
    /// The status, measured on demand.
    pub status: Cached<StatusView>,
    /// The overview's extras, measured on demand.
    pub extras: Cached<Extras>,
    /// Why the process serving this is stopping ([`Console::fail`]):
    /// /healthz reports it, whatever the status says.
    pub failure: Arc<OnceLock<String>>,
}

impl App {
    /// The relay's totals now (for the chart's current minute).
    pub fn live_totals(&self) -> Option<Counts> {
        let relay = self.relay.as_ref()?.snapshot();
        let enqueued = self
            .pool
            .get()
            .ok()
            .and_then(|c| queries::enqueued_total(&c).ok())?;
        Some(Counts {
            enqueued,
            delivered: relay.delivered,
            retried: relay.retried,
            dead: relay.dead_lettered,
        })
    }
}

/// A running console.
pub struct Console {
    server: server::Server,
    failure: Arc<OnceLock<String>>,
    /// Which of the server's addresses is the console's, and the probes'.
    console_site: Option<usize>,
    probes_site: Option<usize>,
}

impl Console {
    /// Makes /healthz unhealthy from now on, saying `why` (the process is
    /// stopping on a failure the status cannot see, such as its database
    /// file deleted). The first reason stays.
    pub fn fail(&self, why: &str) {
        let _ = self.failure.set(why.to_string());
    }

    /// The console's address, if it serves one.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console_site.map(|i| self.server.addrs()[i])
    }

    /// The `[metrics] listen` address, if it serves one.
    pub fn probes_addr(&self) -> Option<SocketAddr> {
        self.probes_site.map(|i| self.server.addrs()[i])
    }

    /// Stops taking requests and waits for those being answered.
    pub fn stop(self) {
        self.server.stop();
    }
}

/// Opens the pool (the database must exist and be migrated), starts the
/// background measures and serves on the listeners.
pub fn start(listeners: Listeners, settings: Settings) -> Result<Console> {
    let manager = ConnectionManager::read_only(&settings.db);
    let pool = r2d2::Pool::builder()
        .max_size(POOL_SIZE)
        .min_idle(Some(1))
        .connection_timeout(Duration::from_secs(10))
        .build(manager)
        .with_context(|| format!("cannot open {} for the console", settings.db.display()))?;
    outboxd::schema::ensure_current(&*pool.get()?)?;

    let status = {
        let pool = pool.clone();
        let thresholds = settings.thresholds;
        Cached::start("outboxd-status", move || measure_status(&pool, &thresholds))?
    };
    let extras = {
        let pool = pool.clone();
        let consumers = settings.consumers.clone();
        let from_table = settings.relay.is_none();
        Cached::start("outboxd-overview", move || {
            let conn = match pool.get() {
                Ok(c) => c,
                Err(e) => {
                    return Extras {
                        backlog: Some(Err(e.into())),
                        chart_rows: None,
                    }
                }
            };
            let since = chart::hour_start(Timestamp::now()).as_millis();
            Extras {
                backlog: (!consumers.is_empty())
                    .then(|| queries::consumer_backlog(&conn, &consumers).map_err(Into::into)),
                chart_rows: from_table
                    .then(|| queries::minute_counts(&conn, since).map_err(Into::into)),
            }
        })?
    };
    let history = match &settings.relay {
        Some(relay) => Some(sample_every_minute(relay.clone(), pool.clone())?),
        None => None,
    };
    // The probes' listener needs no rules: it serves counts to anyone.
    let (auth, read_only) = match &listeners.console {
        Some((listener, serve)) => (
            // The address bound (the config's port may be 0), for messages.
            auth::Auth::new(
                serve.token.clone(),
                listener.local_addr().unwrap_or(serve.listen),
            ),
            serve.read_only,
        ),
        None => (auth::Auth::new(None, ([127, 0, 0, 1], 0).into()), true),
    };
    let app = Arc::new(App {
        auth,
        db: settings.db,
        pool,
        read_only,
        consumers: settings.consumers,
        relay: settings.relay,
        history,
        status,
        extras,
        failure: Arc::new(OnceLock::new()),
    });
    let failure = app.failure.clone();
    let mut sites: Vec<(TcpListener, Arc<server::Handler>)> = Vec::new();
    let console_site = listeners.console.map(|(listener, _)| {
        let app = app.clone();
        sites.push((
            listener,
            Arc::new(move |req: &server::Request| routes::handle(&app, req)),
        ));
        sites.len() - 1
    });
    let probes_site = listeners.probes.map(|listener| {
        let app = app.clone();
        sites.push((
            listener,
            Arc::new(move |req: &server::Request| routes::handle_probes(&app, req)),
        ));
        sites.len() - 1
    });
    let server = server::Server::start(sites, server::Limits::default())
        .context("cannot start the HTTP server")?;
    Ok(Console {
        server,
        failure,
        console_site,
        probes_site,
    })
}

/// The status now and the health verdict against `thresholds`.
fn measure_status(pool: &Pool, thresholds: &Thresholds) -> StatusView {
    let conn = pool.get()?;
    let status = outboxd::status::status(&conn, Timestamp::now())?;
    let verdict = crate::config::alerts::verdict(&conn, thresholds, status.now)?;
    Ok((status, verdict))
}

/// Starts the thread that records the relay's totals at the start of each
/// minute, for the chart.
///
/// The first record is taken here, before the server answers anything, with
/// the relay's counters at zero (they count from the relay's start, a moment
/// ago) and the table's enqueued total measured now. Taken by the thread, it
/// could come after the first deliveries on a busy machine, and they would
/// then count as before the hour (the overview once showed 0 of 7).
fn sample_every_minute(relay: Arc<Metrics>, pool: Pool) -> Result<Arc<History>> {
    let history = Arc::new(History::default());
    let enqueued = |pool: &Pool| {
        pool.get()
            .ok()
            .and_then(|c| queries::enqueued_total(&c).ok())
    };
    let now = Timestamp::now();
    if let Some(enqueued) = enqueued(&pool) {
        history.record(
            chart::minute_of(now),
            Counts {
                enqueued,
                ..Counts::default()
            },
        );
    }
    let h = Arc::downgrade(&history);
    std::thread::Builder::new()
        .name("outboxd-chart".into())
        .spawn(move || {
            let mut now = now;
            loop {
                // The next minute's start: a timer, not synchronisation.
                let next = chart::start_of(chart::minute_of(now) + 1);
                std::thread::sleep(next.since(Timestamp::now()) + Duration::from_millis(5));
                now = Timestamp::now();
                let Some(history) = h.upgrade() else { return };
                if let Some(enqueued) = enqueued(&pool) {
                    let m = relay.snapshot();
                    history.record(
                        chart::minute_of(now),
                        Counts {
                            enqueued,
                            delivered: m.delivered,
                            retried: m.retried,
                            dead: m.dead_lettered,
                        },
                    );
                }
            }
        })?;
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_that_cannot_be_read_says_why_in_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&db).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .build(ConnectionManager::read_only(&db))
            .unwrap();
        let thresholds = crate::config::alerts::without_config();
        assert!(measure_status(&pool, &thresholds).is_ok());
        conn.execute_batch("DROP TABLE event_outbox").unwrap();
        match measure_status(&pool, &thresholds) {
            Err(MeasureError::Status(e)) => assert!(e.to_string().contains("event_outbox"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_chart_counts_the_relays_deliveries_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&db).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        let tx = conn.transaction().unwrap();
        let events: Vec<_> = (0..7)
            .map(|n| {
                outboxd::Event::new("article.created.v1", &serde_json::json!({ "n": n })).unwrap()
            })
            .collect();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        let relay = outboxd::Relay::builder(&db)
            .consumer("c", ["*"], |_: &outboxd::Delivery| {
                outboxd::Outcome::Delivered
            })
            .build()
            .unwrap()
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while relay.metrics().delivered < 7 {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay delivered nothing"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The console starts after the relay has delivered (a backlog, a
        // busy machine): those deliveries are the relay's, in the hour.
        let pool = r2d2::Pool::builder()
            .max_size(2)
            .build(ConnectionManager::read_only(&db))
            .unwrap();
        let history = sample_every_minute(relay.metrics_source(), pool).unwrap();
        let m = relay.metrics();
        let live = Counts {
            enqueued: 7,
            delivered: m.delivered,
            retried: m.retried,
            dead: m.dead_lettered,
        };
        let now_minute = chart::minute_of(Timestamp::now());
        assert_eq!(history.series(now_minute, live).total().delivered, 7);
        relay.shutdown(Duration::from_secs(10)).unwrap();
    }
}
