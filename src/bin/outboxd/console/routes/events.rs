//! `/events` and `/events/{id}`.

use anyhow::Result;
use outboxd::inspect::{self, EventFilter, StateFilter};
use outboxd::Timestamp;

use super::Visit;
use super::{ctx, known_consumers, page, parse_pattern, parse_time};
use crate::console::pages::{self, EventView, EventsForm, EventsView, Nav};
use crate::console::server::{Request, Response};

pub(super) fn events(app: &Visit, req: &Request) -> Result<Response> {
    let q = req.query_pairs();
    let now = Timestamp::now();
    let form = EventsForm {
        state: q.get("state").unwrap_or("").into(),
        event_type: q.get("type").unwrap_or("").into(),
        tenant: q.get("tenant").unwrap_or("").into(),
        consumer: q.get("consumer").unwrap_or("").into(),
        missing: q.get("missing") == Some("1"),
        since: q.get("since").unwrap_or("").into(),
        until: q.get("until").unwrap_or("").into(),
        ordering_key: q.get("ordering_key").unwrap_or("").into(),
        key: q.get("key").unwrap_or("").into(),
    };
    let filter = (|| -> std::result::Result<EventFilter, String> {
        Ok(EventFilter {
            state: match q.get("state") {
                None => None,
                Some(s) => Some(
                    StateFilter::parse(s).ok_or_else(|| format!("state: {s:?} is not a state"))?,
                ),
            },
            event_type: q.get("type").map(parse_pattern).transpose()?,
            tenant: q.get("tenant").map(str::to_string),
            consumer: q.get("consumer").map(str::to_string),
            missing: form.missing,
            since: q
                .get("since")
                .map(|s| parse_time("since", s, now))
                .transpose()?,
            until: q
                .get("until")
                .map(|s| parse_time("until", s, now))
                .transpose()?,
            before: q.get("before").and_then(|b| b.parse().ok()),
            ordering_key: q.get("ordering_key").map(str::to_string),
            key: q.get("key").map(str::to_string),
        })
    })();
    let (error, page_rows) = match filter {
        Ok(f) => {
            let conn = app.pool.get()?;
            (None, inspect::events_page(&conn, &f, now)?)
        }
        Err(e) => (Some(e), inspect::EventsPage::default()),
    };
    let status = if error.is_some() { 400 } else { 200 };
    let view = EventsView {
        form,
        error,
        page: page_rows,
        consumers: known_consumers(app),
    };
    let body = pages::events(&ctx(app), &view);
    Ok(page(app, status, "Events", Nav::Events, body))
}

pub(super) fn event(app: &Visit, id: &str) -> Result<Response> {
    let conn = app.pool.get()?;
    let Some(detail) = inspect::find_event(&conn, id)? else {
        return Ok(page(
            app,
            404,
            "Not found",
            Nav::Events,
            pages::message(
                "Not found",
                &format!("No event has the row id or event id {id:?}."),
            ),
        ));
    };
    let expected: Vec<String> = app
        .consumers
        .consumers_for(&detail.row.event_type)
        .map(str::to_string)
        .collect();
    let title = format!("Event {}", detail.row.id);
    Ok(page(
        app,
        200,
        &title,
        Nav::Events,
        pages::event(&ctx(app), &EventView { detail, expected }),
    ))
}
