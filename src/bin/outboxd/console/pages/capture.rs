//! Every installed capture: its columns, whether its triggers are intact,
//! its open gaps; the recent snapshots, and a button to start one.

use maud::{html, Markup};
use outboxd::capture::snapshot::{Snapshot, SnapshotState};
use outboxd::capture::{CaptureStatus, Columns};

use super::{csrf, time, Ctx};

/// What `/capture` shows.
pub(crate) struct CaptureView {
    /// Every installed capture.
    pub(crate) captures: Vec<CaptureStatus>,
    /// The recent snapshots, newest first.
    pub(crate) snapshots: Vec<Snapshot>,
    /// The banner of the action that led here.
    pub(crate) notice: Option<String>,
}

/// `/capture`: every installed capture (`outboxd::capture::inspect`), its
/// gaps, the snapshots.
pub(crate) fn capture(ctx: &Ctx<'_>, v: &CaptureView) -> Markup {
    let (now, captures) = (ctx.now, &v.captures);
    html! {
        h1 { "Capture" }
        @if let Some(n) = &v.notice { div.notice id="done" { (n) } }
        p.muted { "Tables whose own writes become events through triggers (docs/capture.md). A missing trigger captures nothing: the window is recorded as a gap until a snapshot covers it or `outboxd capture ack` acknowledges it." }
        @if captures.is_empty() {
            p.muted { "No capture installed." }
        } @else {
            table id="captures" {
                thead { tr { th { "capture" } th { "table" } th { "operations" } th { "event type" } th { "columns" } th { "state" } th { "last seen intact" } th { "" } } }
                tbody {
                    @for c in captures {
                        tr {
                            td.mono { (c.name) }
                            td.mono { (c.table) }
                            td { (c.spec.operations().iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")) }
                            td.mono { (c.spec.event_type) }
                            td.mono { (match &c.spec.columns { Columns::All => "*".to_string(), Columns::List(l) => l.join(", ") }) }
                            @match c.problem(now) {
                                None if c.gaps.is_empty() => td { "intact" },
                                None => td.err { "intact; " (c.gaps.len()) " open gap" @if c.gaps.len() > 1 { "s" } },
                                Some(p) => td.err { (p) },
                            }
                            td { (time(c.verified_at.as_millis(), ctx.now)) }
                            td {
                                @if !ctx.read_only && c.is_intact() {
                                    form method="post" action="/capture/snapshot" {
                                        (csrf(ctx))
                                        input type="hidden" name="capture" value=(c.name);
                                        button type="submit" { "Start snapshot" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @let gaps: Vec<_> = captures.iter().flat_map(|c| &c.gaps).collect();
            @if !gaps.is_empty() {
                h2 { "Open gaps" }
                table id="gaps" {
                    thead { tr { th { "gap" } th { "capture" } th { "writes lost after (at most)" } th { "until" } th { "ended by" } } }
                    tbody {
                        @for g in gaps {
                            tr {
                                td.num { (g.id) }
                                td.mono { (g.capture) }
                                td { (time(g.lost_after.as_millis(), now)) }
                                td { (time(g.lost_until.as_millis(), now)) }
                                td { (g.ended_by) }
                            }
                        }
                    }
                }
            }
        }
        @if !v.snapshots.is_empty() {
            h2 { "Snapshots" }
            table id="snapshots" {
                thead { tr { th { "snapshot" } th { "capture" } th { "state" } th.num { "rows read" } th.num { "events" } th { "started" } th { "last chunk" } } }
                tbody {
                    @for s in &v.snapshots {
                        tr {
                            td.mono { (s.id) }
                            td.mono { (s.capture) }
                            @if s.state == SnapshotState::Failed || s.state == SnapshotState::Cancelled {
                                td.err { (s.state.as_str()) ": " (s.message.as_deref().unwrap_or("")) }
                            } @else {
                                td { (s.state.as_str()) }
                            }
                            td.num { (s.scanned) @if let Some(t) = s.total { " / " (t) } }
                            td.num { (s.rows) }
                            td { (time(s.started_at.as_millis(), now)) " by " (s.origin) }
                            td { (time(s.updated_at.as_millis(), now)) }
                        }
                    }
                }
            }
        }
    }
}
