//! Every installed capture and whether its triggers are intact.

use maud::{html, Markup};
use outboxd::capture::CaptureStatus;

use super::{time, Ctx};

/// What `/capture` shows.
pub(crate) struct CaptureView {
    /// Every installed capture.
    pub(crate) captures: Vec<CaptureStatus>,
}

/// `/capture`: every installed capture and whether its triggers are intact
/// (`outboxd::capture::inspect`).
pub(crate) fn capture(ctx: &Ctx<'_>, v: &CaptureView) -> Markup {
    let (now, captures) = (ctx.now, &v.captures);
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
