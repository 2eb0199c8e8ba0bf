//! The tests' one HTTP client and one HTTP receiver, both over plain
//! `std::net` so that every byte is the test's choice: the client sends
//! exactly the headers given (the console's tests forge Host and Origin),
//! and the receiver answers whatever its handler says, including not at
//! all (a webhook timeout).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The client.

/// A response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// A header's value, by name in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

/// One request with exactly the headers given, plus `Host: ADDR` (unless
/// given), `Connection: close` and, with a body or for POST, its length.
/// Panics, naming the request, when the server cannot be reached.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    try_request(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} http://{addr}{path}: {e}"))
}

/// `GET path`.
pub fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, &[], "")
}

/// [`request`], or the error when the server cannot be reached (for a
/// poll that waits for a server).
pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    req.push_str("Connection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    // Read the head, then Content-Length bytes (some servers keep the
    // connection open after answering, whatever the request said).
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let mut expected = None;
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            expected = len.map(|n| end + 4 + n);
        }
        if expected.is_some_and(|n| raw.len() >= n) {
            break;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = find(&headers, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
    Ok(Reply {
        status,
        headers,
        body: if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    })
}

/// The body of a chunked response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

// ---------------------------------------------------------------------------
// The receiver.

/// One request the receiver read.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Names in lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When its head arrived.
    pub at: Instant,
}

impl Request {
    /// A header's value, by name in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

/// What the receiver does with a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `HTTP/1.1 {status}` (such as "429 Too Many Requests"), these
    /// headers, this body (its length and `connection: close` added).
    Reply {
        status: String,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// No answer: the connection is held until the client gives up.
    Hang,
}

impl Answer {
    /// `status` with `body` and no other header.
    pub fn new(status: &str, body: &str) -> Answer {
        Answer::Reply {
            status: status.into(),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (to a reply).
    pub fn header(mut self, name: &str, value: &str) -> Answer {
        if let Answer::Reply { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
}

/// Decides the answer to a request, given the ones that came before it.
pub type Handler = dyn Fn(&Request, &[Request]) -> Answer + Send + Sync;

/// An HTTP/1.1 receiver on 127.0.0.1:0, one thread per connection, one
/// request per connection. Every request it reads is kept (see
/// [`requests`](Receiver::requests)) and sent to [`next`](Receiver::next).
pub struct Receiver {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Request>>>,
    arrived: Mutex<mpsc::Receiver<Request>>,
}

impl Receiver {
    /// Starts serving; `handler` answers each request (it runs on the
    /// request's own thread, so it may sleep to be slow).
    pub fn start(
        handler: impl Fn(&Request, &[Request]) -> Answer + Send + Sync + 'static,
    ) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, arrived) = mpsc::channel();
        let handler: Arc<Handler> = Arc::new(handler);
        let log = seen.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (log, tx, handler) = (log.clone(), tx.clone(), handler.clone());
                thread::spawn(move || {
                    let _ = serve(stream, &log, &tx, &*handler);
                });
            }
        });
        Receiver {
            addr,
            seen,
            arrived: Mutex::new(arrived),
        }
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next request not taken yet, waiting at most 30 s for it.
    pub fn next(&self) -> Request {
        self.arrived
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30))
            .expect("the receiver saw a request within 30 s")
    }

    /// Every request read so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    log: &Mutex<Vec<Request>>,
    tx: &mpsc::Sender<Request>,
    handler: &Handler,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(());
    }
    let at = Instant::now();
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let path = words.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = find(&headers, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let req = Request {
        method,
        path,
        headers,
        body,
        at,
    };
    let earlier = {
        let mut log = log.lock().unwrap();
        let earlier = log.clone();
        log.push(req.clone());
        earlier
    };
    let _ = tx.send(req.clone());
    match handler(&req, &earlier) {
        Answer::Hang => {
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            Ok(())
        }
        Answer::Reply {
            status,
            headers,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            out.push_str(&body);
            let mut stream = stream;
            stream.write_all(out.as_bytes())?;
            stream.flush()
        }
    }
}
