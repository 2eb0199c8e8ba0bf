//! Replay: the form, then the count and the button.

use maud::{html, Markup};

use super::{csrf, Ctx};
use crate::cmd::support::noun;

/// The replay form's values.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplayForm {
    /// consumer
    pub(crate) consumer: String,
    /// type
    pub(crate) event_type: String,
    /// since
    pub(crate) since: String,
    /// until
    pub(crate) until: String,
}

/// What `/replay` shows.
pub(crate) struct ReplayView {
    /// The form's values.
    pub(crate) form: ReplayForm,
    /// The consumer names to offer.
    pub(crate) consumers: Vec<String>,
    /// Why the form cannot be used, if it cannot.
    pub(crate) error: Option<String>,
    /// How many events match, once counted.
    pub(crate) count: Option<u64>,
    /// What the last replay did.
    pub(crate) done: Option<String>,
}

/// `/replay`: the form, then (with a consumer) the count and the button.
pub(crate) fn replay(ctx: &Ctx<'_>, v: &ReplayView) -> Markup {
    let f = &v.form;
    html! {
        h1 { "Replay" }
        p.muted { "Deliver events again to one consumer that already had them. The other consumers are not run again." }
        @if let Some(done) = &v.done { div.notice id="done" { (done) } }
        @if let Some(e) = &v.error { div.notice.bad { (e) } }
        form.stack.card method="get" action="/replay" {
            label { "consumer"
                select name="consumer" {
                    option value="" { "choose…" }
                    @for c in &v.consumers { option value=(c) selected[f.consumer == *c] { (c) } }
                }
            }
            label { "type pattern (optional)" input name="type" value=(f.event_type) placeholder="article.*.v1"; }
            label { "occurred since (optional)" input name="since" value=(f.since) placeholder="2026-11-30T00:00Z or 2h"; }
            label { "until (optional)" input name="until" value=(f.until) placeholder="2026-11-30T12:00Z"; }
            button type="submit" { "Count" }
        }
        @if let Some(n) = v.count {
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
