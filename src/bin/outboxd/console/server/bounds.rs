//! The bounds on what one connection and one request may take, the
//! request's body read within them, and the write deadline that cuts off a
//! client that stops reading its answer.

use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::message::{Method, Request, Response};
use crate::console::form::decode_path;

/// Bounds on what the server and one request may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpBounds {
    /// Longest wait for a request head, on a new connection and on a
    /// kept-alive one between requests: a slow or idle client is closed
    /// after it.
    pub(crate) head_timeout: Duration,
    /// Longest wait for a body, or for a client to read its answer.
    pub(crate) io_timeout: Duration,
    /// The largest request body read (forms are small).
    pub(crate) max_body: usize,
    /// The largest request head (request line and headers).
    pub(crate) max_head: usize,
    /// Handler threads: requests whose handler runs at once.
    pub(crate) handlers: usize,
    /// Connections waiting for (or still sending) a request head at once;
    /// at the cap, a new connection closes the one that has waited longest.
    /// Lowered at start to what the process's file descriptors allow.
    pub(crate) max_waiting: usize,
    /// Requests being answered at once (their body read, their handler run,
    /// their answer written), /healthz, /metrics and /livez aside; more
    /// wait for a slot.
    pub(crate) max_answering: usize,
    /// Requests for /healthz, /metrics and /livez answered at once, beside
    /// [`max_answering`](Self::max_answering): pages never keep a probe
    /// waiting.
    pub(crate) probe_slots: usize,
    /// How long stopping waits for the requests being answered.
    pub(crate) shutdown_grace: Duration,
}

impl Default for HttpBounds {
    fn default() -> HttpBounds {
        HttpBounds {
            head_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(10),
            max_body: 64 * 1024,
            max_head: 16 * 1024,
            handlers: 4,
            max_waiting: 4096,
            max_answering: 256,
            probe_slots: 16,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Request headers taken at most (more get 431).
pub(super) const MAX_HEADERS: usize = 64;

/// The console's request from hyper's (sent by `peer`), its body read
/// whole, or the response refusing it.
pub(super) async fn read(
    req: hyper::Request<Incoming>,
    limits: &HttpBounds,
    peer: SocketAddr,
) -> Result<Request, Response> {
    let (head, body) = req.into_parts();
    if head.headers.contains_key(hyper::header::TRANSFER_ENCODING) {
        return Err(Response::text(
            501,
            "chunked request bodies are not supported; send a Content-Length\n",
        ));
    }
    // hyper has checked that a Content-Length is a number.
    let len = head
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    if len > limits.max_body {
        return Err(Response::text(
            413,
            format!("the body is over {} bytes\n", limits.max_body),
        ));
    }
    let body = match tokio::time::timeout(limits.io_timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes().to_vec(),
        _ => {
            return Err(Response::text(
                408,
                "the request body did not arrive in time\n",
            ))
        }
    };
    let headers = head
        .headers
        .iter()
        .map(|(name, value)| {
            (
                // hyper's names are lower case already.
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).trim().to_string(),
            )
        })
        .collect();
    Ok(Request {
        peer,
        method: match head.method {
            hyper::Method::GET | hyper::Method::HEAD => Method::Get,
            hyper::Method::POST => Method::Post,
            _ => Method::Other,
        },
        path: decode_path(head.uri.path()),
        query: head.uri.query().unwrap_or("").to_string(),
        headers,
        body,
    })
}

/// A connection whose writes fail with `TimedOut` once they have made no
/// progress for the timeout: a client that stops reading its answer (its
/// window full) is cut off, as the old server's `SO_SNDTIMEO` did, instead
/// of holding a connection slot for ever. Reads are passed through (hyper
/// bounds the wait for a head, [`read`] the wait for a body).
pub(super) struct WriteDeadline {
    stream: tokio::net::TcpStream,
    timeout: Duration,
    /// Armed when a write first finds the socket full, cleared on progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteDeadline {
    pub(super) fn new(stream: tokio::net::TcpStream, timeout: Duration) -> WriteDeadline {
        WriteDeadline {
            stream,
            timeout,
            stalled: None,
        }
    }

    /// Passes a finished write on; a pending one fails once the deadline
    /// armed by its first wait has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the client read nothing of its answer within the I/O timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.watch(cx, r)
    }
}
