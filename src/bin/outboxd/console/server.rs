//! The HTTP server: hyper's HTTP/1 server on a small tokio runtime owned by
//! the console (one thread, named `outboxd-http`), the handlers run on a
//! bounded pool of blocking threads. Nothing else in outboxd is async: the
//! NATS sink keeps its own runtime the same way. One server serves every
//! address given, each with its own handler (the console on one, /metrics
//! and /healthz alone on another), on the same threads.
//!
//! hyper parses the requests and writes the answers; this module sets the
//! bounds ([`Limits`]) and turns hyper's requests into the console's
//! synchronous [`Request`] and [`Response`]:
//!
//! - an idle or slow client holds a socket and a task, never a thread, so a
//!   flood of idle connections costs memory per socket only; at most
//!   [`Limits::max_connections`] are open at once, and beyond that the
//!   server stops accepting: new clients wait in the kernel's listen queue
//!   until one closes;
//! - a request head must arrive whole within [`Limits::io_timeout`] and a
//!   keep-alive connection silent that long is closed (hyper's header read
//!   timeout, which runs from the end of one answer to the next head); a
//!   head over [`Limits::max_head`] gets 431 (hyper's answer);
//! - hyper answers a head it cannot parse or take (400, 414, 431) itself,
//!   before any handler: those answers lack the security headers every
//!   other one carries ([`to_hyper`]), as hyper 1 has no hook to add headers
//!   to them, but they have no body (Content-Length 0), so there is nothing
//!   to render, sniff or frame;
//! - a body over [`Limits::max_body`] is refused (413) unread, one that does
//!   not arrive within the I/O timeout gets 408, a chunked one 501;
//! - a client that stops reading its answer is cut off after the I/O
//!   timeout ([`WriteDeadline`]);
//! - the handlers (SQLite reads on the pool, the library's writes) run on
//!   at most [`Limits::handlers`] blocking threads, so a slow page never
//!   stalls the runtime, and a panicking one answers 500.
//!
//! Stopping ([`Server::stop`], or dropping the server) closes the listeners
//! and the idle connections at once and lets the requests being answered
//! finish, waiting for them at most [`Limits::shutdown_grace`].

use std::future::Future;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Semaphore};

/// Bounds on what the server and one request may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a request head, a body, or a client to read its
    /// answer; and longest a keep-alive connection may stay silent.
    pub io_timeout: Duration,
    /// The largest request body read (forms are small).
    pub max_body: usize,
    /// The largest request head (request line and headers).
    pub max_head: usize,
    /// Handler threads: requests answered at once.
    pub handlers: usize,
    /// Connections open at once; more wait in the listen queue.
    pub max_connections: usize,
    /// How long stopping waits for the requests being answered.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            io_timeout: Duration::from_secs(10),
            max_body: 64 * 1024,
            max_head: 16 * 1024,
            handlers: 4,
            max_connections: 256,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Request headers taken at most (more get 431).
const MAX_HEADERS: usize = 64;

/// The request methods the console answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET, and HEAD (answered as GET without the body).
    Get,
    /// POST.
    Post,
    /// Anything else.
    Other,
}

/// One request, read whole.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The path, percent-decoded, without the query.
    pub path: String,
    /// The query string (undecoded), without `?`.
    pub query: String,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body (at most [`Limits::max_body`]).
    pub body: Vec<u8>,
}

impl Request {
    /// A test request.
    #[cfg(test)]
    pub fn new(method: Method, target: &str) -> Request {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Request {
            method,
            path: decode(path),
            query: query.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// The first value of a header (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The query string's pairs, decoded.
    pub fn query_pairs(&self) -> Params {
        Params::parse(&self.query)
    }

    /// The url-encoded form in the body, decoded.
    pub fn form(&self) -> Params {
        Params::parse(&String::from_utf8_lossy(&self.body))
    }
}

/// Decoded `a=b&c=d` pairs, in order; a name may repeat.
#[derive(Debug, Clone, Default)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    /// Parses `application/x-www-form-urlencoded` text.
    pub fn parse(s: &str) -> Params {
        Params(
            s.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    /// The first value of `name`, None when absent; blank counts as absent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Percent-decodes a URL part (`+` is a space, as forms write it).
pub fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Percent-encodes a value for a URL's query.
pub fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The Content-Type.
    pub content_type: &'static str,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// An HTML page.
    pub fn html(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: body.into_bytes(),
        }
    }

    /// Plain text.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into().into_bytes(),
        }
    }

    /// A JSON document.
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: value.to_string().into_bytes(),
        }
    }

    /// A redirect after a POST (303: the browser follows with a GET).
    pub fn see_other(location: &str) -> Response {
        Response::text(303, "").with_header("Location", location.to_string())
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: String) -> Response {
        self.headers.push((name, value));
        self
    }
}

/// The Content-Security-Policy of every response: no script at all, styles
/// only from the console's own stylesheet, forms only to the console, and
/// no framing. Even an injected `<script>` that escaped the templates could
/// not run.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
                       form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Something that answers requests.
pub type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A running server; dropping it stops it as [`Server::stop`] does.
pub struct Server {
    addrs: Vec<SocketAddr>,
    /// Set to true to stop.
    stop: watch::Sender<bool>,
    /// Disconnected when the runtime's thread has finished.
    finished: Receiver<()>,
    limits: Limits,
}

impl Server {
    /// Serves each listener's handler on it until stopped.
    pub fn start(
        sites: Vec<(TcpListener, Arc<Handler>)>,
        limits: Limits,
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
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Stops: no new connection is taken and idle ones are closed; the
    /// requests being answered finish (their connections close after), and
    /// this waits for them at most [`Limits::shutdown_grace`].
    pub fn stop(self) {}
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
    limits: Limits,
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
    limits: Limits,
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
            (Ok(slot), Ok((stream, _))) => {
                let conn = connection(stream, handler.clone(), limits, stopped.clone());
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
    handler: Arc<Handler>,
    limits: Limits,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(WriteDeadline::new(stream, limits.io_timeout));
    let service = hyper::service::service_fn(move |req| answer(req, handler.clone(), limits));
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

/// Reads one request's body, runs the handler on a blocking thread and
/// turns its response into hyper's.
async fn answer(
    req: hyper::Request<Incoming>,
    handler: Arc<Handler>,
    limits: Limits,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let (response, keep) = match read(req, &limits).await {
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

/// The console's request from hyper's, its body read whole, or the
/// response refusing it.
async fn read(req: hyper::Request<Incoming>, limits: &Limits) -> Result<Request, Response> {
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
        method: match head.method {
            hyper::Method::GET | hyper::Method::HEAD => Method::Get,
            hyper::Method::POST => Method::Post,
            _ => Method::Other,
        },
        path: decode(head.uri.path()),
        query: head.uri.query().unwrap_or("").to_string(),
        headers,
        body,
    })
}

/// hyper's response with the security headers every answer carries (hyper
/// sets its Content-Length, leaves the body out for HEAD and closes the
/// connection after a `Connection: close`).
fn to_hyper(r: Response, keep_alive: bool) -> hyper::Response<Full<Bytes>> {
    let mut out = hyper::Response::new(Full::new(Bytes::from(r.body)));
    *out.status_mut() =
        hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    let fixed = [
        ("content-type", r.content_type),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ];
    for (name, value) in fixed {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
    for (name, value) in r.headers {
        // Values are the console's own; a line break would end the header.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.append(name, value);
        }
    }
    if !keep_alive {
        headers.insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    out
}

/// A connection whose writes fail with `TimedOut` once they have made no
/// progress for the timeout: a client that stops reading its answer (its
/// window full) is cut off, as the old server's `SO_SNDTIMEO` did, instead
/// of holding a connection slot for ever. Reads are passed through (hyper
/// bounds the wait for a head, [`read`] the wait for a body).
struct WriteDeadline {
    stream: tokio::net::TcpStream,
    timeout: Duration,
    /// Armed when a write first finds the socket full, cleared on progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteDeadline {
    fn new(stream: tokio::net::TcpStream, timeout: Duration) -> WriteDeadline {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn echo_server(limits: Limits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Server::start(
            vec![(
                listener,
                Arc::new(|r: &Request| Response::text(200, format!("{} {}", r.path, r.body.len())))
                    as Arc<Handler>,
            )],
            limits,
        )
        .unwrap()
    }

    #[test]
    fn one_server_answers_each_address_with_its_own_handler() {
        let site = |name: &'static str| -> (TcpListener, Arc<Handler>) {
            (
                TcpListener::bind("127.0.0.1:0").unwrap(),
                Arc::new(move |r: &Request| Response::text(200, format!("{name} {}", r.path))),
            )
        };
        let server =
            Server::start(vec![site("console"), site("probes")], Limits::default()).unwrap();
        let [console, probes] = [server.addrs()[0], server.addrs()[1]];
        assert!(get(console, "/x").ends_with("console /x"));
        assert!(get(probes, "/metrics").ends_with("probes /metrics"));
        assert!(get(console, "/y").ends_with("console /y"));
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Sends one keep-alive GET on `s` and reads its response whole.
    fn keep_alive_get(s: &mut TcpStream, path: &str) -> String {
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        head + &String::from_utf8(body).unwrap()
    }

    #[test]
    fn idle_connections_do_not_hold_up_other_clients() {
        let server = echo_server(Limits {
            io_timeout: Duration::from_secs(30),
            ..Limits::default()
        });
        // Twice as many idle keep-alive connections as handler threads:
        // each was answered once, so the server holds it, waiting for a
        // next request that does not come.
        let mut idle: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                assert!(keep_alive_get(&mut s, "/page").contains("/page 0"));
                s
            })
            .collect();
        let started = Instant::now();
        for _ in 0..20 {
            let text = get(server.addrs()[0], "/metrics");
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(text.contains("/metrics 0"), "{text}");
        }
        // A serial server would have waited out each idle client (30 s).
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(get(server.addrs()[0], "/x").contains(CSP));
        // The idle connections were still open all along, and still work.
        for s in &mut idle {
            assert!(keep_alive_get(s, "/again").contains("/again 0"));
        }
        drop(idle);
        server.stop();
    }

    #[test]
    fn an_idle_connection_is_closed_after_the_io_timeout() {
        let server = echo_server(Limits {
            io_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let started = Instant::now();
        let mut out = Vec::new();
        // The server ends the connection (with a 408); without the
        // inherited timeout this read would wait the full 20 s and fail.
        s.read_to_end(&mut out).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        server.stop();
    }

    #[test]
    fn the_server_keeps_accepting_after_idle_periods() {
        let timeout = Duration::from_millis(200);
        let server = echo_server(Limits {
            io_timeout: timeout,
            ..Limits::default()
        });
        for round in 0..4 {
            // Longer than the timeout: the accept in progress times out and
            // a new generation takes over the socket.
            std::thread::sleep(timeout * 3);
            let text = get(server.addrs()[0], &format!("/round{round}"));
            assert!(text.contains(&format!("/round{round} 0")), "{text}");
        }
        server.stop();
    }

    /// Every WARN and ERROR event of this test binary (log-crate records
    /// too, through tracing-subscriber's bridge), from the first call on.
    fn warnings_and_errors() -> Arc<std::sync::Mutex<Vec<u8>>> {
        use std::sync::{Mutex, OnceLock};
        static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
        LOGS.get_or_init(|| {
            let buf = Arc::new(Mutex::new(Vec::new()));
            #[derive(Clone)]
            struct Writer(Arc<Mutex<Vec<u8>>>);
            impl std::io::Write for Writer {
                fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                    self.0.lock().unwrap().extend_from_slice(b);
                    Ok(b.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let w = Writer(buf.clone());
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_ansi(false)
                .with_writer(move || w.clone())
                .try_init()
                .expect("the only global subscriber of these tests");
            buf
        })
        .clone()
    }

    #[test]
    fn an_idle_server_logs_no_warning_or_error() {
        let logs = warnings_and_errors();
        let timeout = Duration::from_millis(100);
        let server = echo_server(Limits {
            io_timeout: timeout,
            ..Limits::default()
        });
        // An idle connection too: closed at the timeout, quietly.
        let _idle = TcpStream::connect(server.addrs()[0]).unwrap();
        // The property is about a stretch of time: several I/O timeouts
        // without a client (the old server failed an accept at each one
        // and logged an ERROR).
        std::thread::sleep(timeout * 10);
        assert!(get(server.addrs()[0], "/after").contains("/after 0"));
        server.stop();
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        let ours: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("console::server") || l.contains("tiny_http"))
            .collect();
        assert!(ours.is_empty(), "{ours:#?}");
    }

    #[test]
    fn a_body_over_the_limit_is_refused_unread() {
        let server = echo_server(Limits {
            max_body: 10,
            ..Limits::default()
        });
        let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 11\r\n\r\nhello world"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        let ok = {
            let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
            write!(
                s,
                "POST /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        assert!(ok.ends_with("/f 5"), "{ok}");
        server.stop();
    }

    /// A server answering every request with `handler`.
    fn server_with(
        limits: Limits,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Server::start(vec![(listener, Arc::new(handler) as Arc<Handler>)], limits).unwrap()
    }

    /// Reads until the server closes the connection, or fails after `wait`.
    fn read_until_closed(s: &mut TcpStream, wait: Duration) -> std::io::Result<Vec<u8>> {
        s.set_read_timeout(Some(wait))?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Sends `request` on a new connection and returns all the server
    /// answers until it closes the connection (within 10 s), as text.
    fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        String::from_utf8_lossy(&read_until_closed(&mut s, Duration::from_secs(10)).unwrap())
            .into_owned()
    }

    #[test]
    fn a_keep_alive_connection_silent_past_the_io_timeout_is_closed() {
        let server = echo_server(Limits {
            io_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert!(keep_alive_get(&mut s, "/one").contains("/one 0"));
        // Answered and kept open; then silent: the server closes it (EOF),
        // where without the bound this read would fail at 20 s.
        let started = Instant::now();
        let rest = read_until_closed(&mut s, Duration::from_secs(20)).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        server.stop();
    }

    #[test]
    fn a_head_over_the_limit_or_with_too_many_headers_gets_431() {
        let server = echo_server(Limits {
            max_head: 1024,
            ..Limits::default()
        });
        let addr = server.addrs()[0];
        let send = |head: String| exchange(addr, &head);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(2000)
        );
        let out = send(big);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let out = send(format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n"));
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        // Under both limits it is answered.
        let out = send("GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("/fine 0"),
            "{out}"
        );
        server.stop();
    }

    #[test]
    fn hyper_s_own_refusals_have_no_body() {
        // They cannot carry the security headers (see the module doc), so
        // they must have nothing a browser could render.
        let server = echo_server(Limits {
            max_head: 1024,
            ..Limits::default()
        });
        let addr = server.addrs()[0];
        for (request, status) in [
            ("GET / HTTP/1.1\r\nHo st: x\r\n\r\n".to_string(), "400"),
            ("NOT A REQUEST\r\n\r\n".to_string(), "400"),
            (
                format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(2000)),
                "431",
            ),
        ] {
            let out = exchange(addr, &request).to_ascii_lowercase();
            assert!(out.starts_with(&format!("http/1.1 {status}")), "{out}");
            assert!(out.contains("content-length: 0\r\n"), "{out}");
            assert!(out.ends_with("\r\n\r\n"), "no body: {out}");
        }
        server.stop();
    }

    #[test]
    fn a_body_that_stops_arriving_gets_408_and_a_chunked_one_501() {
        let server = echo_server(Limits {
            io_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
        write!(
            s,
            "POST /f HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf"
        )
        .unwrap();
        let out = read_until_closed(&mut s, Duration::from_secs(20)).unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
        assert!(out.contains("connection: close"), "{out}");
        let mut s = TcpStream::connect(server.addrs()[0]).unwrap();
        write!(
            s,
            "POST /f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        .unwrap();
        let out = read_until_closed(&mut s, Duration::from_secs(20)).unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 501"));
        server.stop();
    }

    #[test]
    fn connections_beyond_the_cap_wait_until_one_closes() {
        let server = echo_server(Limits {
            max_connections: 2,
            io_timeout: Duration::from_secs(30),
            ..Limits::default()
        });
        let addr = server.addrs()[0];
        let mut held: Vec<TcpStream> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                assert!(keep_alive_get(&mut s, "/held").contains("/held 0"));
                s
            })
            .collect();
        // The third connects (the kernel's listen queue) but is not served
        // while both are open.
        let mut third = TcpStream::connect(addr).unwrap();
        write!(
            third,
            "GET /third HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        third
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut byte = [0u8; 1];
        let err = third.read(&mut byte).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{err}"
        );
        // One closes: the third is taken and answered.
        held.pop();
        let out = read_until_closed(&mut third, Duration::from_secs(10)).unwrap();
        assert!(String::from_utf8_lossy(&out).ends_with("/third 0"));
        assert!(keep_alive_get(&mut held[0], "/still").contains("/still 0"));
        server.stop();
    }

    #[test]
    fn a_client_that_stops_reading_its_answer_is_cut_off() {
        // One connection at a time: the second client is served only once
        // the first, which never reads its 32 MB answer, is cut off.
        let server = server_with(
            Limits {
                max_connections: 1,
                io_timeout: Duration::from_millis(300),
                ..Limits::default()
            },
            |r: &Request| match r.path.as_str() {
                "/big" => Response::text(200, "x".repeat(32 << 20)),
                _ => Response::text(200, "small"),
            },
        );
        let addr = server.addrs()[0];
        let mut stuck = TcpStream::connect(addr).unwrap();
        write!(stuck, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let started = Instant::now();
        let out = get(addr, "/small");
        assert!(out.ends_with("small"), "{out}");
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(stuck);
        server.stop();
    }

    #[test]
    fn at_most_the_handler_threads_answer_at_once() {
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (release_tx, release) = crossbeam_channel::unbounded::<()>();
        let server = {
            let (running, most) = (running.clone(), most.clone());
            server_with(
                Limits {
                    handlers: 2,
                    ..Limits::default()
                },
                move |_: &Request| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let _ = release.recv();
                    running.fetch_sub(1, Ordering::SeqCst);
                    Response::text(200, "done")
                },
            )
        };
        let addr = server.addrs()[0];
        let clients: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || get(addr, "/slow")))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while running.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "the handlers did not start");
            std::thread::yield_now();
        }
        // Four requests are in; a third handler would start now if allowed.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(running.load(Ordering::SeqCst), 2);
        for _ in 0..4 {
            release_tx.send(()).unwrap();
        }
        for c in clients {
            assert!(c.join().unwrap().ends_with("done"));
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        server.stop();
    }

    #[test]
    fn a_panicking_handler_answers_500_and_the_server_goes_on() {
        let server = server_with(Limits::default(), |r: &Request| {
            assert!(r.path != "/panic", "a handler's bug");
            Response::text(200, "fine")
        });
        let addr = server.addrs()[0];
        assert!(get(addr, "/panic").starts_with("HTTP/1.1 500"));
        for _ in 0..(2 * Limits::default().handlers) {
            assert!(get(addr, "/ok").ends_with("fine"));
        }
        server.stop();
    }

    #[test]
    fn every_answer_carries_the_security_headers_and_head_has_no_body() {
        let server = server_with(Limits::default(), |_: &Request| {
            Response::html(200, "<p>page</p>".into())
                .with_header("Set-Cookie", "a=b\r\nX-Injected: 1".into())
        });
        let addr = server.addrs()[0];
        let out = get(addr, "/");
        for header in [
            format!("content-security-policy: {CSP}"),
            "x-content-type-options: nosniff".into(),
            "x-frame-options: DENY".into(),
            "referrer-policy: same-origin".into(),
            "cache-control: no-store".into(),
            "content-type: text/html; charset=utf-8".into(),
            // The line break is taken out, so no header is injected.
            "set-cookie: a=bX-Injected: 1".into(),
        ] {
            assert!(out.contains(&header), "{header} in {out}");
        }
        assert!(out.ends_with("<p>page</p>"), "{out}");
        let out = exchange(
            addr,
            "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(out.contains("content-length: 11\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "no body: {out}");
        server.stop();
    }

    #[test]
    fn stopping_closes_idle_connections_and_lets_an_answer_finish() {
        let (release_tx, release) = crossbeam_channel::unbounded::<()>();
        let (started_tx, started) = crossbeam_channel::unbounded::<()>();
        let server = server_with(
            Limits {
                io_timeout: Duration::from_secs(30),
                ..Limits::default()
            },
            move |r: &Request| {
                if r.path == "/slow" {
                    started_tx.send(()).unwrap();
                    release.recv().unwrap();
                }
                Response::text(200, format!("{} done", r.path))
            },
        );
        let addr = server.addrs()[0];
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert!(keep_alive_get(&mut idle, "/idle").contains("/idle done"));
        let slow = std::thread::spawn(move || get(addr, "/slow"));
        started.recv_timeout(Duration::from_secs(10)).unwrap();
        let stopping = std::thread::spawn(move || server.stop());
        // The idle connection is closed at once (long before its 30 s).
        let rest = read_until_closed(&mut idle, Duration::from_secs(10)).unwrap();
        assert!(rest.is_empty());
        // New clients are refused once the listener is closed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_ok() {
            assert!(Instant::now() < deadline, "still accepting");
            std::thread::yield_now();
        }
        assert!(!stopping.is_finished(), "stop waits for the answer");
        release_tx.send(()).unwrap();
        let out = slow.join().unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("/slow done"),
            "{out}"
        );
        stopping.join().unwrap();
    }

    #[test]
    fn stopping_waits_at_most_the_grace() {
        let (started_tx, started) = crossbeam_channel::unbounded::<()>();
        let (_never_tx, never) = crossbeam_channel::unbounded::<()>();
        let server = server_with(
            Limits {
                shutdown_grace: Duration::from_millis(300),
                ..Limits::default()
            },
            move |_: &Request| {
                started_tx.send(()).unwrap();
                let _ = never.recv();
                Response::text(200, "late")
            },
        );
        let addr = server.addrs()[0];
        let _client = std::thread::spawn(move || {
            TcpStream::connect(addr).map(|mut s| {
                let _ = write!(s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
                let _ = read_until_closed(&mut s, Duration::from_secs(30));
            })
        });
        started.recv_timeout(Duration::from_secs(10)).unwrap();
        let t = Instant::now();
        server.stop();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn params_decode_forms_and_repeat_names() {
        let p = Params::parse("a=1&id=3&id=4&t=article.%2A.v1&s=a+b&blank=");
        assert_eq!(p.get("t"), Some("article.*.v1"));
        assert_eq!(p.get("s"), Some("a b"));
        assert_eq!(p.all("id"), ["3", "4"]);
        assert_eq!(p.get("blank"), None);
        assert_eq!(encode("a b&c"), "a%20b%26c");
    }
}
