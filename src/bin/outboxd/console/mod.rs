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
//! - [`auth`]: the token, the sessions, wrong tokens throttled per peer, the
//!   Host, Origin and CSRF checks.
//! - [`routes`]: paths to handlers; reads on the pool, writes through the
//!   library's operations (dead-letter requeue and discard, replay).
//! - [`pages`]: the HTML, from maud templates that escape every value.
//! - [`cache`]: the status measured on demand on its own thread.
//! - [`chart`]: the last hour per minute, and its SVG.
//! - [`app`]: what the handlers share; [`measures`]: the status, its health
//!   verdict and the overview's figures, measured off the request path.
//! - [`form`]: queries and forms, through `form_urlencoded`.
//!
//! The SQL behind the pages is the library's (`outboxd::inspect`,
//! `outboxd::status`, `outboxd::dead_letter`, `outboxd::replay`).
//! Reads go through an r2d2 pool of read-only connections, so the console
//! can never write by accident and never holds the write lock; each action
//! opens a write connection of its own for its one library call.

pub(crate) mod app;
pub(crate) mod auth;
pub(crate) mod cache;
pub(crate) mod chart;
pub(crate) mod form;
pub(crate) mod measures;
pub(crate) mod pages;
pub(crate) mod routes;
pub(crate) mod server;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use outboxd::connection::ConnectionManager;
use outboxd::relay::Metrics;
use outboxd::router::Subscriptions;
use outboxd::status::Thresholds;

use crate::config::HttpServe;
use app::App;
use cache::Cached;

/// Connections in the read pool: one per handler thread, and one each for
/// the background measures.
const POOL_SIZE: u32 = 6;

/// Where to serve: the console (with /metrics and /healthz), and the
/// legacy `[metrics] listen` address (/metrics and /healthz alone, without
/// a token). One [`App`] and one server's threads answer both.
#[derive(Default)]
pub(crate) struct Listeners {
    /// The console's listener, with its address, token and read-only switch.
    pub(crate) console: Option<(TcpListener, HttpServe)>,
    /// The `[metrics] listen` listener.
    pub(crate) probes: Option<TcpListener>,
}

/// What the console shows: the database, the health thresholds it judges
/// the status by, the consumers it expects, and the running relay's
/// counters (the chart's retries under `outboxd run`).
pub(crate) struct ConsoleSetup {
    /// The database.
    pub(crate) db: PathBuf,
    /// The health thresholds (as `outboxd status` takes them).
    pub(crate) thresholds: Thresholds,
    /// The configured consumers and the types they take (empty without a
    /// config).
    pub(crate) consumers: Subscriptions,
    /// The running relay's counters, under `outboxd run`.
    pub(crate) relay: Option<Arc<Metrics>>,
}

/// A running console.
pub(crate) struct Console {
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
    pub(crate) fn fail(&self, why: &str) {
        let _ = self.failure.set(why.to_string());
    }

    /// The console's address, if it serves one.
    pub(crate) fn console_addr(&self) -> Option<SocketAddr> {
        self.console_site.map(|i| self.server.addrs()[i])
    }

    /// The `[metrics] listen` address, if it serves one.
    pub(crate) fn probes_addr(&self) -> Option<SocketAddr> {
        self.probes_site.map(|i| self.server.addrs()[i])
    }

    /// Stops taking requests and waits for those being answered.
    pub(crate) fn stop(self) {
        self.server.stop();
    }
}

/// Opens the pool (the database must exist and be migrated), starts the
/// background measures and serves on the listeners.
pub(crate) fn start(listeners: Listeners, setup: ConsoleSetup) -> Result<Console> {
    let manager = ConnectionManager::read_only(&setup.db);
    let pool = r2d2::Pool::builder()
        .max_size(POOL_SIZE)
        .min_idle(Some(1))
        .connection_timeout(Duration::from_secs(10))
        .build(manager)
        .with_context(|| format!("cannot open {} for the console", setup.db.display()))?;
    outboxd::schema::ensure_current(&*pool.get()?)?;

    let status = {
        let pool = pool.clone();
        let thresholds = setup.thresholds;
        Cached::start("outboxd-status", move || {
            measures::measure_status(&pool, &thresholds)
        })?
    };
    let extras = {
        let pool = pool.clone();
        let consumers = setup.consumers.clone();
        Cached::start("outboxd-overview", move || {
            measures::measure_extras(&pool, &consumers)
        })?
    };
    let history = match &setup.relay {
        Some(relay) => Some(measures::sample_every_minute(relay.clone())?),
        None => None,
    };
    // The probes' listener needs no rules: it serves counts to anyone.
    let (auth, read_only) = match &listeners.console {
        Some((listener, serve)) => {
            if let Some(weak) = &serve.weak_token {
                tracing::warn!("{weak}");
            }
            (
                // The address bound (the config's port may be 0), for messages.
                auth::Auth::new(
                    serve.token.clone(),
                    listener.local_addr().unwrap_or(serve.listen),
                    serve.trust_forwarded_for,
                ),
                serve.read_only,
            )
        }
        None => (
            auth::Auth::new(None, ([127, 0, 0, 1], 0).into(), false),
            true,
        ),
    };
    let app = Arc::new(App {
        auth,
        db: setup.db,
        pool,
        read_only,
        consumers: setup.consumers,
        relay: setup.relay,
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
    let server = server::Server::start(sites, server::HttpBounds::default())
        .context("cannot start the HTTP server")?;
    Ok(Console {
        server,
        failure,
        console_site,
        probes_site,
    })
}
