//! The handlers' bounded pool of blocking threads: a request read whole
//! runs its handler there, so a slow page never stalls the runtime, and a
//! panicking one answers 500.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;

use super::bounds::{read, HttpBounds};
use super::lobby::{Lobby, Seat};
use super::message::{to_hyper, Request, Response};
use super::slots::{Answering, Slots};

/// Something that answers requests.
pub(crate) type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// What one connection's requests are answered with.
pub(super) struct Answerer {
    pub(super) handler: Arc<Handler>,
    pub(super) limits: HttpBounds,
    pub(super) peer: SocketAddr,
    pub(super) seat: Arc<Seat>,
    pub(super) lobby: Arc<Lobby>,
    pub(super) slots: Arc<Slots>,
}

/// Takes a slot for one request (its connection leaves the lobby), reads
/// its body, runs the handler on a blocking thread and turns its response
/// into hyper's.
pub(super) async fn answer(
    req: hyper::Request<Incoming>,
    on: Arc<Answerer>,
) -> Result<hyper::Response<Answering>, std::convert::Infallible> {
    // Waiting for a slot, the connection still counts as waiting.
    let slot = on.slots.take(&req).await;
    let (response, keep) = if !on.lobby.leave(&on.seat) {
        // Closed to make room meanwhile: its task drops it.
        (
            Response::text(503, "too many connections; try again\n"),
            false,
        )
    } else {
        match read(req, &on.limits, on.peer).await {
            Ok(request) => {
                let handler = on.handler.clone();
                // A panic in the handler ends its task, not the thread pool.
                let r = tokio::task::spawn_blocking(move || handler(&request)).await;
                let r = r.unwrap_or_else(|_| {
                    Response::text(500, "internal error; see the outboxd log\n")
                });
                (r, true)
            }
            // After a refused body the stream is not at a request's start.
            Err(refusal) => (refusal, false),
        }
    };
    let (seat, lobby) = (on.seat.clone(), on.lobby.clone());
    Ok(to_hyper(response, keep).map(|body| Answering::new(body, slot, seat, lobby)))
}
