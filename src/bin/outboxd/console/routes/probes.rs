//! `/metrics`, `/healthz` and `/livez`, on the console's address and on the
//! `[metrics] listen` one.

use std::sync::Arc;

use super::{FRESH, PAGE_WAIT, PROBE_WAIT};
use crate::console::app::{App, StatusView};
use crate::console::cache::Measured;
use crate::console::server::Response;

/// The status for /metrics and /healthz: like a page's (an older measure at
/// once while a new one runs, so a scrape never waits for a count of a
/// million rows), but waiting for the very first one.
fn probe_status(app: &App) -> Option<Arc<Measured<StatusView>>> {
    app.status
        .get(FRESH, PAGE_WAIT)
        .or_else(|| app.status.get(FRESH, PROBE_WAIT))
}

/// 200 while the process's threads run (this answer is one of them), 503
/// once it is stopping on a failure: what a liveness probe calls.
pub(super) fn livez(app: &App) -> Response {
    match app.failure.get() {
        Some(why) => Response::text(503, format!("stopping: {why}\n")),
        None => Response::text(200, "alive\n"),
    }
}

pub(super) fn healthz(app: &App) -> Response {
    let problem = |threshold: &str, message: String| {
        serde_json::json!({
            "healthy": false,
            "problems": [{ "threshold": threshold, "message": message }],
        })
    };
    if let Some(why) = app.failure.get() {
        return Response::json(503, &problem("database", why.clone()));
    }
    match probe_status(app).as_deref().map(|m| &m.value) {
        None => Response::json(
            503,
            &problem("status", "the status is still being measured".into()),
        ),
        Some(Err(e)) => Response::json(
            503,
            &problem("status", format!("cannot read the status: {e}")),
        ),
        Some(Ok((status, problems))) => match crate::cmd::status::json(status, problems) {
            Ok(v) => Response::json(if problems.is_empty() { 200 } else { 503 }, &v),
            Err(e) => Response::json(503, &problem("status", e.to_string())),
        },
    }
}

pub(super) fn metrics(app: &App) -> Response {
    let measured = probe_status(app);
    let relay = app.relay.as_ref().map(|r| r.snapshot());
    let status: Result<_, &dyn std::fmt::Display> = match measured.as_deref().map(|m| &m.value) {
        Some(Ok((s, _))) => Ok(s),
        Some(Err(e)) => Err(e),
        None => Err(&"not measured yet"),
    };
    if let Err(e) = status {
        tracing::warn!(error = %e, "cannot read the outbox status for metrics");
    }
    let health = measured.as_deref().and_then(|m| m.value.as_ref().ok());
    let text = crate::metrics::render(&crate::metrics::Inputs {
        status,
        relay: relay.as_ref(),
        health: health.map(|(_, v)| &v.health),
        db: &app.db,
    });
    let mut r = Response::text(200, text);
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r
}
