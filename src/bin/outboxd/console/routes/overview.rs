//! `/`: the overview's view, from the measures in the background.

use anyhow::Result;
use outboxd::Timestamp;

use super::Visit;
use super::{ctx, page, FRESH, PAGE_WAIT};
use crate::console::chart::{self, Series};
use crate::console::pages::{self, ConsumerLine, Nav, OverviewView};
use crate::console::server::Response;

pub(super) fn overview(app: &Visit) -> Result<Response> {
    let now = Timestamp::now();
    let status = app.status.get(FRESH, PAGE_WAIT);
    let extras = app.extras.get(FRESH, PAGE_WAIT);
    let relay = app.relay.as_ref().map(|r| r.snapshot());
    let ledger = status
        .as_deref()
        .and_then(|m| m.value.as_ref().ok())
        .map(|(s, _)| s.delivered_by_consumer.clone())
        .unwrap_or_default();
    let backlog = extras.as_deref().and_then(|e| e.value.backlog.as_ref());
    let mut names: Vec<String> = app.consumers.names().map(str::to_string).collect();
    for name in ledger.keys() {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let consumers = names
        .iter()
        .map(|name| ConsumerLine {
            name: name.clone(),
            delivered: ledger.get(name).copied().unwrap_or(0),
            backlog: app
                .consumers
                .position(name)
                .and_then(|i| backlog?.as_ref().ok()?.per_consumer.get(i).copied()),
            since_start: relay.as_ref().and_then(|m| {
                m.per_consumer
                    .iter()
                    .find(|c| &c.name == name)
                    .map(|c| (c.delivered, c.retried, c.poisoned))
            }),
        })
        .collect();
    let backlog_note = match backlog {
        _ if app.consumers.is_empty() => Some(
            "Retrying and dead per consumer need the consumers' types: start the console \
             with --config."
                .to_string(),
        ),
        Some(Err(e)) => Some(format!("Cannot count retrying and dead per consumer: {e}")),
        _ => None,
    };
    let now_minute = chart::minute_of(now);
    let rows = match extras.as_deref().and_then(|e| e.value.chart_rows.as_ref()) {
        Some(Ok(rows)) => Some(Series::from_rows(now_minute, rows)),
        Some(Err(_)) | None => None,
    };
    let (chart, chart_note) = match (rows, &app.history, app.live_totals()) {
        (Some(table), Some(h), Some(live)) => (
            Some(table.with_retries_of(&h.series(now_minute, live))),
            "Derived from the table; retries counted by this relay since it started.",
        ),
        (Some(table), ..) => (
            Some(table),
            "Derived from the table (no relay in this process): retries leave no trace there.",
        ),
        (None, ..) => (None, "The figures are being measured."),
    };
    let view = OverviewView {
        status: status.as_deref().map(|m| &m.value),
        measured: status.as_deref().map(|m| (m.at, m.took)),
        consumers,
        backlog_truncated: backlog.is_some_and(|b| b.as_ref().is_ok_and(|b| b.truncated)),
        backlog_note,
        chart,
        chart_note,
    };
    Ok(page(
        app,
        200,
        "Overview",
        Nav::Overview,
        pages::overview(&ctx(app), &view),
    ))
}
