//! The console's HTML. maud escapes every value written into a template
//! (text and attributes alike); nothing here uses `PreEscaped` on data from
//! the database, so a payload, tenant id, key or error text written by
//! anyone is shown as text. No page carries a script: links and forms do
//! everything, and the CSP forbids scripts anyway.
//!
//! Each page renders one view struct (`EventsView`, `DeadView`, ...) that
//! the routes fill: nothing here reads the database or the request.

mod capture;
mod dead;
mod events;
mod intents;
mod overview;
mod replay;

pub(crate) use capture::{capture, CaptureView};
pub(crate) use dead::{confirm_dead, dead, ConfirmDeadView, DeadView};
pub(crate) use events::{event, events, EventView, EventsForm, EventsView};
pub(crate) use intents::{intents, IntentsView};
pub(crate) use overview::{overview, ConsumerLine, OverviewView};
pub(crate) use replay::{replay, ReplayForm, ReplayView};

use maud::{html, Markup, DOCTYPE};
use outboxd::Timestamp;

use super::auth::CSRF_FIELD;
use crate::cmd::support::human;

/// What every page needs.
pub(crate) struct Ctx<'a> {
    /// The CSRF token for forms.
    pub(crate) csrf: &'a str,
    /// Actions hidden.
    pub(crate) read_only: bool,
    /// Offer to log out (a token is in use).
    pub(crate) logout: bool,
    /// The time the page is measured against.
    pub(crate) now: Timestamp,
}

/// The sections, for the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    /// /
    Overview,
    /// /events
    Events,
    /// /dead
    Dead,
    /// /replay
    Replay,
    /// /intents
    Intents,
    /// /capture
    Capture,
    /// None highlighted.
    None,
}

const NAV: [(Nav, &str, &str); 6] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Events, "/events", "Events"),
    (Nav::Dead, "/dead", "Dead letters"),
    (Nav::Replay, "/replay", "Replay"),
    (Nav::Intents, "/intents", "Intents"),
    (Nav::Capture, "/capture", "Capture"),
];

/// A whole page around `body`.
pub(crate) fn layout(ctx: &Ctx<'_>, title: &str, current: Nav, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outboxd" }
                link rel="stylesheet" href="/console.css";
            }
            body {
                header {
                    span.brand { "outboxd" }
                    nav {
                        @for (nav, href, label) in NAV {
                            a.current[nav == current] href=(href) { (label) }
                        }
                    }
                    div.right {
                        @if ctx.read_only { span.badge { "read-only" } }
                        @if ctx.logout {
                            form method="post" action="/logout" {
                                (csrf(ctx))
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
    .into_string()
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf(ctx: &Ctx<'_>) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(ctx.csrf); }
}

/// A time as `2026-11-30 07:18:00` with how long ago (or from now).
pub(crate) fn time(ms: i64, now: Timestamp) -> Markup {
    let t = Timestamp::from_millis(ms);
    let text = t.to_string();
    let short = text.get(..19).unwrap_or(&text).replace('T', " ");
    let rel = if ms <= now.as_millis() {
        format!("{} ago", human(now.since(t)))
    } else {
        format!("in {}", human(t.since(now)))
    };
    html! { span.mono title=(text) { (short) } " " span.muted { "(" (rel) ")" } }
}

fn opt_time(ms: Option<i64>, now: Timestamp) -> Markup {
    match ms {
        Some(ms) => time(ms, now),
        None => html! { span.muted { "—" } },
    }
}

fn state_badge(state: &str) -> Markup {
    html! { span class={"badge state-" (state)} { (state) } }
}

fn event_link(id: i64) -> String {
    format!("/events/{id}")
}

/// `/login`, with why the last try failed. Its form carries no CSRF token:
/// there is no session yet (the origin check holds).
pub(crate) fn login(error: Option<&str>) -> Markup {
    html! {
        h1 { "Log in" }
        @if let Some(e) = error { div.notice.bad id="login-error" { (e) } }
        form.stack.card method="post" action="/login" {
            label { "token (the value of [http] token_env)" input type="password" name="token" autocomplete="current-password" autofocus; }
            button type="submit" { "Log in" }
        }
    }
}

/// A page saying what went wrong.
pub(crate) fn message(title: &str, text: &str) -> Markup {
    html! { h1 { (title) } div.notice.bad id="message" { (text) } p { a href="/" { "Back to the overview" } } }
}
