//! The dead letters and the confirmation of an action on them.

use maud::{html, Markup};
use outboxd::inspect::DeadPage;

use super::events::events_table;
use super::{csrf, Ctx};
use crate::cmd::support::noun;
use crate::console::form::query;

/// What `/dead` shows.
pub(crate) struct DeadView {
    /// The type pattern as given.
    pub(crate) pattern: String,
    /// Why the pattern cannot be used, if it cannot.
    pub(crate) error: Option<String>,
    /// What the last action did.
    pub(crate) done: Option<String>,
    /// Dead letters in all.
    pub(crate) total: u64,
    /// The rows shown.
    pub(crate) page: DeadPage,
}

/// `/dead`.
pub(crate) fn dead(ctx: &Ctx<'_>, v: &DeadView) -> Markup {
    let (pattern, page) = (v.pattern.as_str(), &v.page);
    html! {
        h1 { "Dead letters " span.badge.bad id="dead-total" { (v.total) } }
        @if let Some(done) = &v.done { div.notice id="done" { (done) } }
        @if let Some(e) = &v.error { div.notice.bad { (e) } }
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

/// What the confirmation of a dead-letter action shows.
pub(crate) struct ConfirmDeadView {
    /// "Requeue" or "Discard".
    pub(crate) verb: &'static str,
    /// The form's `op`, passed on.
    pub(crate) op: String,
    /// Which rows, in words.
    pub(crate) what: String,
    /// How many rows it changes.
    pub(crate) count: u64,
    /// The selected row ids, passed on.
    pub(crate) ids: Vec<String>,
    /// The type pattern, passed on.
    pub(crate) pattern: String,
}

/// The confirmation of a dead-letter action: names the rows it changes.
pub(crate) fn confirm_dead(ctx: &Ctx<'_>, v: &ConfirmDeadView) -> Markup {
    let (verb, op, what, count, ids, pattern) =
        (v.verb, &v.op, &v.what, v.count, &v.ids, &v.pattern);
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
