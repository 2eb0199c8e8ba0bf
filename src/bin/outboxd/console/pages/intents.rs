//! The open publish intents.

use maud::{html, Markup};
use outboxd::intents::Intent;

use super::{time, Ctx};

/// The most open intents listed.
pub(crate) const INTENTS_SHOWN: usize = 500;

/// What `/intents` shows.
pub(crate) struct IntentsView {
    /// The open intents, least recently changed first.
    pub(crate) open: Vec<Intent>,
}

/// `/intents`.
pub(crate) fn intents(ctx: &Ctx<'_>, v: &IntentsView) -> Markup {
    let open = &v.open;
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
