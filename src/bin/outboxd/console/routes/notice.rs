//! The banner an action's redirect carries.

use outboxd::Timestamp;

use crate::cmd::support::count;
use crate::console::app::App;
use crate::console::form::{query, Params};
use crate::console::server::Response;

// Banners.

/// What an action did, shown as a banner on the page its POST redirects to.
/// The redirect carries it in `done`, sealed by
/// [`Auth::seal_notice`](super::auth::Auth::seal_notice); a `done` the
/// console did not seal (a link made elsewhere, `?done=requeued+5`) shows
/// nothing, so every banner is one the server issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Notice {
    /// Dead letters requeued.
    Requeued(u64),
    /// Dead letters discarded.
    Discarded(u64),
    /// Events replayed to a consumer.
    Replayed { events: u64, to: String },
    /// A snapshot of a capture started.
    SnapshotStarted(String),
}

impl Notice {
    /// The query parameter that carries a sealed notice.
    const PARAM: &'static str = "done";

    pub(super) fn verb(&self) -> &'static str {
        match self {
            Notice::Requeued(_) => "requeued",
            Notice::Discarded(_) => "discarded",
            Notice::Replayed { .. } => "replayed",
            Notice::SnapshotStarted(_) => "snapshot",
        }
    }

    /// `requeued:5`, `discarded:5`, `replayed:5:search`.
    fn encode(&self) -> String {
        match self {
            Notice::Requeued(n) | Notice::Discarded(n) => format!("{}:{n}", self.verb()),
            Notice::Replayed { events, to } => format!("{}:{events}:{to}", self.verb()),
            Notice::SnapshotStarted(c) => format!("{}:{c}", self.verb()),
        }
    }

    fn decode(s: &str) -> Option<Notice> {
        let (verb, rest) = s.split_once(':')?;
        match verb {
            "requeued" => rest.parse().ok().map(Notice::Requeued),
            "discarded" => rest.parse().ok().map(Notice::Discarded),
            "snapshot" => Some(Notice::SnapshotStarted(rest.to_string())),
            "replayed" => {
                let (n, to) = rest.split_once(':')?;
                Some(Notice::Replayed {
                    events: n.parse().ok()?,
                    to: to.to_string(),
                })
            }
            _ => None,
        }
    }

    /// The banner's text.
    pub(super) fn text(&self) -> String {
        match self {
            Notice::Requeued(n) => format!(
                "Requeued {}; the relay delivers them now.",
                count(*n, "dead letter", "dead letters")
            ),
            Notice::Discarded(n) => {
                format!("Discarded {}.", count(*n, "dead letter", "dead letters"))
            }
            Notice::Replayed { events, to } => format!(
                "Replayed {} to {to}; the relay delivers them now.",
                count(*events, "event", "events")
            ),
            Notice::SnapshotStarted(c) => format!(
                "Started a snapshot of capture {c}; its progress is below (reload to follow it)."
            ),
        }
    }

    /// The 303 to `path` showing this notice.
    pub(super) fn redirect(&self, app: &App, path: &str) -> Response {
        let sealed = app.auth.seal_notice(&self.encode(), Timestamp::now());
        Response::see_other(&format!(
            "{path}?{}",
            query([(Self::PARAM, sealed.as_str())])
        ))
    }

    /// The notice a page's query carries, if the console sealed it.
    pub(super) fn from_query(app: &App, q: &Params) -> Option<Notice> {
        let sealed = q.get(Self::PARAM)?;
        Notice::decode(app.auth.open_notice(sealed, Timestamp::now())?)
    }
}
