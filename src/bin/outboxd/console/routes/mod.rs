//! Paths to handlers.
//!
//! | path | what |
//! |---|---|
//! | `GET /` | overview |
//! | `GET /events`, `GET /events/{event id or row id}` | events and one event |
//! | `GET /dead`, `POST /dead/confirm`, `POST /dead/apply` | dead letters, an action's confirmation, the action |
//! | `GET /replay`, `POST /replay` | replay: count, then do |
//! | `GET /intents`, `GET /capture`, `POST /capture/snapshot` | open publish intents; captures, their gaps and snapshots; start a snapshot |
//! | `GET /metrics`, `GET /healthz` | Prometheus text, health verdict as JSON |
//! | `GET /login`, `POST /login`, `POST /logout` | the token's session |
//!
//! Every request passes [`Auth::admit`](super::auth::Auth::admit) first,
//! which says who asks ([`Visit`]); every POST also
//! [`Auth::check_post`](super::auth::Auth::check_post), and none is taken
//! when the console is read-only.

mod capture;
mod dead;
mod events;
mod login;
mod notice;
mod overview;
mod probes;
mod replay;

use std::time::{Duration, Instant};

use anyhow::Result;
use outboxd::router::Pattern;
use outboxd::Timestamp;

use super::app::App;
use super::auth::{Access, Refusal};
use super::form::Params;
use super::pages::{self, Ctx, IntentsView, Nav};
use super::server::{Method, Request, Response};

/// A measure this recent is reused rather than asked for again.
const FRESH: Duration = Duration::from_secs(1);

/// How long a page waits for a new measure before showing the last one.
const PAGE_WAIT: Duration = Duration::from_millis(40);

/// How long /metrics and /healthz wait for the first measure.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// The console's stylesheet.
const CSS: &str = include_str!("../console.css");

/// Answers one request on the `[metrics] listen` address: counts only, no
/// token, any Host, as it was before the console existed.
pub(crate) fn handle_probes(app: &App, req: &Request) -> Response {
    match (req.method, req.path.as_str()) {
        (Method::Get, "/metrics") => probes::metrics(app),
        (Method::Get, "/healthz") => probes::healthz(app),
        (Method::Get, "/livez") => probes::livez(app),
        (Method::Get, _) => Response::text(
            404,
            "not found; this address serves /metrics and /healthz ([http] listen serves the console)\n",
        ),
        _ => Response::text(405, "only GET /metrics and /healthz\n"),
    }
}

/// One request's view of the console: what every handler shares, and who
/// asks (the CSRF token its forms carry, whether it may log out).
pub(crate) struct Visit<'a> {
    app: &'a App,
    access: Access,
}

impl std::ops::Deref for Visit<'_> {
    type Target = App;

    fn deref(&self) -> &App {
        self.app
    }
}

/// Answers one request on the console's address.
pub(crate) fn handle(app: &App, req: &Request) -> Response {
    let path = req.path.as_str();
    // Liveness says nothing about the data: no token, any Host.
    if (req.method, path) == (Method::Get, "/livez") {
        return probes::livez(app);
    }
    let access = match app.auth.admit(req, Instant::now()) {
        Ok(access) => access,
        Err(Refusal::Forbidden(m)) => return Response::text(403, format!("{m}\n")),
        Err(Refusal::Throttled(wait)) => return login::throttled(wait),
        Err(Refusal::Unauthenticated) => {
            let visitor = Visit {
                app,
                access: Access::Visitor,
            };
            if !matches!(path, "/login" | "/console.css") {
                return login::unauthenticated(&visitor, req);
            }
            visitor.access
        }
    };
    let app = &Visit { app, access };
    let result = match (req.method, path) {
        (Method::Get, "/") => overview::overview(app),
        (Method::Get, "/metrics") => Ok(probes::metrics(app)),
        (Method::Get, "/healthz") => Ok(probes::healthz(app)),
        (Method::Get, "/console.css") => Ok(Response {
            status: 200,
            content_type: "text/css; charset=utf-8",
            headers: Vec::new(),
            body: CSS.as_bytes().to_vec(),
        }),
        (Method::Get, "/events") => events::events(app, req),
        (Method::Get, p) if p.starts_with("/events/") => events::event(app, &p["/events/".len()..]),
        (Method::Get, "/dead") => dead::dead(app, req),
        (Method::Post, "/dead/confirm") => post(app, req, dead::dead_confirm),
        (Method::Post, "/dead/apply") => post(app, req, dead::dead_apply),
        (Method::Get, "/replay") => replay::replay(app, req),
        (Method::Post, "/replay") => post(app, req, replay::replay_apply),
        (Method::Get, "/intents") => intents(app),
        (Method::Get, "/capture") => capture::capture(app, req),
        (Method::Post, "/capture/snapshot") => post(app, req, capture::snapshot),
        (Method::Get, "/login") => Ok(login::login_page(app, 200, None)),
        (Method::Post, "/login") => Ok(login::login(app, req)),
        (Method::Post, "/logout") => Ok(login::logout(app, req)),
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

fn ctx<'a>(app: &'a Visit<'_>) -> Ctx<'a> {
    Ctx {
        csrf: app.auth.csrf(&app.access),
        read_only: app.read_only,
        logout: app.access.logged_in(),
        now: Timestamp::now(),
    }
}

fn page(app: &Visit, status: u16, title: &str, nav: Nav, body: maud::Markup) -> Response {
    Response::html(status, pages::layout(&ctx(app), title, nav, body))
}

/// Runs a POST handler after the read-only, Origin and CSRF checks.
fn post(
    app: &Visit,
    req: &Request,
    handler: fn(&Visit, &Params) -> Result<Response>,
) -> Result<Response> {
    if app.read_only {
        return Ok(Response::text(
            403,
            "the console is read-only ([http] read_only = true); nothing was changed\n",
        ));
    }
    let form = req.form();
    if let Err(refusal) = app.auth.check_post(req, &form, &app.access) {
        return Ok(refused(app, refusal));
    }
    handler(app, &form)
}

fn refused(app: &Visit, refusal: Refusal) -> Response {
    let m = match refusal {
        Refusal::Forbidden(m) => m,
        Refusal::Unauthenticated => "log in first".into(),
        Refusal::Throttled(wait) => return login::throttled(wait),
    };
    page(
        app,
        403,
        "Refused",
        Nav::None,
        pages::message("Refused", &m),
    )
}

/// A 400 page for a form that asks for nothing that can be done.
fn nothing_done(app: &Visit, nav: Nav, why: &str) -> Response {
    page(
        app,
        400,
        "Nothing done",
        nav,
        pages::message("Nothing done", why),
    )
}

// Events.

/// A time filter, read by the product's one time parser
/// ([`outboxd::clock::parse_time`], as `replay --since` is), its field named
/// in the error.
pub(crate) fn parse_time(
    field: &str,
    s: &str,
    now: Timestamp,
) -> std::result::Result<Timestamp, String> {
    outboxd::clock::parse_time(s, now).map_err(|e| format!("{field}: {e}"))
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

// ---------------------------------------------------------------------------
// Intents.

fn intents(app: &Visit) -> Result<Response> {
    let conn = app.pool.get()?;
    let open = outboxd::intents::list_open(&conn)?;
    Ok(page(
        app,
        200,
        "Intents",
        Nav::Intents,
        pages::intents(&ctx(app), &IntentsView { open }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_field_takes_rfc_3339_a_bare_date_time_or_how_long_ago() {
        let now: Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
        let at = |s| parse_time("since", s, now).map(|t| t.to_string());
        let seven = "2026-11-30T07:00:00.000Z";
        for given in [
            "2026-11-30T07:00:00Z",
            "2026-11-30T07:00",
            "1h",
            "1h ago",
            "60m",
        ] {
            assert_eq!(at(given).as_deref(), Ok(seven), "{given}");
        }
        let e = at("yesterday").unwrap_err();
        assert!(e.starts_with("since: invalid time \"yesterday\""), "{e}");
    }
}
