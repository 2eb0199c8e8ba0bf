//! Paths to handlers.
//!
//! | path | what |
//! |---|---|
//! | `GET /` | overview |
//! | `GET /events`, `GET /events/{event id or row id}` | events and one event |
//! | `GET /dead`, `POST /dead/confirm`, `POST /dead/apply` | dead letters, an action's confirmation, the action |
//! | `GET /replay`, `POST /replay` | replay: count, then do |
//! | `GET /intents`, `GET /capture` | open publish intents, capture |
//! | `GET /metrics`, `GET /healthz` | Prometheus text, health verdict as JSON |
//! | `GET /login`, `POST /login`, `POST /logout` | the token's session |
//!
//! Every request passes [`Auth::admit`](super::auth::Auth::admit) first;
//! every POST also [`Auth::check_post`](super::auth::Auth::check_post), and
//! none is taken when the console is read-only.

use std::time::Duration;

use anyhow::{Context, Result};
use outboxd::dead_letter::{self, Selector};
use outboxd::replay::ReplayFilter;
use outboxd::router::Pattern;
use outboxd::Timestamp;

use super::auth::Refusal;
use super::chart::Series;
use super::pages::{self, ConsumerLine, Ctx, EventsForm, Nav, OverviewView, ReplayForm};
use super::queries::{self, EventFilter, StateFilter};
use super::server::{encode, Method, Params, Request, Response};
use super::App;
use crate::args::parse_duration;
use crate::cmd::support::count;

/// A measure this recent is reused rather than asked for again.
const FRESH: Duration = Duration::from_secs(1);

/// How long a page waits for a new measure before showing the last one.
const PAGE_WAIT: Duration = Duration::from_millis(40);

/// How long /metrics and /healthz wait for the first measure.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// The status for /metrics and /healthz: like a page's (an older measure at
/// once while a new one runs, so a scrape never waits for a count of a
/// million rows), but waiting for the very first one.
fn probe_status(app: &App) -> Option<std::sync::Arc<super::cache::Measured<super::StatusView>>> {
    app.status
        .get(FRESH, PAGE_WAIT)
        .or_else(|| app.status.get(FRESH, PROBE_WAIT))
}

const CSS: &str = include_str!("console.css");

/// Answers one request on the `[metrics] listen` address: counts only, no
/// token, any Host, as it was before the console existed.
pub fn handle_probes(app: &App, req: &Request) -> Response {
    match (req.method, req.path.as_str()) {
        (Method::Get, "/metrics") => metrics(app),
        (Method::Get, "/healthz") => healthz(app),
        (Method::Get, "/livez") => livez(app),
        (Method::Get, _) => Response::text(
            404,
            "not found; this address serves /metrics and /healthz ([http] listen serves the console)\n",
        ),
        _ => Response::text(405, "only GET /metrics and /healthz\n"),
    }
}

/// Answers one request on the console's address.
pub fn handle(app: &App, req: &Request) -> Response {
    let path = req.path.as_str();
    // Liveness says nothing about the data: no token, any Host.
    if (req.method, path) == (Method::Get, "/livez") {
        return livez(app);
    }
    match app.auth.admit(req, Timestamp::now()) {
        Ok(()) => {}
        Err(Refusal::Forbidden(m)) => return Response::text(403, format!("{m}\n")),
        Err(Refusal::Unauthenticated) => {
            let open = matches!(path, "/login" | "/console.css");
            if !open {
                return unauthenticated(app, req);
            }
        }
    }
    let result = match (req.method, path) {
        (Method::Get, "/") => overview(app),
        (Method::Get, "/metrics") => Ok(metrics(app)),
        (Method::Get, "/healthz") => Ok(healthz(app)),
        (Method::Get, "/console.css") => Ok(Response {
            status: 200,
            content_type: "text/css; charset=utf-8",
            headers: Vec::new(),
            body: CSS.as_bytes().to_vec(),
        }),
        (Method::Get, "/events") => events(app, req),
        (Method::Get, p) if p.starts_with("/events/") => event(app, &p["/events/".len()..]),
        (Method::Get, "/dead") => dead(app, req),
        (Method::Post, "/dead/confirm") => post(app, req, dead_confirm),
        (Method::Post, "/dead/apply") => post(app, req, dead_apply),
        (Method::Get, "/replay") => replay(app, req),
        (Method::Post, "/replay") => post(app, req, replay_apply),
        (Method::Get, "/intents") => intents(app),
        (Method::Get, "/capture") => capture(app),
        (Method::Get, "/login") => Ok(login_page(app, 200, None)),
        (Method::Post, "/login") => Ok(login(app, req)),
        (Method::Post, "/logout") => Ok(logout(app, req)),
        (Method::Get, _) => Ok(page(
            app,
            404,
            "Not found",
            Nav::None,
            pages::message("Not found", &format!("Nothing is served at {path}.")),
        )),
        _ => Ok(Response::text(405, "method not allowed\n")),
    };
    result.unwrap_or_else(|e| {
        tracing::warn!(path, error = %format!("{e:#}"), "a console page failed");
        page(
            app,
            500,
            "Error",
            Nav::None,
            pages::message("Something went wrong", &format!("{e:#}")),
        )
    })
}

fn ctx(app: &App) -> Ctx<'_> {
    Ctx {
        csrf: app.auth.csrf(),
        read_only: app.read_only,
        logout: app.auth.needs_token(),
        now: Timestamp::now(),
    }
}

fn page(app: &App, status: u16, title: &str, nav: Nav, body: maud::Markup) -> Response {
    Response::html(status, pages::layout(&ctx(app), title, nav, body))
}

fn unauthenticated(app: &App, req: &Request) -> Response {
    let is_page =
        req.method == Method::Get && !matches!(req.path.as_str(), "/metrics" | "/healthz");
    if is_page {
        login_page(app, 401, None)
    } else {
        Response::text(
            401,
            "a token is required: Authorization: Bearer <token>, or log in at /login\n",
        )
        .with_header("WWW-Authenticate", "Bearer realm=\"outboxd\"".into())
    }
}

/// Runs a POST handler after the read-only, Origin and CSRF checks.
fn post(
    app: &App,
    req: &Request,
    handler: fn(&App, &Params) -> Result<Response>,
) -> Result<Response> {
    if app.read_only {
        return Ok(Response::text(
            403,
            "the console is read-only ([http] read_only = true); nothing was changed\n",
        ));
    }
    let form = req.form();
    if let Err(refusal) = app.auth.check_post(req, &form) {
        return Ok(refused(app, refusal));
    }
    handler(app, &form)
}

fn refused(app: &App, refusal: Refusal) -> Response {
    let m = match refusal {
        Refusal::Forbidden(m) => m,
        Refusal::Unauthenticated => "log in first".into(),
    };
    page(
        app,
        403,
        "Refused",
        Nav::None,
        pages::message("Refused", &m),
    )
}

// ---------------------------------------------------------------------------
// Health and metrics.

/// 200 while the process's threads run (this answer is one of them), 503
/// once it is stopping on a failure: what a liveness probe calls.
fn livez(app: &App) -> Response {
    match app.failure.get() {
        Some(why) => Response::text(503, format!("stopping: {why}\n")),
        None => Response::text(200, "alive\n"),
    }
}

fn healthz(app: &App) -> Response {
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

fn metrics(app: &App) -> Response {
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

// ---------------------------------------------------------------------------
// Overview.

fn overview(app: &App) -> Result<Response> {
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
    let now_minute = super::chart::minute_of(now);
    let (chart, chart_note) = match &app.history {
        Some(h) => (
            app.live_totals().map(|live| h.series(now_minute, live)),
            "Figures kept by this relay since it started.",
        ),
        None => match extras.as_deref().and_then(|e| e.value.chart_rows.as_ref()) {
            Some(Ok(rows)) => (
                Some(Series::from_rows(now_minute, rows)),
                "Derived from the table (no relay in this process): retries leave no trace there.",
            ),
            Some(Err(_)) | None => (None, "The figures are being measured."),
        },
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

// ---------------------------------------------------------------------------
// Events.

/// A time filter: RFC 3339, a date-time without zone (UTC), or a duration
/// meaning that long ago (`1h`).
fn parse_time(field: &str, s: &str, now: Timestamp) -> std::result::Result<Timestamp, String> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    for suffix in ["Z", ":00Z"] {
        if let Ok(t) = format!("{s}{suffix}").parse::<Timestamp>() {
            return Ok(t);
        }
    }
    if let Ok(d) = parse_duration(s) {
        return Ok(now.minus(d));
    }
    Err(format!(
        "{field}: {s:?} is not a time; use RFC 3339 (2026-11-30T07:18:00Z) or how long ago (30m, 2h, 1d)"
    ))
}

fn parse_pattern(s: &str) -> std::result::Result<Pattern, String> {
    Pattern::parse(s).map_err(|e| e.to_string())
}

/// The consumer names the console knows: configured, then from the ledger.
fn known_consumers(app: &App) -> Vec<String> {
    let mut names: Vec<String> = app.consumers.names().map(str::to_string).collect();
    if let Some(m) = app.status.get(Duration::from_secs(3600), Duration::ZERO) {
        if let Ok((s, _)) = &m.value {
            for n in s.delivered_by_consumer.keys() {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
    }
    names
}

fn events(app: &App, req: &Request) -> Result<Response> {
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
        })
    })();
    let (error, page_rows) = match filter {
        Ok(f) => {
            let conn = app.pool.get()?;
            (None, queries::events_page(&conn, &f, now)?)
        }
        Err(e) => (Some(e), queries::EventsPage::default()),
    };
    let body = pages::events(
        &ctx(app),
        &form,
        error.as_deref(),
        &page_rows,
        &known_consumers(app),
    );
    Ok(page(
        app,
        if error.is_some() { 400 } else { 200 },
        "Events",
        Nav::Events,
        body,
    ))
}

fn event(app: &App, id: &str) -> Result<Response> {
    let conn = app.pool.get()?;
    let Some(detail) = queries::find_event(&conn, id)? else {
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
        pages::event(&ctx(app), &detail, &expected),
    ))
}

// ---------------------------------------------------------------------------
// Dead letters.

fn dead(app: &App, req: &Request) -> Result<Response> {
    let q = req.query_pairs();
    let pattern_text = q.get("type").unwrap_or("").to_string();
    let (pattern, error) = match q.get("type").map(parse_pattern).transpose() {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    let after = match (q.get("at"), q.get("before")) {
        (Some(at), Some(id)) => at.parse().ok().zip(id.parse().ok()),
        _ => None,
    };
    let done = Notice::from_query(app, &q).map(|n| n.text());
    let conn = app.pool.get()?;
    let total = queries::dead_total(&conn)?;
    let rows = if error.is_none() {
        queries::dead_page(&conn, pattern.as_ref(), after)?
    } else {
        queries::DeadPage::default()
    };
    let body = pages::dead(
        &ctx(app),
        &pattern_text,
        error.as_deref(),
        done,
        total,
        &rows,
    );
    Ok(page(app, 200, "Dead letters", Nav::Dead, body))
}

/// A dead-letter action read from a form: (verb, op, what it covers,
/// selectors, the row ids given, the pattern given).
struct DeadAction {
    requeue: bool,
    op: String,
    what: String,
    selectors: Vec<Selector>,
    ids: Vec<String>,
    pattern: String,
}

fn dead_action(form: &Params) -> std::result::Result<DeadAction, String> {
    let op = form.get("op").unwrap_or("").to_string();
    let (verb, scope) = op.split_once(':').ok_or("no action was chosen")?;
    let (verb, scope) = (verb.to_string(), scope.to_string());
    let requeue = match verb.as_str() {
        "requeue" => true,
        "discard" => false,
        _ => return Err(format!("{verb:?} is not an action")),
    };
    let pattern = form.get("type").unwrap_or("").to_string();
    let ids: Vec<String> = form.all("id").into_iter().map(str::to_string).collect();
    let (what, selectors) = match scope.as_str() {
        "selected" => {
            if ids.is_empty() {
                return Err("no dead letter was selected; tick the rows first".into());
            }
            for id in &ids {
                id.parse::<i64>()
                    .map_err(|_| format!("{id:?} is not a row id"))?;
            }
            (
                "the selected rows".to_string(),
                ids.iter().map(|id| Selector::One(id.clone())).collect(),
            )
        }
        "type" => (
            format!("every one of type {pattern}"),
            vec![Selector::Type(parse_pattern(&pattern)?)],
        ),
        "all" => ("all of them".to_string(), vec![Selector::All]),
        _ => return Err(format!("{scope:?} is not a choice of rows")),
    };
    Ok(DeadAction {
        requeue,
        op,
        what,
        selectors,
        ids: if scope == "selected" { ids } else { Vec::new() },
        pattern,
    })
}

/// A 400 page for a form that asks for nothing that can be done.
fn nothing_done(app: &App, nav: Nav, why: &str) -> Response {
    page(
        app,
        400,
        "Nothing done",
        nav,
        pages::message("Nothing done", why),
    )
}

fn dead_confirm(app: &App, form: &Params) -> Result<Response> {
    let action = match dead_action(form) {
        Ok(a) => a,
        Err(e) => return Ok(nothing_done(app, Nav::Dead, &e)),
    };
    let conn = app.pool.get()?;
    let mut count = 0;
    for s in &action.selectors {
        count += dead_letter::count(&conn, s)?;
    }
    let verb = if action.requeue { "Requeue" } else { "Discard" };
    let body = pages::confirm_dead(
        &ctx(app),
        verb,
        &action.op,
        &action.what,
        count,
        &action.ids,
        &action.pattern,
    );
    Ok(page(app, 200, "Confirm", Nav::Dead, body))
}

fn dead_apply(app: &App, form: &Params) -> Result<Response> {
    let action = match dead_action(form) {
        Ok(a) => a,
        Err(e) => return Ok(nothing_done(app, Nav::Dead, &e)),
    };
    let mut conn = crate::cmd::database::for_writing(&app.db)?;
    let mut changed = 0;
    for s in &action.selectors {
        let n = if action.requeue {
            dead_letter::requeue(&mut conn, s, Timestamp::now())
        } else {
            dead_letter::discard(&mut conn, s)
        };
        changed += match n {
            Ok(n) => n,
            // A selected row requeued or discarded meanwhile.
            Err(outboxd::Error::NotFound { .. }) => 0,
            Err(e) => return Err(e).context("cannot change the dead letters"),
        };
    }
    let notice = if action.requeue {
        Notice::Requeued(changed)
    } else {
        Notice::Discarded(changed)
    };
    tracing::info!(
        changed,
        action = notice.verb(),
        "dead letters changed from the console"
    );
    Ok(notice.redirect(app, "/dead"))
}

// ---------------------------------------------------------------------------
// Replay.

fn replay_form(p: &Params) -> ReplayForm {
    ReplayForm {
        consumer: p.get("consumer").unwrap_or("").into(),
        event_type: p.get("type").unwrap_or("").into(),
        since: p.get("since").unwrap_or("").into(),
        until: p.get("until").unwrap_or("").into(),
    }
}

fn replay_filter(app: &App, f: &ReplayForm) -> std::result::Result<ReplayFilter, String> {
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

fn replay(app: &App, req: &Request) -> Result<Response> {
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
    let body = pages::replay(
        &ctx(app),
        &form,
        &known_consumers(app),
        error.as_deref(),
        count,
        done,
    );
    Ok(page(
        app,
        if error.is_some() { 400 } else { 200 },
        "Replay",
        Nav::Replay,
        body,
    ))
}

fn replay_apply(app: &App, form: &Params) -> Result<Response> {
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

// ---------------------------------------------------------------------------
// Banners.

/// What an action did, shown as a banner on the page its POST redirects to.
/// The redirect carries it in `done`, sealed by
/// [`Auth::seal_notice`](super::auth::Auth::seal_notice); a `done` the
/// console did not seal (a link made elsewhere, `?done=requeued+5`) shows
/// nothing, so every banner is one the server issued.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Notice {
    /// Dead letters requeued.
    Requeued(u64),
    /// Dead letters discarded.
    Discarded(u64),
    /// Events replayed to a consumer.
    Replayed { events: u64, to: String },
}

impl Notice {
    /// The query parameter that carries a sealed notice.
    const PARAM: &'static str = "done";

    fn verb(&self) -> &'static str {
        match self {
            Notice::Requeued(_) => "requeued",
            Notice::Discarded(_) => "discarded",
            Notice::Replayed { .. } => "replayed",
        }
    }

    /// `requeued:5`, `discarded:5`, `replayed:5:search`.
    fn encode(&self) -> String {
        match self {
            Notice::Requeued(n) | Notice::Discarded(n) => format!("{}:{n}", self.verb()),
            Notice::Replayed { events, to } => format!("{}:{events}:{to}", self.verb()),
        }
    }

    fn decode(s: &str) -> Option<Notice> {
        let (verb, rest) = s.split_once(':')?;
        match verb {
            "requeued" => rest.parse().ok().map(Notice::Requeued),
            "discarded" => rest.parse().ok().map(Notice::Discarded),
            "replayed" => {
                let (n, to) = rest.split_once(':')?;
                Some(Notice::Replayed {
                    events: n.parse().ok()?,
                    to: to.to_string(),
                })
            }
            _ => None,
        }
    }

    /// The banner's text.
    fn text(&self) -> String {
        match self {
            Notice::Requeued(n) => format!(
                "Requeued {}; the relay delivers them now.",
                count(*n, "dead letter", "dead letters")
            ),
            Notice::Discarded(n) => {
                format!("Discarded {}.", count(*n, "dead letter", "dead letters"))
            }
            Notice::Replayed { events, to } => format!(
                "Replayed {} to {to}; the relay delivers them now.",
                count(*events, "event", "events")
            ),
        }
    }

    /// The 303 to `path` showing this notice.
    fn redirect(&self, app: &App, path: &str) -> Response {
        let sealed = app.auth.seal_notice(&self.encode(), Timestamp::now());
        Response::see_other(&format!("{path}?{}={}", Self::PARAM, encode(&sealed)))
    }

    /// The notice a page's query carries, if the console sealed it.
    fn from_query(app: &App, q: &Params) -> Option<Notice> {
        let sealed = q.get(Self::PARAM)?;
        Notice::decode(app.auth.open_notice(sealed, Timestamp::now())?)
    }
}

// ---------------------------------------------------------------------------
// Intents, capture, login.

fn intents(app: &App) -> Result<Response> {
    let conn = app.pool.get()?;
    let open = outboxd::intents::list_open(&conn)?;
    Ok(page(
        app,
        200,
        "Intents",
        Nav::Intents,
        pages::intents(&ctx(app), &open),
    ))
}

fn capture(app: &App) -> Result<Response> {
    let conn = app.pool.get()?;
    let captures = outboxd::capture::inspect(&conn)?;
    Ok(page(
        app,
        200,
        "Capture",
        Nav::Capture,
        pages::capture(&ctx(app), &captures),
    ))
}

fn login_page(app: &App, status: u16, error: Option<&str>) -> Response {
    if !app.auth.needs_token() {
        return Response::see_other("/");
    }
    page(
        app,
        status,
        "Log in",
        Nav::None,
        pages::login(&ctx(app), error),
    )
}

fn login(app: &App, req: &Request) -> Response {
    let form = req.form();
    if let Err(refusal) = app.auth.check_post(req, &form) {
        return refused(app, refusal);
    }
    let behind_tls = req.header("x-forwarded-proto") == Some("https");
    match app.auth.login(
        form.get("token").unwrap_or(""),
        behind_tls,
        Timestamp::now(),
    ) {
        Some(cookie) => Response::see_other("/").with_header("Set-Cookie", cookie),
        None => login_page(app, 401, Some("That is not the token.")),
    }
}

fn logout(app: &App, req: &Request) -> Response {
    let form = req.form();
    if let Err(refusal) = app.auth.check_post(req, &form) {
        return refused(app, refusal);
    }
    Response::see_other("/login").with_header("Set-Cookie", app.auth.logout())
}
