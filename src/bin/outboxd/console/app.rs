//! What every handler shares: the read pool, the access rules, the
//! measures taken in the background, and why the process is stopping.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use outboxd::connection::ConnectionManager;
use outboxd::relay::Metrics;
use outboxd::router::Subscriptions;
use outboxd::status::Status;

use super::auth;
use super::cache::Cached;
use super::chart::{Counts, History};
use crate::config::alerts::Verdict;

/// The read-only pool.
pub(crate) type Pool = r2d2::Pool<ConnectionManager>;

/// Why a background measure could not be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MeasureError {
    /// No read connection could be had from the pool.
    #[error("no read connection to the database: {0}")]
    Pool(#[from] r2d2::Error),
    /// The library could not read the database (the status, a consumer's
    /// backlog, the counts per minute).
    #[error(transparent)]
    Read(#[from] outboxd::Error),
}

/// The status and its health verdict, or why it could not be read.
pub(crate) type StatusView = std::result::Result<(Status, Verdict), MeasureError>;

/// What the overview adds to the status, measured in the background.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// Per configured consumer (retrying, dead) not yet delivered by it, and
    /// whether a bound cut the count short.
    pub(crate) backlog: Option<std::result::Result<outboxd::inspect::Backlog, MeasureError>>,
    /// The chart's rows from the table.
    pub(crate) chart_rows: Option<std::result::Result<Vec<(i64, Counts)>, MeasureError>>,
}

/// Everything the handlers share.
pub(crate) struct App {
    /// The database.
    pub(crate) db: PathBuf,
    /// Read-only connections.
    pub(crate) pool: Pool,
    /// Access rules.
    pub(crate) auth: auth::Auth,
    /// Hide every action.
    pub(crate) read_only: bool,
    /// Configured consumers.
    pub(crate) consumers: Subscriptions,
    /// The relay's counters.
    pub(crate) relay: Option<Arc<Metrics>>,
    /// The relay's per-minute history (its retries).
    pub(crate) history: Option<Arc<History>>,
    /// The status, measured on demand.
    pub(crate) status: Cached<StatusView>,
    /// The overview's extras, measured on demand.
    pub(crate) extras: Cached<Extras>,
    /// Why the process serving this is stopping (`Console::fail`):
    /// /healthz reports it, whatever the status says.
    pub(crate) failure: Arc<OnceLock<String>>,
}

impl App {
    /// The relay's totals now, as the chart takes them (its retries).
    pub(crate) fn live_totals(&self) -> Option<Counts> {
        self.relay.as_deref().map(Counts::of_relay)
    }
}
