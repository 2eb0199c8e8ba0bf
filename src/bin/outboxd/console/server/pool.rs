//! The handlers' bounded pool of blocking threads: a request read whole
//! runs its handler there, so a slow page never stalls the runtime, and a
//! panicking one answers 500.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;

use super::bounds::{read, HttpBounds};
use super::message::{to_hyper, Request, Response};

/// Something that answers requests.
pub(crate) type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// Reads one request's body (sent by `peer`), runs the handler on a
/// blocking thread and turns its response into hyper's.
pub(super) async fn answer(
    req: hyper::Request<Incoming>,
    handler: Arc<Handler>,
    limits: HttpBounds,
    peer: SocketAddr,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let (response, keep) = match read(req, &limits, peer).await {
        Ok(request) => {
            // A panic in the handler ends its task, not the thread pool.
            let r = tokio::task::spawn_blocking(move || handler(&request)).await;
            let r =
                r.unwrap_or_else(|_| Response::text(500, "internal error; see the outboxd log\n"));
            (r, true)
        }
        // After a refused body the stream is not at a request's start.
        Err(refusal) => (refusal, false),
    };
    Ok(to_hyper(response, keep))
}
