//! The HTTP server: one poller thread and a fixed pool of handler
//! threads, so memory stays bounded however many clients connect. One
//! server serves every address given, each with its own handler (the
//! console on one, /metrics and /healthz alone on another), on the same
//! threads.
//!
//! The poller accepts connections and watches every idle one (a new
//! connection, or a keep-alive connection between requests) with poll(2);
//! a connection that has bytes to read goes to the handlers, one that stays
//! silent for [`Limits::io_timeout`] is closed. An idle or slow client
//! therefore holds no thread, only its socket, and never delays another's
//! scrape. At most [`Limits::max_connections`] are open at once: beyond
//! that the poller stops accepting, and new clients wait in the kernel's
//! listen queue until one closes.
//!
//! A handler reads one request (its head parsed by httparse, at most
//! [`Limits::max_head`] bytes; a body of at most [`Limits::max_body`]),
//! runs the route, writes the answer with the security headers every
//! response carries, and hands a keep-alive connection back to the poller.
//! Accepted sockets get `SO_RCVTIMEO`/`SO_SNDTIMEO` of the I/O timeout, so a
//! client that stops sending (or reading) mid-request is cut off.
//!
//! Stopping ([`Server::stop`], or dropping the server) closes the listener
//! and the idle connections at once and lets the requests being answered
//! finish, waiting for them at most [`Limits::shutdown_grace`].

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

/// Bounds on what the server and one request may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a client to send or read a byte, and longest an
    /// open connection may stay silent.
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
    stop: Arc<AtomicBool>,
    /// Wakes the poller (one byte written).
    waker: UnixStream,
    /// Each handler thread's end (its sender dropped).
    handlers_done: Receiver<()>,
    limits: Limits,
}

impl Server {
    /// Serves each listener's handler on it until stopped.
    pub fn start(
        sites: Vec<(TcpListener, Arc<Handler>)>,
        limits: Limits,
    ) -> std::io::Result<Server> {
        let mut addrs = Vec::with_capacity(sites.len());
        let mut listeners = Vec::with_capacity(sites.len());
        let mut handlers = Vec::with_capacity(sites.len());
        for (listener, handler) in sites {
            addrs.push(listener.local_addr()?);
            listener.set_nonblocking(true)?;
            listeners.push(listener);
            handlers.push(handler);
        }
        let handlers: Arc<[Arc<Handler>]> = handlers.into();
        let (waker, woken) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        waker.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        // Connections with bytes to read, for the handlers (never more than
        // max_connections are open, so sending never blocks).
        let (work_tx, work_rx) = crossbeam_channel::bounded::<Conn>(limits.max_connections);
        // Connections the handlers are done with, back to the poller.
        let (back_tx, back_rx) = crossbeam_channel::unbounded::<Back>();
        let (done_tx, handlers_done) = crossbeam_channel::unbounded::<()>();
        for n in 0..limits.handlers.max(1) {
            let (work_rx, back_tx, done_tx) = (work_rx.clone(), back_tx.clone(), done_tx.clone());
            let (handlers, stop, waker) = (handlers.clone(), stop.clone(), waker.try_clone()?);
            std::thread::Builder::new()
                .name(format!("outboxd-http-{n}"))
                .spawn(move || {
                    let _done = done_tx;
                    while let Ok(mut conn) = work_rx.recv() {
                        let handler = &*handlers[conn.site];
                        let keep = serve(&mut conn, &limits, handler, &stop);
                        let _ = back_tx.send(if keep { Back::Idle(conn) } else { Back::Closed });
                        let _ = (&waker).write(&[1]);
                    }
                })?;
        }
        let poller = Poller {
            listeners,
            woken,
            back: back_rx,
            work: work_tx,
            limits,
            stop: stop.clone(),
            parked: Vec::new(),
            open: 0,
            last_accept_error: None,
        };
        std::thread::Builder::new()
            .name("outboxd-http".into())
            .spawn(move || poller.run())?;
        Ok(Server {
            addrs,
            stop,
            waker,
            handlers_done,
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
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&self.waker).write(&[1]);
        // Each handler drops its sender when it leaves; then recv fails.
        let deadline = Instant::now() + self.limits.shutdown_grace;
        loop {
            match self.handlers_done.recv_deadline(deadline) {
                Ok(()) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        grace_ms = self.limits.shutdown_grace.as_millis() as u64,
                        "HTTP requests still being answered after the shutdown grace; not waiting for them"
                    );
                    return;
                }
            }
        }
    }
}

/// An open connection, and what was read from it beyond the last request.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// The listener it came from (which handler answers it).
    site: usize,
}

/// What a handler hands back.
enum Back {
    /// Keep-alive: watch it for the next request.
    Idle(Conn),
    /// Closed (dropped).
    Closed,
}

/// An idle connection and when it is closed unless it speaks.
struct Parked {
    conn: Conn,
    until: Instant,
}

/// The accept-and-watch loop (see the module doc).
struct Poller {
    listeners: Vec<TcpListener>,
    woken: UnixStream,
    back: Receiver<Back>,
    work: Sender<Conn>,
    limits: Limits,
    stop: Arc<AtomicBool>,
    parked: Vec<Parked>,
    /// Connections open: parked, queued, or with a handler.
    open: usize,
    last_accept_error: Option<Instant>,
}

impl Poller {
    fn run(mut self) {
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            while let Ok(b) = self.back.try_recv() {
                match b {
                    Back::Idle(conn) => self.park(conn),
                    Back::Closed => self.open -= 1,
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                // Dropping the listener refuses new clients, and the parked
                // connections close; dropping `work` lets the handlers
                // leave once the connections already queued are answered.
                return;
            }
            let now = Instant::now();
            let before = self.parked.len();
            self.parked.retain(|p| p.until > now);
            self.open -= before - self.parked.len();
            let accepting = self.open < self.limits.max_connections;
            let wait = self
                .parked
                .iter()
                .map(|p| p.until.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(60));
            // The poll set: the waker, each listener, each parked connection.
            let sites = self.listeners.len();
            let ready: Vec<bool> = {
                let mut fds = Vec::with_capacity(self.parked.len() + sites + 1);
                fds.push(PollFd::new(&self.woken, PollFlags::IN));
                for l in &self.listeners {
                    fds.push(if accepting {
                        PollFd::new(l, PollFlags::IN)
                    } else {
                        // Not watched: its clients wait in the listen queue.
                        PollFd::new(&self.woken, PollFlags::empty())
                    });
                }
                for p in &self.parked {
                    fds.push(PollFd::new(&p.conn.stream, PollFlags::IN));
                }
                let timeout = rustix::event::Timespec::try_from(wait).ok();
                match poll(&mut fds, timeout.as_ref()) {
                    Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot watch the HTTP connections; the console stops serving");
                        return;
                    }
                }
            };
            if ready[0] {
                let mut sink = [0u8; 64];
                while matches!((&self.woken).read(&mut sink), Ok(n) if n > 0) {}
            }
            // Idle connections that spoke (or closed) go to the handlers:
            // from the end, so the indices stay valid.
            for i in (0..self.parked.len()).rev() {
                if ready[i + 1 + sites] {
                    let p = self.parked.swap_remove(i);
                    if self.work.send(p.conn).is_err() {
                        self.open -= 1;
                    }
                }
            }
            for site in 0..sites {
                if accepting && ready[1 + site] {
                    self.accept(site);
                }
            }
        }
    }

    fn park(&mut self, conn: Conn) {
        self.parked.push(Parked {
            conn,
            until: Instant::now() + self.limits.io_timeout,
        });
    }

    /// Takes the connections waiting on listener `site`, up to the limit.
    fn accept(&mut self, site: usize) {
        while self.open < self.limits.max_connections {
            match self.listeners[site].accept() {
                Ok((stream, _)) => {
                    let configured = stream
                        .set_nonblocking(false)
                        .and_then(|()| stream.set_read_timeout(Some(self.limits.io_timeout)))
                        .and_then(|()| stream.set_write_timeout(Some(self.limits.io_timeout)));
                    if configured.is_ok() {
                        self.open += 1;
                        self.park(Conn {
                            stream,
                            buf: Vec::new(),
                            site,
                        });
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Out of file descriptors, say: the connection stays in the
                // queue. Said at most every 10 s, and tried again after a
                // pause rather than at once.
                Err(e) => {
                    if self
                        .last_accept_error
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                    {
                        tracing::error!(error = %e, "cannot accept an HTTP connection");
                        self.last_accept_error = Some(Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    return;
                }
            }
        }
    }
}

/// Answers the requests a connection has sent; true to keep it open for
/// more (keep-alive), false once it is done or broken (then it is dropped,
/// which closes it).
fn serve(conn: &mut Conn, limits: &Limits, handler: &Handler, stop: &AtomicBool) -> bool {
    loop {
        let (head, keep_alive) = match read_head(conn, limits) {
            Ok(Some(h)) => {
                let keep = h.keep_alive;
                (h, keep)
            }
            Ok(None) => return false,
            Err(refusal) => {
                let _ = write_response(&mut conn.stream, "HTTP/1.1", false, false, &refusal);
                return false;
            }
        };
        let (response, body_read) = match read_body(conn, &head, limits) {
            Ok(request) => {
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&request)));
                let r = r.unwrap_or_else(|_| {
                    Response::text(500, "internal error; see the outboxd log\n")
                });
                (r, true)
            }
            Err(r) => (r, false),
        };
        // After a refused body the stream is not at a request's start.
        let keep = keep_alive && body_read && !stop.load(Ordering::SeqCst);
        if write_response(
            &mut conn.stream,
            head.version,
            head.is_head,
            keep,
            &response,
        )
        .is_err()
            || !keep
        {
            return false;
        }
        if conn.buf.is_empty() {
            return true;
        }
        // A pipelined request is already read: answer it now.
    }
}

/// A request's head, parsed.
struct Head {
    method: Method,
    is_head: bool,
    version: &'static str,
    target: String,
    headers: Vec<(String, String)>,
    keep_alive: bool,
}

/// Reads until a whole request head is buffered and parses it. None when
/// the client closed (or went silent) between requests.
fn read_head(conn: &mut Conn, limits: &Limits) -> Result<Option<Head>, Response> {
    let mut chunk = [0u8; 4096];
    loop {
        let parsed = {
            let mut fields = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut fields);
            match req.parse(&conn.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let version = if req.version == Some(0) {
                        "HTTP/1.0"
                    } else {
                        "HTTP/1.1"
                    };
                    let headers: Vec<(String, String)> = req
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).trim().to_string(),
                            )
                        })
                        .collect();
                    let connection = headers
                        .iter()
                        .find(|(n, _)| n == "connection")
                        .map(|(_, v)| v.to_ascii_lowercase())
                        .unwrap_or_default();
                    let keep_alive = if version == "HTTP/1.0" {
                        connection.contains("keep-alive")
                    } else {
                        !connection.contains("close")
                    };
                    let name = req.method.unwrap_or("");
                    Some((
                        len,
                        Head {
                            method: match name {
                                "GET" | "HEAD" => Method::Get,
                                "POST" => Method::Post,
                                _ => Method::Other,
                            },
                            is_head: name == "HEAD",
                            version,
                            target: req.path.unwrap_or("/").to_string(),
                            headers,
                            keep_alive,
                        },
                    ))
                }
                Ok(httparse::Status::Partial) => None,
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(Response::text(431, "too many request headers\n"))
                }
                Err(_) => return Err(Response::text(400, "not an HTTP request\n")),
            }
        };
        // A head that arrived whole in one read is over the limit too
        // (it once passed: the size was checked only while incomplete).
        if parsed
            .as_ref()
            .is_some_and(|(len, _)| *len > limits.max_head)
        {
            return Err(Response::text(431, "the request head is too large\n"));
        }
        if let Some((len, head)) = parsed {
            conn.buf.drain(..len);
            return Ok(Some(head));
        }
        if conn.buf.len() >= limits.max_head {
            return Err(Response::text(431, "the request head is too large\n"));
        }
        match conn.stream.read(&mut chunk) {
            // Closed, or silent past the I/O timeout, before a request began.
            Ok(0) if conn.buf.is_empty() => return Ok(None),
            Err(_) if conn.buf.is_empty() => return Ok(None),
            Ok(0) => return Ok(None),
            Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Response::text(408, "the request did not arrive in time\n")),
        }
    }
}

/// Reads the body the head announces and builds the request, or the
/// response refusing it.
fn read_body(conn: &mut Conn, head: &Head, limits: &Limits) -> Result<Request, Response> {
    let header = |name: &str| {
        head.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    if header("transfer-encoding").is_some() {
        return Err(Response::text(
            501,
            "chunked request bodies are not supported; send a Content-Length\n",
        ));
    }
    let len = match header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| Response::text(400, "the Content-Length is not a number\n"))?,
    };
    if len > limits.max_body {
        return Err(Response::text(
            413,
            format!("the body is over {} bytes\n", limits.max_body),
        ));
    }
    let mut chunk = [0u8; 4096];
    while conn.buf.len() < len {
        match conn.stream.read(&mut chunk) {
            Ok(0) | Err(_) => {
                return Err(Response::text(
                    408,
                    "the request body did not arrive in time\n",
                ))
            }
            Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body: Vec<u8> = conn.buf.drain(..len).collect();
    let (path, query) = head.target.split_once('?').unwrap_or((&head.target, ""));
    Ok(Request {
        method: head.method,
        path: decode(path),
        query: query.to_string(),
        headers: head.headers.clone(),
        body,
    })
}

/// The reason phrase of the status codes the console sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Writes the response with the security headers (no body for HEAD).
fn write_response(
    out: &mut TcpStream,
    version: &str,
    is_head: bool,
    keep_alive: bool,
    r: &Response,
) -> std::io::Result<()> {
    let mut head = format!(
        "{version} {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    for (name, value) in [
        ("Content-Security-Policy", CSP),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "same-origin"),
        ("Cache-Control", "no-store"),
    ] {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    for (name, value) in &r.headers {
        // Values are the console's own; a line break would end the header.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(match (keep_alive, version) {
        (false, _) => "Connection: close\r\n",
        (true, "HTTP/1.0") => "Connection: keep-alive\r\n",
        (true, _) => "",
    });
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if !is_head {
        bytes.extend_from_slice(&r.body);
    }
    out.write_all(&bytes)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::atomic::AtomicUsize;
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
        let send = |head: String| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(head.as_bytes()).unwrap();
            String::from_utf8_lossy(&read_until_closed(&mut s, Duration::from_secs(10)).unwrap())
                .into_owned()
        };
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(2000)
        );
        let out = send(big);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        let many: String = (0..65).map(|i| format!("X-{i}: v\r\n")).collect();
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
        assert!(
            out.to_ascii_lowercase().contains("connection: close"),
            "{out}"
        );
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
        let lower = out.to_ascii_lowercase();
        for header in [
            format!("content-security-policy: {CSP}"),
            "x-content-type-options: nosniff".into(),
            "x-frame-options: deny".into(),
            "referrer-policy: same-origin".into(),
            "cache-control: no-store".into(),
            "content-type: text/html; charset=utf-8".into(),
            // The line break is taken out, so no header is injected.
            "set-cookie: a=bx-injected: 1".into(),
        ] {
            assert!(
                lower.contains(&header.to_ascii_lowercase()),
                "{header} in {out}"
            );
        }
        assert!(out.ends_with("<p>page</p>"), "{out}");
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let out =
            String::from_utf8(read_until_closed(&mut s, Duration::from_secs(10)).unwrap()).unwrap();
        assert!(
            out.to_ascii_lowercase().contains("content-length: 11\r\n"),
            "{out}"
        );
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
