//! The events list and one event's page.

use maud::{html, Markup};
use outboxd::inspect::{EventDetail, EventRow, EventsPage, StateFilter, PAYLOAD_CAP};

use super::{csrf, event_link, opt_time, state_badge, time, Ctx};
use crate::console::form::query;

/// The events filter form's values, as given.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventsForm {
    /// state
    pub(crate) state: String,
    /// type
    pub(crate) event_type: String,
    /// tenant
    pub(crate) tenant: String,
    /// consumer
    pub(crate) consumer: String,
    /// missing
    pub(crate) missing: bool,
    /// since
    pub(crate) since: String,
    /// until
    pub(crate) until: String,
    /// ordering key
    pub(crate) ordering_key: String,
    /// a captured row's key
    pub(crate) key: String,
}

impl EventsForm {
    /// The query string of these filters plus `extra`.
    pub(crate) fn query(&self, extra: (&str, &str)) -> String {
        let filters = [
            ("state", self.state.as_str()),
            ("type", &self.event_type),
            ("tenant", &self.tenant),
            ("consumer", &self.consumer),
            ("since", &self.since),
            ("until", &self.until),
            ("ordering_key", &self.ordering_key),
            ("key", &self.key),
            ("missing", if self.missing { "1" } else { "" }),
        ];
        let given = filters.into_iter().filter(|(_, v)| !v.is_empty());
        format!("?{}", query(given.chain([extra])))
    }
}

/// What `/events` shows.
pub(crate) struct EventsView {
    /// The filters as given.
    pub(crate) form: EventsForm,
    /// Why the filters cannot be used, if they cannot.
    pub(crate) error: Option<String>,
    /// The matching rows.
    pub(crate) page: EventsPage,
    /// The consumer names to offer.
    pub(crate) consumers: Vec<String>,
}

/// `/events`.
pub(crate) fn events(ctx: &Ctx<'_>, v: &EventsView) -> Markup {
    let (f, page) = (&v.form, &v.page);
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
            label { "ordering key" input name="ordering_key" value=(f.ordering_key) placeholder="cms_page:42"; }
            label { "row key" input name="key" value=(f.key) placeholder="42"; }
            label { "consumer"
                input name="consumer" value=(f.consumer) list="consumer-names";
                datalist id="consumer-names" { @for c in &v.consumers { option value=(c) {} } }
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
        @if let Some(e) = &v.error { div.notice.bad { (e) } }
        (events_table(ctx, &page.rows, false))
        div.pager {
            span.muted { (page.rows.len()) " shown, " (page.scanned) " rows examined." }
            @if let Some(before) = page.next_before {
                a id="older" href={"/events" (f.query(("before", &before.to_string())))} { "Older →" }
            }
        }
    }
}

pub(super) fn events_table(ctx: &Ctx<'_>, rows: &[EventRow], selectable: bool) -> Markup {
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

/// What `/events/{id}` shows.
pub(crate) struct EventView {
    /// The event.
    pub(crate) detail: EventDetail,
    /// The configured consumers that take its type.
    pub(crate) expected: Vec<String>,
}

/// `/events/{id}`.
pub(crate) fn event(ctx: &Ctx<'_>, v: &EventView) -> Markup {
    let (d, expected) = (&v.detail, &v.expected);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::pages::{layout, Nav};
    use outboxd::Timestamp;

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
