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
//! - an idle or slow client holds a socket and a task, never a thread or a
//!   slot: a connection waiting for (or still sending) its request head,
//!   new or kept alive between requests, waits in the lobby
//!   (`lobby::Lobby`), capped on its own at [`HttpBounds::max_waiting`]
//!   (lowered at start to what the process's file descriptors allow); at the
//!   cap a new connection closes the one that has waited longest, so the
//!   listener is always read and a new client (a health check) is never
//!   kept out by slow or idle ones;
//! - a request head must arrive whole within [`HttpBounds::head_timeout`],
//!   and a kept-alive connection silent that long is closed (hyper's header
//!   read timeout, which runs from the end of one answer to the next head); a
//!   head over [`HttpBounds::max_head`] gets 431 (hyper's answer);
//! - a request with its head in takes a slot (`slots::Slots`) until its
//!   answer is written: [`HttpBounds::max_answering`] for pages and actions,
//!   [`HttpBounds::probe_slots`] of their own for /healthz, /metrics and
//!   /livez, so probes never wait behind pages;
//! - hyper answers a head it cannot parse or take (400, 414, 431) itself,
//!   before any handler: those answers lack the security headers every
//!   other one carries (`message::to_hyper`), as hyper 1 has no hook to add headers
//!   to them, but they have no body (Content-Length 0), so there is nothing
//!   to render, sniff or frame;
//! - a body over [`HttpBounds::max_body`] is refused (413) unread, one that does
//!   not arrive within [`HttpBounds::io_timeout`] gets 408, a chunked one 501;
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
mod lobby;
mod message;
mod pool;
mod slots;

pub(crate) use bounds::HttpBounds;
pub(crate) use message::{Method, Request, Response};
pub(crate) use pool::Handler;

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use bounds::{WriteDeadline, MAX_HEADERS};
use lobby::{Lobby, Seat};
use pool::{answer, Answerer};
use slots::Slots;

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
    let shared = Shared {
        limits,
        lobby: Arc::new(Lobby::new(waiting_cap(
            &limits,
            rustix::process::getrlimit(rustix::process::Resource::Nofile).current,
        ))),
        slots: Arc::new(Slots::new(&limits)),
        stopped,
    };
    // Each connection's task holds a clone; all dropped: all closed.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let accepting: Vec<_> = listeners
        .into_iter()
        .map(|(listener, handler)| {
            tokio::spawn(accept(listener, handler, shared.clone(), open.clone()))
        })
        .collect();
    drop(open);
    for a in accepting {
        // Each ends (dropping its listener) once stopped.
        let _ = a.await;
    }
    let _ = all_closed.recv().await;
}

/// What every connection's task shares.
#[derive(Clone)]
struct Shared {
    limits: HttpBounds,
    lobby: Arc<Lobby>,
    slots: Arc<Slots>,
    stopped: watch::Receiver<bool>,
}

/// File descriptors kept for the rest of the process (the database and its
/// pool, sinks, logs) when the waiting connections are capped.
const FD_RESERVE: u64 = 256;

/// [`HttpBounds::max_waiting`], lowered so that the waiting connections,
/// the requests being answered and [`FD_RESERVE`] fit under `nofile`, the
/// soft limit on open files (which `main` raises to the hard one): at the
/// cap the lobby closes a connection, where running out of descriptors
/// would fail every accept.
fn waiting_cap(limits: &HttpBounds, nofile: Option<u64>) -> usize {
    let Some(nofile) = nofile else {
        return limits.max_waiting;
    };
    let answering = (limits.max_answering + limits.probe_slots) as u64;
    let fits = nofile.saturating_sub(answering + FD_RESERVE).max(16);
    limits
        .max_waiting
        .min(usize::try_from(fits).unwrap_or(usize::MAX))
}

/// Resolves once the server is told to stop (or its handle is gone).
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Takes connections on one listener and serves each on a task of its own.
async fn accept(
    listener: tokio::net::TcpListener,
    handler: Arc<Handler>,
    shared: Shared,
    open: tokio::sync::mpsc::Sender<()>,
) {
    let mut last_error: Option<Instant> = None;
    loop {
        let taken = tokio::select! {
            _ = until_stopped(shared.stopped.clone()) => return,
            taken = listener.accept() => taken,
        };
        match taken {
            Ok((stream, peer)) => {
                let conn = connection(stream, peer, handler.clone(), shared.clone());
                let open = open.clone();
                tokio::spawn(async move {
                    conn.await;
                    drop(open);
                });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted
                        | ErrorKind::ConnectionReset
                        | ErrorKind::Interrupted
                ) => {}
            // Out of file descriptors, say: the connection stays in the
            // queue. Said at most every 10 s, and tried again after a
            // pause rather than at once.
            Err(e) => {
                if last_error.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::error!(error = %e, "cannot accept an HTTP connection");
                    last_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one connection's requests until it closes, a bound cuts it off,
/// the lobby closes it to make room, or the server stops (then the request
/// being answered finishes first).
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handler: Arc<Handler>,
    shared: Shared,
) {
    let _ = stream.set_nodelay(true);
    let seat = Arc::new(Seat::default());
    shared.lobby.enter(&seat);
    // However it ends, it waits no more.
    struct Leave(Arc<Lobby>, Arc<Seat>);
    impl Drop for Leave {
        fn drop(&mut self) {
            self.0.leave(&self.1);
        }
    }
    let _leave = Leave(shared.lobby.clone(), seat.clone());
    let limits = shared.limits;
    let on = Arc::new(Answerer {
        handler,
        limits,
        peer,
        seat: seat.clone(),
        lobby: shared.lobby.clone(),
        slots: shared.slots.clone(),
    });
    let io = TokioIo::new(WriteDeadline::new(stream, limits.io_timeout));
    let service = hyper::service::service_fn(move |req| answer(req, on.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_header_size(limits.max_head)
        .max_headers(MAX_HEADERS)
        .serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        // Dropping the connection closes it.
        _ = seat.close.notified() => return,
        _ = until_stopped(shared.stopped) => {}
    }
    // Closes at once when idle, after the answer being written otherwise.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

#[cfg(test)]
mod tests;
