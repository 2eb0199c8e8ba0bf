//! The HTTP server: hyper's HTTP/1 server on a small tokio runtime owned by
//! the console (one thread, named `outboxd-http`), the handlers run on a
//! bounded pool of blocking threads. Nothing else in outboxd is async: the
//! NATS sink keeps its own runtime the same way. One server serves every
//! address given, each with its own handler (the console on one, /metrics
//! and /healthz alone on another), on the same threads.
//!
//! hyper parses the requests and writes the answers; this module sets the
//! bounds ([`HttpBounds`]) and turns hyper's requests into the console's
//! synchronous [`Request`] and [`Response`]:
//!
//! - an idle or slow client holds a socket and a task, never a thread, so a
//!   flood of idle connections costs memory per socket only; at most
//!   [`HttpBounds::max_connections`] are open at once, and beyond that the
//!   server stops accepting: new clients wait in the kernel's listen queue
//!   until one closes;
//! - a request head must arrive whole within [`HttpBounds::io_timeout`] and a
//!   keep-alive connection silent that long is closed (hyper's header read
//!   timeout, which runs from the end of one answer to the next head); a
//!   head over [`HttpBounds::max_head`] gets 431 (hyper's answer);
//! - hyper answers a head it cannot parse or take (400, 414, 431) itself,
//!   before any handler: those answers lack the security headers every
//!   other one carries (`message::to_hyper`), as hyper 1 has no hook to add headers
//!   to them, but they have no body (Content-Length 0), so there is nothing
//!   to render, sniff or frame;
//! - a body over [`HttpBounds::max_body`] is refused (413) unread, one that does
//!   not arrive within the I/O timeout gets 408, a chunked one 501;
//! - a client that stops reading its answer is cut off after the I/O
//!   timeout (`bounds::WriteDeadline`);
//! - the handlers (SQLite reads on the pool, the library's writes) run on
//!   at most [`HttpBounds::handlers`] blocking threads, so a slow page never
//!   stalls the runtime, and a panicking one answers 500.
//!
//! Stopping ([`Server::stop`], or dropping the server) closes the listeners
//! and the idle connections at once and lets the requests being answered
//! finish, waiting for them at most [`HttpBounds::shutdown_grace`].

mod bounds;
mod message;
mod pool;

pub(crate) use bounds::HttpBounds;
pub(crate) use message::{Method, Request, Response};
pub(crate) use pool::Handler;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use bounds::{WriteDeadline, MAX_HEADERS};
use pool::answer;

/// A running server; dropping it stops it as [`Server::stop`] does.
pub(crate) struct Server {
    addrs: Vec<SocketAddr>,
    /// Set to true to stop.
    stop: watch::Sender<bool>,
    /// Disconnected when the runtime's thread has finished.
    finished: Receiver<()>,
    limits: HttpBounds,
}

impl Server {
    /// Serves each listener's handler on it until stopped.
    pub(crate) fn start(
        sites: Vec<(TcpListener, Arc<Handler>)>,
        limits: HttpBounds,
    ) -> std::io::Result<Server> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(limits.handlers.max(1))
            .thread_name("outboxd-http-h")
            .build()?;
        let mut addrs = Vec::with_capacity(sites.len());
        let mut listeners = Vec::with_capacity(sites.len());
        {
            // Taking a std listener needs the runtime's reactor.
            let _in_runtime = runtime.enter();
            for (listener, handler) in sites {
                addrs.push(listener.local_addr()?);
                listener.set_nonblocking(true)?;
                listeners.push((tokio::net::TcpListener::from_std(listener)?, handler));
            }
        }
        let (stop, stopped) = watch::channel(false);
        let (finished_tx, finished) = crossbeam_channel::bounded::<()>(0);
        std::thread::Builder::new()
            .name("outboxd-http".into())
            .spawn(move || {
                let _finished = finished_tx;
                runtime.block_on(serve(listeners, limits, stopped));
                // Every connection is closed, so no handler is running.
                runtime.shutdown_background();
            })?;
        Ok(Server {
            addrs,
            stop,
            finished,
            limits,
        })
    }

    /// The addresses served, in the order of the listeners given.
    pub(crate) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Stops: no new connection is taken and idle ones are closed; the
    /// requests being answered finish (their connections close after), and
    /// this waits for them at most [`HttpBounds::shutdown_grace`].
    pub(crate) fn stop(self) {}
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        let deadline = Instant::now() + self.limits.shutdown_grace;
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
            self.finished.recv_deadline(deadline)
        {
            tracing::warn!(
                grace_ms = self.limits.shutdown_grace.as_millis() as u64,
                "HTTP requests still being answered after the shutdown grace; not waiting for them"
            );
        }
    }
}

/// Accepts on every listener until stopped, then waits for the open
/// connections to finish.
async fn serve(
    listeners: Vec<(tokio::net::TcpListener, Arc<Handler>)>,
    limits: HttpBounds,
    stopped: watch::Receiver<bool>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let accepting: Vec<_> = listeners
        .into_iter()
        .map(|(listener, handler)| {
            tokio::spawn(accept(
                listener,
                handler,
                limits,
                open.clone(),
                stopped.clone(),
            ))
        })
        .collect();
    for a in accepting {
        // Each ends (dropping its listener) once stopped.
        let _ = a.await;
    }
    // Every permit back: every connection closed.
    let _ = open.acquire_many(limits.max_connections as u32).await;
}

/// Resolves once the server is told to stop (or its handle is gone).
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Takes connections on one listener, each once a connection slot is
/// free, and serves each on a task of its own.
async fn accept(
    listener: tokio::net::TcpListener,
    handler: Arc<Handler>,
    limits: HttpBounds,
    open: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) {
    let mut last_error: Option<Instant> = None;
    loop {
        let taken = tokio::select! {
            _ = until_stopped(stopped.clone()) => return,
            taken = async {
                // At the cap, the listener is not read: clients queue.
                let slot = open.clone().acquire_owned().await;
                (slot, listener.accept().await)
            } => taken,
        };
        match taken {
            (Ok(slot), Ok((stream, peer))) => {
                let conn = connection(stream, peer, handler.clone(), limits, stopped.clone());
                tokio::spawn(async move {
                    conn.await;
                    drop(slot);
                });
            }
            (_, Err(e))
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted
                        | ErrorKind::ConnectionReset
                        | ErrorKind::Interrupted
                ) => {}
            // Out of file descriptors, say: the connection stays in the
            // queue. Said at most every 10 s, and tried again after a
            // pause rather than at once.
            (_, Err(e)) => {
                if last_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::error!(error = %e, "cannot accept an HTTP connection");
                    last_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The semaphore is never closed.
            (Err(_), _) => return,
        }
    }
}

/// Serves one connection's requests until it closes, a bound cuts it off,
/// or the server stops (then the request being answered finishes first).
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handler: Arc<Handler>,
    limits: HttpBounds,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(WriteDeadline::new(stream, limits.io_timeout));
    let service = hyper::service::service_fn(move |req| answer(req, handler.clone(), limits, peer));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.io_timeout)
        .max_header_size(limits.max_head)
        .max_headers(MAX_HEADERS)
        .serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = until_stopped(stopped) => {}
    }
    // Closes at once when idle, after the answer being written otherwise.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

#[cfg(test)]
mod tests;
