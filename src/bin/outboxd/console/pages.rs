//! The console's HTML. maud escapes every value written into a template
//! (text and attributes alike); nothing here uses `PreEscaped` on data from
//! the database, so a payload, tenant id, key or error text written by
//! anyone is shown as text. No page carries a script: links and forms do
//! everything, and the CSP forbids scripts anyway.

use std::time::Duration;

use maud::{html, Markup, DOCTYPE};
use outboxd::intents::Intent;
use outboxd::Timestamp;

use super::auth::CSRF_FIELD;
use super::chart::{self, Series};
use super::form::query;
use crate::cmd::support::{human, noun};
use crate::config::alerts::Problem;
use outboxd::inspect::{DeadPage, EventDetail, EventRow, EventsPage, StateFilter, PAYLOAD_CAP};

/// What every page needs.
pub struct Ctx<'a> {
    /// The CSRF token for forms.
    pub csrf: &'a str,
    /// Actions hidden.
    pub read_only: bool,
    /// Offer to log out (a token is in use).
    pub logout: bool,
    /// The time the page is measured against.
    pub now: Timestamp,
}

/// The sections, for the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
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
pub fn layout(ctx: &Ctx<'_>, title: &str, current: Nav, body: Markup) -> String {
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
pub fn csrf(ctx: &Ctx<'_>) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(ctx.csrf); }
}

/// A time as `2026-11-30 07:18:00` with how long ago (or from now).
pub fn time(ms: i64, now: Timestamp) -> Markup {
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

// ---------------------------------------------------------------------------
// Overview.

/// The overview's figures.
pub struct OverviewView<'a> {
    /// The status and verdict (None while the first measure runs).
    pub status: Option<&'a super::StatusView>,
    /// When the status was measured, and how long it took.
    pub measured: Option<(Timestamp, Duration)>,
    /// (consumer, delivered in the ledger, retrying, dead, since start
    /// (delivered, retry, poison)).
    pub consumers: Vec<ConsumerLine>,
    /// True when retrying/dead per consumer were cut short by a bound.
    pub backlog_truncated: bool,
    /// Why the per-consumer backlog is not shown, if it is not.
    pub backlog_note: Option<String>,
    /// The chart.
    pub chart: Option<Series>,
    /// Where the chart's figures come from.
    pub chart_note: &'a str,
}

/// One consumer's line on the overview.
pub struct ConsumerLine {
    /// Name.
    pub name: String,
    /// Rows in the dedup ledger.
    pub delivered: u64,
    /// Retrying and dead events it has not delivered (None: unknown).
    pub backlog: Option<(u64, u64)>,
    /// The relay's results since start: (delivered, retry, poison).
    pub since_start: Option<(u64, u64, u64)>,
}

fn tile(id: &str, label: &str, value: impl maud::Render) -> Markup {
    html! { div.tile { div.n id=(id) { (value) } div.k { (label) } } }
}

/// `/`.
pub fn overview(ctx: &Ctx<'_>, v: &OverviewView<'_>) -> Markup {
    html! {
        h1 { "Overview" }
        @match v.status {
            None => {
                div.notice { "The status is being measured (a large database takes a moment); reload in a few seconds." }
            }
            Some(Err(e)) => {
                div.notice.bad id="health" data-healthy="false" {
                    strong { "Status unreadable: " } (e)
                }
            }
            Some(Ok((s, problems))) => {
                (health(problems))
                div.tiles {
                    (tile("count-pending-due", "pending due", s.counts.pending_due))
                    (tile("count-pending-delayed", "pending delayed", s.counts.pending_delayed))
                    (tile("count-leased", "leased", s.counts.leased))
                    (tile("count-delivered", "delivered", s.counts.delivered))
                    (tile("count-dead", "dead", s.counts.dead))
                    (tile("oldest-due", "oldest due", s.oldest_due_age.map_or("none".to_string(), |d| format!("{} ago", human(d)))))
                    (tile("leases-held", "leases held", s.leases_held))
                    (tile("leases-expired", "leases expired", s.expired_leases))
                }
            }
        }
        @if let Some((at, took)) = v.measured {
            p.muted {
                "Measured at " span id="measured-at" data-ms=(at.as_millis()) { (at.to_string()) }
                " in " (human(took)) "."
            }
        }
        div.card {
            h2 { "Last hour, per minute" }
            @match &v.chart {
                Some(series) => {
                    (chart::svg(series))
                    @let t = series.total();
                    p.muted {
                        "In the hour: " span id="hour-enqueued" { (t.enqueued) } " enqueued, "
                        span id="hour-delivered" { (t.delivered) } " delivered, "
                        @if series.has_retries { span id="hour-retried" { (t.retried) } " retried, " }
                        span id="hour-dead" { (t.dead) } " dead-lettered. " (v.chart_note)
                    }
                }
                None => p.muted { "No figures yet. " (v.chart_note) }
            }
        }
        h2 { "Consumers" }
        @if v.consumers.is_empty() {
            p.muted { "No consumer has delivered anything yet." }
        } @else {
            table id="consumers" {
                thead { tr {
                    th { "consumer" } th.num { "delivered (ledger)" } th.num { "retrying" } th.num { "dead" }
                    th.num { "since start: delivered" } th.num { "retries" } th.num { "poisoned" }
                } }
                tbody {
                    @for c in &v.consumers {
                        tr data-consumer=(c.name) {
                            td { a href={"/events?" (query([("consumer", c.name.as_str())]))} { (c.name) } }
                            td.num.delivered { (c.delivered) }
                            @match c.backlog {
                                Some((retrying, dead)) => {
                                    td.num { a href={"/events?" (query([("state", "retrying"), ("missing", "1"), ("consumer", &c.name)]))} { (retrying) } }
                                    td.num { a href={"/events?" (query([("state", "dead"), ("missing", "1"), ("consumer", &c.name)]))} { (dead) } }
                                }
                                None => { td.num.muted { "—" } td.num.muted { "—" } }
                            }
                            @match c.since_start {
                                Some((d, r, p)) => { td.num { (d) } td.num { (r) } td.num { (p) } }
                                None => { td.num.muted { "—" } td.num.muted { "—" } td.num.muted { "—" } }
                            }
                        }
                    }
                }
            }
            @if v.backlog_truncated { p.muted { "Retrying and dead per consumer are counted over the first rows only (a bound keeps the measure short)." } }
            @if let Some(note) = &v.backlog_note { p.muted { (note) } }
        }
        @if !ctx.read_only && v.status.is_some_and(|s| s.as_ref().is_ok_and(|(s, _)| s.counts.dead > 0)) {
            p { a href="/dead" { "Inspect and requeue the dead letters →" } }
        }
    }
}

fn health(problems: &[Problem]) -> Markup {
    html! {
        @if problems.is_empty() {
            div.notice id="health" data-healthy="true" { span.badge.ok { "healthy" } " No threshold is crossed." }
        } @else {
            div.notice.bad id="health" data-healthy="false" {
                span.badge.bad { "problems" }
                ul {
                    @for p in problems {
                        li data-threshold=(p.threshold) { strong { (p.threshold) } ": " (p.message) }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Events.

/// The events filter form's values, as given.
#[derive(Debug, Clone, Default)]
pub struct EventsForm {
    /// state
    pub state: String,
    /// type
    pub event_type: String,
    /// tenant
    pub tenant: String,
    /// consumer
    pub consumer: String,
    /// missing
    pub missing: bool,
    /// since
    pub since: String,
    /// until
    pub until: String,
}

impl EventsForm {
    /// The query string of these filters plus `extra`.
    pub fn query(&self, extra: (&str, &str)) -> String {
        let filters = [
            ("state", self.state.as_str()),
            ("type", &self.event_type),
            ("tenant", &self.tenant),
            ("consumer", &self.consumer),
            ("since", &self.since),
            ("until", &self.until),
            ("missing", if self.missing { "1" } else { "" }),
        ];
        let given = filters.into_iter().filter(|(_, v)| !v.is_empty());
        format!("?{}", query(given.chain([extra])))
    }
}

/// `/events`.
pub fn events(
    ctx: &Ctx<'_>,
    f: &EventsForm,
    error: Option<&str>,
    page: &EventsPage,
    consumers: &[String],
) -> Markup {
    html! {
        h1 { "Events" }
        form.filters.card method="get" action="/events" {
            label { "state"
                select name="state" {
                    option value="" { "any" }
                    @for (_, name) in StateFilter::ALL {
                        option value=(name) selected[f.state == name] { (name) }
                    }
                }
            }
            label { "type pattern" input name="type" value=(f.event_type) placeholder="article.*.v1"; }
            label { "tenant" input name="tenant" value=(f.tenant); }
            label { "consumer"
                input name="consumer" value=(f.consumer) list="consumer-names";
                datalist id="consumer-names" { @for c in consumers { option value=(c) {} } }
            }
            label { "progress"
                select name="missing" {
                    option value="" selected[!f.missing] { "delivered by it" }
                    option value="1" selected[f.missing] { "not delivered by it" }
                }
            }
            label { "occurred since" input name="since" value=(f.since) placeholder="2026-11-30T07:00Z or 1h"; }
            label { "until" input name="until" value=(f.until) placeholder="RFC 3339 or 10m"; }
            button type="submit" { "Filter" }
            a href="/events" { "clear" }
        }
        @if let Some(e) = error { div.notice.bad { (e) } }
        (events_table(ctx, &page.rows, false))
        div.pager {
            span.muted { (page.rows.len()) " shown, " (page.scanned) " rows examined." }
            @if let Some(before) = page.next_before {
                a id="older" href={"/events" (f.query(("before", &before.to_string())))} { "Older →" }
            }
        }
    }
}

fn events_table(ctx: &Ctx<'_>, rows: &[EventRow], selectable: bool) -> Markup {
    html! {
        @if rows.is_empty() {
            p.muted { "No events match." }
        } @else {
            table.events {
                thead { tr {
                    @if selectable { th { "" } }
                    th { "row" } th { "type" } th { "tenant" } th { "state" } th.num { "attempts" }
                    th { @if selectable { "dead since" } @else { "occurred" } } th { "last error" }
                } }
                tbody {
                    @for r in rows {
                        tr data-row=(r.id) {
                            @if selectable {
                                td { input type="checkbox" name="id" value=(r.id) aria-label={"select row " (r.id)}; }
                            }
                            td { a href=(event_link(r.id)) { (r.id) } }
                            td.mono { (r.event_type) }
                            td.tenant { (r.tenant.as_deref().unwrap_or("")) }
                            td { (state_badge(r.state(ctx.now))) }
                            td.num { (r.attempts) }
                            td { @if selectable { (opt_time(r.finished_at, ctx.now)) } @else { (time(r.occurred_at, ctx.now)) } }
                            td.err { (r.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// `/events/{id}`. `expected` are the configured consumers that take the
/// event's type.
pub fn event(ctx: &Ctx<'_>, d: &EventDetail, expected: &[String]) -> Markup {
    let r = &d.row;
    let state = r.state(ctx.now);
    let truncated = d.payload_bytes as usize > PAYLOAD_CAP;
    let pretty = if truncated {
        None
    } else {
        serde_json::from_str::<serde_json::Value>(&d.payload)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
    };
    html! {
        h1 { "Event " span.mono { (r.event_id.as_deref().unwrap_or("(legacy row)")) } " " (state_badge(state)) }
        @if state == "dead" && !ctx.read_only {
            div.actions {
                form method="post" action="/dead/confirm" {
                    (csrf(ctx)) input type="hidden" name="id" value=(r.id);
                    button type="submit" name="op" value="requeue:selected" { "Requeue" }
                    " "
                    button.danger type="submit" name="op" value="discard:selected" { "Discard" }
                }
            }
        }
        @if let Some(e) = &d.envelope_error {
            div.notice.bad { strong { "The relay cannot build this event's envelope: " } (e) }
        }
        div.card {
            h2 { "Envelope" }
            dl.fields {
                dt { "row id" } dd { (r.id) }
                dt { "event id" } dd.mono { (r.event_id.as_deref().unwrap_or("—")) }
                dt { "event type" } dd.mono { (r.event_type) }
                dt { "event version" } dd { (d.event_version.as_deref().unwrap_or("(from the type)")) }
                dt { "tenant" } dd.tenant { (r.tenant.as_deref().unwrap_or("—")) }
                dt { "idempotency key" } dd.key { (d.idempotency_key.as_deref().unwrap_or("—")) }
                dt { "ordering key" } dd { (d.ordering_key.as_deref().unwrap_or("—")) }
                dt { "causation id" } dd { (d.causation_id.as_deref().unwrap_or("—")) }
                dt { "correlation id" } dd { (d.correlation_id.as_deref().unwrap_or("—")) }
                dt { "occurred" } dd { (time(r.occurred_at, ctx.now)) }
                dt { "enqueued" } dd { (time(d.created_at, ctx.now)) }
            }
            @if !d.same_id.is_empty() {
                p.muted { "Other rows carry this event id: "
                    @for id in &d.same_id { a href=(event_link(*id)) { (id) } " " } }
            }
        }
        div.card {
            h2 { "Delivery" }
            dl.fields {
                dt { "status" } dd { (r.status) }
                dt { "attempts" } dd { (r.attempts) }
                dt { "due" } dd { (time(r.available_at, ctx.now)) }
                dt { "lease" } dd { @match r.lease_until { Some(l) => { "held until " (time(l, ctx.now)) }, None => "none" } }
                dt { "finished" } dd { (opt_time(r.finished_at, ctx.now)) }
                dt { "last error" } dd { pre.err id="last-error" { (d.last_error.as_deref().unwrap_or("—")) } }
            }
        }
        div.card {
            h2 { "Consumers" }
            table id="progress" {
                thead { tr { th { "consumer" } th { "progress" } } }
                tbody {
                    @for (consumer, at) in &d.progress {
                        tr { td { (consumer) } td { span.badge.ok { "delivered" } " " (time(*at, ctx.now)) } }
                    }
                    @for c in expected.iter().filter(|c| !d.progress.iter().any(|(p, _)| p == *c)) {
                        tr { td { (c) } td { span.badge.warn { "not yet" } } }
                    }
                    @if d.progress.is_empty() && expected.is_empty() {
                        tr { td.muted colspan="2" { "No consumer has delivered it (start the console with --config to see which consumers take it)." } }
                    }
                }
            }
        }
        div.card {
            h2 { "Payload" }
            @if truncated {
                p.muted { "Showing the first " (PAYLOAD_CAP / 1024) " KiB of " (d.payload_bytes) " bytes." }
            }
            pre id="payload" { (pretty.as_deref().unwrap_or(&d.payload)) }
        }
    }
}

// ---------------------------------------------------------------------------
// Dead letters.

/// `/dead`.
pub fn dead(
    ctx: &Ctx<'_>,
    pattern: &str,
    error: Option<&str>,
    done: Option<String>,
    total: u64,
    page: &DeadPage,
) -> Markup {
    html! {
        h1 { "Dead letters " span.badge.bad id="dead-total" { (total) } }
        @if let Some(done) = done { div.notice id="done" { (done) } }
        @if let Some(e) = error { div.notice.bad { (e) } }
        form.filters.card method="get" action="/dead" {
            label { "type pattern" input name="type" value=(pattern) placeholder="article.*.v1"; }
            button type="submit" { "Filter" }
            a href="/dead" { "clear" }
        }
        @if ctx.read_only {
            (events_table(ctx, &page.rows, false))
        } @else {
            form method="post" action="/dead/confirm" {
                (csrf(ctx))
                input type="hidden" name="type" value=(pattern);
                div.actions {
                    button type="submit" name="op" value="requeue:selected" { "Requeue selected" }
                    button.danger type="submit" name="op" value="discard:selected" { "Discard selected" }
                    @if !pattern.is_empty() {
                        button.secondary type="submit" name="op" value="requeue:type" { "Requeue every " (pattern) }
                        button.danger type="submit" name="op" value="discard:type" { "Discard every " (pattern) }
                    }
                    button.secondary type="submit" name="op" value="requeue:all" { "Requeue all" }
                    button.danger type="submit" name="op" value="discard:all" { "Discard all" }
                }
                (events_table(ctx, &page.rows, true))
            }
        }
        div.pager {
            @if let Some((at, id)) = page.next {
                a id="older" href={"/dead?" (query([("type", pattern), ("at", &at.to_string()), ("before", &id.to_string())]))} { "Older →" }
            }
        }
    }
}

/// The confirmation of a dead-letter action: names the rows it changes.
pub fn confirm_dead(
    ctx: &Ctx<'_>,
    verb: &str,
    op: &str,
    what: &str,
    count: u64,
    ids: &[String],
    pattern: &str,
) -> Markup {
    html! {
        h1 { (verb) " dead letters" }
        div.card {
            p id="confirm-count" data-count=(count) {
                (verb) " " strong { (count) } " dead " (noun(count, "letter", "letters")) " (" (what) ")?"
                @if verb == "Discard" { " They are deleted for good." }
            }
            @if count > 0 {
                form method="post" action="/dead/apply" {
                    (csrf(ctx))
                    input type="hidden" name="op" value=(op);
                    input type="hidden" name="type" value=(pattern);
                    @for id in ids { input type="hidden" name="id" value=(id); }
                    div.actions {
                        button class=[(verb == "Discard").then_some("danger")] type="submit" id="confirm" { (verb) " " (count) }
                        a href="/dead" { "Cancel" }
                    }
                }
            } @else {
                p { a href="/dead" { "Back to the dead letters" } }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Replay.

/// The replay form's values.
#[derive(Debug, Clone, Default)]
pub struct ReplayForm {
    /// consumer
    pub consumer: String,
    /// type
    pub event_type: String,
    /// since
    pub since: String,
    /// until
    pub until: String,
}

/// `/replay`: the form, then (with a consumer) the count and the button.
pub fn replay(
    ctx: &Ctx<'_>,
    f: &ReplayForm,
    consumers: &[String],
    error: Option<&str>,
    count: Option<u64>,
    done: Option<String>,
) -> Markup {
    html! {
        h1 { "Replay" }
        p.muted { "Deliver events again to one consumer that already had them. The other consumers are not run again." }
        @if let Some(done) = done { div.notice id="done" { (done) } }
        @if let Some(e) = error { div.notice.bad { (e) } }
        form.stack.card method="get" action="/replay" {
            label { "consumer"
                select name="consumer" {
                    option value="" { "choose…" }
                    @for c in consumers { option value=(c) selected[f.consumer == *c] { (c) } }
                }
            }
            label { "type pattern (optional)" input name="type" value=(f.event_type) placeholder="article.*.v1"; }
            label { "occurred since (optional)" input name="since" value=(f.since) placeholder="2026-11-30T00:00Z or 2h"; }
            label { "until (optional)" input name="until" value=(f.until) placeholder="2026-11-30T12:00Z"; }
            button type="submit" { "Count" }
        }
        @if let Some(n) = count {
            div.card {
                p id="replay-count" data-count=(n) {
                    strong { (n) } " " (noun(n, "event", "events")) " delivered to " strong { (f.consumer) } " match."
                }
                @if n > 0 && !ctx.read_only {
                    form method="post" action="/replay" {
                        (csrf(ctx))
                        input type="hidden" name="consumer" value=(f.consumer);
                        input type="hidden" name="type" value=(f.event_type);
                        input type="hidden" name="since" value=(f.since);
                        input type="hidden" name="until" value=(f.until);
                        button type="submit" id="confirm" { "Replay " (n) " to " (f.consumer) }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Intents, capture, login, errors.

/// The most open intents listed.
pub const INTENTS_SHOWN: usize = 500;

/// `/intents`.
pub fn intents(ctx: &Ctx<'_>, open: &[Intent]) -> Markup {
    html! {
        h1 { "Publish intents" }
        p.muted { (open.len()) " open (pending or failed), least recently changed first." }
        @if open.is_empty() {
            p.muted { "No open intent." }
        } @else {
            table id="intents" {
                thead { tr { th { "id" } th { "tenant" } th { "key" } th { "status" } th.num { "attempts" } th { "changed" } th { "last error" } } }
                tbody {
                    @for i in open.iter().take(INTENTS_SHOWN) {
                        tr {
                            td { (i.id) }
                            td { (i.key.tenant_id().unwrap_or("—")) }
                            td.mono { (i.key.key()) }
                            td { (i.status.as_str()) }
                            td.num { (i.attempts) }
                            td { (time(i.updated_at.as_millis(), ctx.now)) }
                            td.err { (i.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// `/capture`: every installed capture and whether its triggers are intact
/// (`outboxd::capture::inspect`).
pub fn capture(ctx: &Ctx<'_>, captures: &[outboxd::capture::CaptureStatus]) -> Markup {
    let now = ctx.now;
    html! {
        h1 { "Capture" }
        p.muted { "Tables whose own writes become events through triggers (docs/capture.md). A missing trigger captures nothing: writes made meanwhile are lost." }
        @if captures.is_empty() {
            p.muted { "No capture installed." }
        } @else {
            table id="captures" {
                thead { tr { th { "table" } th { "operations" } th { "event type" } th { "state" } th { "last seen intact" } } }
                tbody {
                    @for c in captures {
                        tr {
                            td.mono { (c.table) }
                            td { (c.spec.operations().iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")) }
                            td.mono { (c.spec.event_type) }
                            @match c.problem(now) {
                                None => td { "intact" },
                                Some(p) => td.err { (p) },
                            }
                            td { (time(c.verified_at.as_millis(), ctx.now)) }
                        }
                    }
                }
            }
        }
    }
}

/// `/login`.
pub fn login(ctx: &Ctx<'_>, error: Option<&str>) -> Markup {
    html! {
        h1 { "Log in" }
        @if let Some(e) = error { div.notice.bad id="login-error" { (e) } }
        form.stack.card method="post" action="/login" {
            (csrf(ctx))
            label { "token (the value of [http] token_env)" input type="password" name="token" autocomplete="current-password" autofocus; }
            button type="submit" { "Log in" }
        }
    }
}

/// A page saying what went wrong.
pub fn message(title: &str, text: &str) -> Markup {
    html! { h1 { (title) } div.notice.bad id="message" { (text) } p { a href="/" { "Back to the overview" } } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_from_the_database_are_escaped() {
        let ctx = Ctx {
            csrf: "c",
            read_only: false,
            logout: false,
            now: Timestamp::from_millis(1_000_000),
        };
        let evil = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>";
        let row = EventRow {
            id: 1,
            event_id: Some(evil.into()),
            event_type: evil.into(),
            tenant: Some(evil.into()),
            status: "dead".into(),
            attempts: 1,
            available_at: 0,
            lease_until: None,
            occurred_at: 0,
            finished_at: Some(0),
            last_error: Some(evil.into()),
        };
        let html = layout(&ctx, evil, Nav::Dead, events_table(&ctx, &[row], true));
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<img src=x"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img"),
            "{html}"
        );
    }
}
