//! `/capture` and `POST /capture/snapshot`.

use anyhow::{Context, Result};
use outboxd::capture::snapshot::{self, SnapshotOptions};
use outboxd::Timestamp;

use super::notice::Notice;
use super::{ctx, nothing_done, page, Visit};
use crate::console::form::Params;
use crate::console::pages::{self, CaptureView, Nav};
use crate::console::server::{Request, Response};

/// The most rows a second a snapshot started from the console reads: it
/// runs beside the host's writers, with no one watching a terminal.
const CONSOLE_SNAPSHOT_RATE: u32 = 2000;

pub(super) fn capture(app: &Visit, req: &Request) -> Result<Response> {
    let conn = app.pool.get()?;
    let captures = outboxd::capture::inspect(&conn)?;
    let snapshots = snapshot::snapshots(&conn, 20)?;
    let notice = Notice::from_query(app, &req.query_pairs()).map(|n| n.text());
    Ok(page(
        app,
        200,
        "Capture",
        Nav::Capture,
        pages::capture(
            &ctx(app),
            &CaptureView {
                captures,
                snapshots,
                notice,
            },
        ),
    ))
}

/// Starts a snapshot of the capture the form names (or resumes its
/// running one) and drives it on a thread of the console's own, with its
/// own connection; the page shows its progress.
pub(super) fn snapshot(app: &Visit, form: &Params) -> Result<Response> {
    let Some(name) = form.get("capture").map(str::to_string) else {
        return Ok(nothing_done(app, Nav::Capture, "No capture was named."));
    };
    let opts = SnapshotOptions {
        rate: Some(CONSOLE_SNAPSHOT_RATE),
        origin: "console".into(),
        ..SnapshotOptions::default()
    };
    let mut conn = crate::cmd::database::for_writing(&app.db)?;
    let started = match snapshot::start(&mut conn, &name, &opts, Timestamp::now()) {
        Ok(s) => s,
        Err(e @ (outboxd::Error::NotFound { .. } | outboxd::Error::Capture(_))) => {
            return Ok(nothing_done(app, Nav::Capture, &e.to_string()))
        }
        Err(e) => return Err(e).context("cannot start a snapshot"),
    };
    let id = started.id.clone();
    std::thread::Builder::new()
        .name("outboxd-snapshot".into())
        .spawn(move || {
            match snapshot::drive(&mut conn, &id, &opts, &mut |_| true) {
                Ok(s) => tracing::info!(snapshot = %s.id, capture = %s.capture, rows = s.rows, state = s.state.as_str(), "snapshot from the console"),
                Err(e) => tracing::error!(snapshot = %id, error = %e, "snapshot from the console failed"),
            }
        })
        .context("cannot start a snapshot thread")?;
    tracing::info!(capture = %name, snapshot = %started.id, "snapshot started from the console");
    Ok(Notice::SnapshotStarted(name).redirect(app, "/capture"))
}
