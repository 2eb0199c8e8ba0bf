//! The slots of the requests being answered: [`HttpBounds::max_answering`]
//! for pages and actions, [`HttpBounds::probe_slots`] of their own for
//! `/healthz`, `/metrics` and `/livez`. A request holds its slot from its
//! head to the last byte of its answer written ([`Answering`], the body
//! hyper writes, gives it back when hyper drops it), and its connection
//! then waits for its next head in the [`Lobby`] again.
//!
//! [`HttpBounds::max_answering`]: super::HttpBounds::max_answering
//! [`HttpBounds::probe_slots`]: super::HttpBounds::probe_slots

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bounds::HttpBounds;
use super::lobby::{Lobby, Seat};

/// The paths a health check or a scrape asks for.
const PROBES: [&str; 3] = ["/healthz", "/metrics", "/livez"];

/// The two pools of slots.
pub(super) struct Slots {
    pages: Arc<Semaphore>,
    probes: Arc<Semaphore>,
}

impl Slots {
    pub(super) fn new(limits: &HttpBounds) -> Slots {
        Slots {
            pages: Arc::new(Semaphore::new(limits.max_answering.max(1))),
            probes: Arc::new(Semaphore::new(limits.probe_slots.max(1))),
        }
    }

    /// A slot for `req`, once one is free: a probe's from its own pool.
    pub(super) async fn take(&self, req: &hyper::Request<Incoming>) -> OwnedSemaphorePermit {
        let pool = if is_probe(req) {
            &self.probes
        } else {
            &self.pages
        };
        pool.clone()
            .acquire_owned()
            .await
            .expect("the slots' semaphores are never closed")
    }
}

/// A GET (or HEAD) of a probe's path without a body: nothing to wait for
/// but its answer.
fn is_probe(req: &hyper::Request<Incoming>) -> bool {
    matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD)
        && PROBES.contains(&req.uri().path())
        && req.body().is_end_stream()
}

/// An answer's body with its request's slot: hyper drops it once written
/// (or once the connection is gone), which frees the slot and seats the
/// connection in the lobby for its next request.
pub(super) struct Answering {
    body: Full<Bytes>,
    slot: Option<OwnedSemaphorePermit>,
    seat: Arc<Seat>,
    lobby: Arc<Lobby>,
}

impl Answering {
    pub(super) fn new(
        body: Full<Bytes>,
        slot: OwnedSemaphorePermit,
        seat: Arc<Seat>,
        lobby: Arc<Lobby>,
    ) -> Answering {
        Answering {
            body,
            slot: Some(slot),
            seat,
            lobby,
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.lobby.enter(&self.seat);
    }
}

impl Body for Answering {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
