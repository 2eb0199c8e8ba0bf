//! The overview: the health verdict, the status's figures, the last hour
//! per minute, and each consumer's progress.

use std::time::Duration;

use maud::{html, Markup};
use outboxd::Timestamp;

use super::Ctx;
use crate::cmd::support::human;
use crate::config::alerts::Problem;
use crate::console::app::StatusView;
use crate::console::chart::{self, Series};
use crate::console::form::query;

/// The overview's figures.
pub(crate) struct OverviewView<'a> {
    /// The status and verdict (None while the first measure runs).
    pub(crate) status: Option<&'a StatusView>,
    /// When the status was measured, and how long it took.
    pub(crate) measured: Option<(Timestamp, Duration)>,
    /// (consumer, delivered in the ledger, retrying, dead, since start
    /// (delivered, retry, poison)).
    pub(crate) consumers: Vec<ConsumerLine>,
    /// True when retrying/dead per consumer were cut short by a bound.
    pub(crate) backlog_truncated: bool,
    /// Why the per-consumer backlog is not shown, if it is not.
    pub(crate) backlog_note: Option<String>,
    /// The chart.
    pub(crate) chart: Option<Series>,
    /// Where the chart's figures come from.
    pub(crate) chart_note: &'a str,
}

/// One consumer's line on the overview.
pub(crate) struct ConsumerLine {
    /// Name.
    pub(crate) name: String,
    /// Rows in the dedup ledger.
    pub(crate) delivered: u64,
    /// Retrying and dead events it has not delivered (None: unknown).
    pub(crate) backlog: Option<(u64, u64)>,
    /// The relay's results since start: (delivered, retry, poison).
    pub(crate) since_start: Option<(u64, u64, u64)>,
}

fn tile(id: &str, label: &str, value: impl maud::Render) -> Markup {
    html! { div.tile { div.n id=(id) { (value) } div.k { (label) } } }
}

/// `/`.
pub(crate) fn overview(ctx: &Ctx<'_>, v: &OverviewView<'_>) -> Markup {
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
