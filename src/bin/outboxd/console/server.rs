//! The HTTP server: tiny_http reads requests, a few handler threads answer
//! them.
//!
//! tiny_http gives each connection a thread of its own that reads requests
//! and queues them, so an idle or slow client holds only its own thread and
//! never delays another's scrape. The handler threads take requests from
//! that queue, read at most [`Limits::max_body`] of a body, and write the
//! answer with the security headers every response carries.
//!
//! tiny_http sets no socket timeouts, so the listener gets `SO_RCVTIMEO`
//! and `SO_SNDTIMEO` before tiny_http takes it: Linux copies both onto every
//! accepted socket, so a client that stops sending (or reading) is cut off
//! after [`Limits::io_timeout`] (the test
//! `an_idle_connection_is_closed_after_the_io_timeout` checks the
//! inheritance). The receive timeout also ends an `accept` that waited that
//! long, and tiny_http ends its accept thread on any accept error (a
//! timeout, or too many open files): so the server runs in generations, a
//! new tiny_http server on the same socket each time the last one stops
//! accepting ([`generation`]; the test
//! `the_server_keeps_accepting_after_idle_periods` checks it).
//!
//! Two limits of tiny_http 0.12 remain. It does not bound the size of a
//! request's header lines: the default loopback bind, and the token
//! elsewhere, are what keep strangers away from the port. And its
//! connection pool counts a thread as free until that thread wakes, so in a
//! burst of new connections one may wait behind an idle one for up to the
//! I/O timeout; connections that are already open never hold up a new one.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bounds on what one request may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a client to send or read a byte.
    pub io_timeout: Duration,
    /// The largest request body read (forms are small).
    pub max_body: usize,
    /// Handler threads.
    pub handlers: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            io_timeout: Duration::from_secs(10),
            max_body: 64 * 1024,
            handlers: 4,
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

/// A running server.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Serves `handler` on `listener` until [`Server::stop`] (or the end of
    /// the process).
    pub fn start(
        listener: TcpListener,
        limits: Limits,
        handler: Arc<Handler>,
    ) -> std::io::Result<Server> {
        use rustix::net::sockopt::{set_socket_timeout, Timeout};
        set_socket_timeout(&listener, Timeout::Recv, Some(limits.io_timeout))?;
        set_socket_timeout(&listener, Timeout::Send, Some(limits.io_timeout))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut ended = generation(&listener, &limits, &handler, &stop)?;
        let s = stop.clone();
        std::thread::Builder::new()
            .name("outboxd-http".into())
            .spawn(move || loop {
                // Until this generation's accept thread ends (or, once
                // stopped, its handlers have all left).
                let _ = ended.recv();
                if s.load(Ordering::SeqCst) {
                    return;
                }
                match generation(&listener, &limits, &handler, &s) {
                    Ok(next) => ended = next,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot accept HTTP connections any more");
                        return;
                    }
                }
            })?;
        Ok(Server { addr, stop })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops taking requests: the handler threads leave once idle for the
    /// I/O timeout.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One tiny_http server on a clone of `listener`, with its handler threads.
/// The receiver hears when its accept thread has ended: tiny_http ends it
/// on any accept error, and `accept` itself times out after the listener's
/// receive timeout, so while no client connects a generation lives about
/// [`Limits::io_timeout`]. Its handlers go on answering the connections it
/// accepted until none has sent anything for longer than the I/O timeout,
/// by when the kernel has closed every one of them.
fn generation(
    listener: &TcpListener,
    limits: &Limits,
    handler: &Arc<Handler>,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<crossbeam_channel::Receiver<()>> {
    let server = Arc::new(
        tiny_http::Server::from_listener(listener.try_clone()?, None)
            .map_err(|e| std::io::Error::other(e.to_string()))?,
    );
    let (ended_tx, ended_rx) = crossbeam_channel::bounded(1);
    let accepting = Arc::new(AtomicBool::new(true));
    let idle = limits.io_timeout + Duration::from_secs(1);
    for n in 0..limits.handlers.max(1) {
        let (server, handler, limits) = (server.clone(), handler.clone(), *limits);
        let (accepting, stop, ended_tx) = (accepting.clone(), stop.clone(), ended_tx.clone());
        std::thread::Builder::new()
            .name(format!("outboxd-http-{n}"))
            .spawn(move || loop {
                match server.recv_timeout(idle) {
                    Ok(Some(rq)) => answer(rq, &limits, &*handler),
                    Ok(None)
                        if !accepting.load(Ordering::SeqCst) || stop.load(Ordering::SeqCst) =>
                    {
                        return;
                    }
                    Ok(None) => {}
                    // The accept thread ended (it says so once).
                    Err(_) => {
                        accepting.store(false, Ordering::SeqCst);
                        let _ = ended_tx.try_send(());
                    }
                }
            })?;
    }
    Ok(ended_rx)
}

/// Reads one request, runs the handler (a panic becomes a 500) and writes
/// the response.
fn answer(mut rq: tiny_http::Request, limits: &Limits, handler: &Handler) {
    let response = match read(&mut rq, limits) {
        Ok(request) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&request))) {
                Ok(r) => r,
                Err(_) => Response::text(500, "internal error; see the outboxd log\n"),
            }
        }
        Err(r) => r,
    };
    let mut out = tiny_http::Response::from_data(response.body)
        .with_status_code(response.status)
        .with_header(header("Content-Type", response.content_type));
    for (name, value) in [
        ("Content-Security-Policy", CSP),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "same-origin"),
        ("Cache-Control", "no-store"),
    ] {
        out.add_header(header(name, value));
    }
    for (name, value) in &response.headers {
        out.add_header(header(name, value));
    }
    if let Err(e) = rq.respond(out) {
        tracing::debug!(error = %e, "cannot write an HTTP response");
    }
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    // Values are ours (no CR or LF), so this cannot fail; a header that
    // somehow does is dropped rather than panicking a handler thread.
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|()| tiny_http::Header::from_bytes(&b"X-Dropped"[..], &b"1"[..]).unwrap())
}

/// The request as the handler sees it, or the response refusing it.
fn read(rq: &mut tiny_http::Request, limits: &Limits) -> Result<Request, Response> {
    let method = match rq.method() {
        tiny_http::Method::Get | tiny_http::Method::Head => Method::Get,
        tiny_http::Method::Post => Method::Post,
        _ => Method::Other,
    };
    let url = rq.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let headers = rq
        .headers()
        .iter()
        .map(|h| {
            (
                h.field.as_str().as_str().to_ascii_lowercase(),
                h.value.as_str().to_string(),
            )
        })
        .collect();
    let too_large = || Response::text(413, format!("the body is over {} bytes\n", limits.max_body));
    if rq.body_length().is_some_and(|n| n > limits.max_body) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    if method == Method::Post {
        rq.as_reader()
            .take(limits.max_body as u64 + 1)
            .read_to_end(&mut body)
            .map_err(|_| Response::text(408, "the request body did not arrive in time\n"))?;
        if body.len() > limits.max_body {
            return Err(too_large());
        }
    }
    Ok(Request {
        method,
        path: decode(path),
        query: query.to_string(),
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Instant;

    fn echo_server(limits: Limits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Server::start(
            listener,
            limits,
            Arc::new(|r: &Request| Response::text(200, format!("{} {}", r.path, r.body.len()))),
        )
        .unwrap()
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
                let mut s = TcpStream::connect(server.addr()).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                assert!(keep_alive_get(&mut s, "/page").contains("/page 0"));
                s
            })
            .collect();
        let started = Instant::now();
        for _ in 0..20 {
            let text = get(server.addr(), "/metrics");
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(text.contains("/metrics 0"), "{text}");
        }
        // A serial server would have waited out each idle client (30 s).
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(get(server.addr(), "/x").contains(CSP));
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
        let mut s = TcpStream::connect(server.addr()).unwrap();
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
            let text = get(server.addr(), &format!("/round{round}"));
            assert!(text.contains(&format!("/round{round} 0")), "{text}");
        }
        server.stop();
    }

    #[test]
    fn a_body_over_the_limit_is_refused_unread() {
        let server = echo_server(Limits {
            max_body: 10,
            ..Limits::default()
        });
        let mut s = TcpStream::connect(server.addr()).unwrap();
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
            let mut s = TcpStream::connect(server.addr()).unwrap();
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
