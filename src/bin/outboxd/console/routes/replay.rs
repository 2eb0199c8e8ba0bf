//! `/replay`: count, then replay.

use anyhow::{Context, Result};
use outboxd::replay::ReplayFilter;
use outboxd::Timestamp;

use super::notice::Notice;
use super::Visit;
use super::{ctx, known_consumers, nothing_done, page, parse_pattern, parse_time};
use crate::console::form::Params;
use crate::console::pages::{self, Nav, ReplayForm, ReplayView};
use crate::console::server::{Request, Response};

fn replay_form(p: &Params) -> ReplayForm {
    ReplayForm {
        consumer: p.get("consumer").unwrap_or("").into(),
        event_type: p.get("type").unwrap_or("").into(),
        since: p.get("since").unwrap_or("").into(),
        until: p.get("until").unwrap_or("").into(),
    }
}

fn replay_filter(app: &Visit, f: &ReplayForm) -> std::result::Result<ReplayFilter, String> {
    let now = Timestamp::now();
    if f.consumer.is_empty() {
        return Err("choose the consumer to replay to".into());
    }
    let mut filter =
        ReplayFilter::new(&f.consumer).known_consumers(app.consumers.names().map(str::to_string));
    if !f.event_type.is_empty() {
        filter = filter.event_type(parse_pattern(&f.event_type)?);
    }
    if !f.since.is_empty() {
        filter = filter.since(parse_time("since", &f.since, now)?);
    }
    if !f.until.is_empty() {
        filter = filter.until(parse_time("until", &f.until, now)?);
    }
    filter.validate().map_err(|e| e.to_string())?;
    Ok(filter)
}

pub(super) fn replay(app: &Visit, req: &Request) -> Result<Response> {
    let q = req.query_pairs();
    let form = replay_form(&q);
    let done = Notice::from_query(app, &q).map(|n| n.text());
    let (error, count) = if form.consumer.is_empty() {
        (None, None)
    } else {
        match replay_filter(app, &form) {
            Ok(filter) => {
                let conn = app.pool.get()?;
                match outboxd::replay::count(&conn, &filter) {
                    Ok(n) => (None, Some(n)),
                    // A name the database has never seen, with the known ones.
                    Err(e @ outboxd::Error::UnknownConsumer { .. }) => (Some(e.to_string()), None),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => (Some(e), None),
        }
    };
    let status = if error.is_some() { 400 } else { 200 };
    let view = ReplayView {
        form,
        consumers: known_consumers(app),
        error,
        count,
        done,
    };
    let body = pages::replay(&ctx(app), &view);
    Ok(page(app, status, "Replay", Nav::Replay, body))
}

pub(super) fn replay_apply(app: &Visit, form: &Params) -> Result<Response> {
    let f = replay_form(form);
    let filter = match replay_filter(app, &f) {
        Ok(filter) => filter,
        Err(e) => return Ok(nothing_done(app, Nav::Replay, &e)),
    };
    let mut conn = crate::cmd::database::for_writing(&app.db)?;
    let n =
        outboxd::replay::replay(&mut conn, &filter, Timestamp::now()).context("cannot replay")?;
    tracing::info!(replayed = n, consumer = %f.consumer, "replayed from the console");
    Ok(Notice::Replayed {
        events: n,
        to: f.consumer,
    }
    .redirect(app, "/replay"))
}
