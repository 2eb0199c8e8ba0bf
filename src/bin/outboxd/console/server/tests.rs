use super::message::CSP;
use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn echo_server(limits: HttpBounds) -> Server {
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
        Server::start(vec![site("console"), site("probes")], HttpBounds::default()).unwrap();
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
    let server = echo_server(HttpBounds {
        head_timeout: Duration::from_secs(30),
        ..HttpBounds::default()
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
fn an_idle_connection_is_closed_after_the_head_timeout() {
    let server = echo_server(HttpBounds {
        head_timeout: Duration::from_millis(300),
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        head_timeout: timeout,
        io_timeout: timeout,
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        head_timeout: timeout,
        io_timeout: timeout,
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        max_body: 10,
        ..HttpBounds::default()
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
    limits: HttpBounds,
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
fn a_keep_alive_connection_silent_past_the_head_timeout_is_closed() {
    let server = echo_server(HttpBounds {
        head_timeout: Duration::from_millis(300),
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        max_head: 1024,
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        max_head: 1024,
        ..HttpBounds::default()
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
    let server = echo_server(HttpBounds {
        io_timeout: Duration::from_millis(300),
        ..HttpBounds::default()
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
fn at_the_waiting_cap_a_new_connection_closes_the_one_waiting_longest() {
    let server = echo_server(HttpBounds {
        max_waiting: 2,
        head_timeout: Duration::from_secs(30),
        ..HttpBounds::default()
    });
    let addr = server.addrs()[0];
    // Two kept-alive connections wait for their next request.
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            assert!(keep_alive_get(&mut s, "/held").contains("/held 0"));
            s
        })
        .collect();
    // The first asks again: now the second has waited longest.
    assert!(keep_alive_get(&mut held[0], "/again").contains("/again 0"));
    // A third is taken and answered at once, closing the second.
    let started = Instant::now();
    let out = get(addr, "/third");
    assert!(out.ends_with("/third 0"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let rest = read_until_closed(&mut held[1], Duration::from_secs(10)).unwrap();
    assert!(rest.is_empty(), "closed without an answer: {rest:?}");
    assert!(keep_alive_get(&mut held[0], "/still").contains("/still 0"));
    server.stop();
}

#[test]
fn a_probe_never_waits_behind_pages() {
    let (release_tx, release) = crossbeam_channel::unbounded::<()>();
    let (started_tx, started) = crossbeam_channel::unbounded::<()>();
    let server = server_with(
        HttpBounds {
            max_answering: 1,
            ..HttpBounds::default()
        },
        move |r: &Request| {
            if r.path == "/slow" {
                started_tx.send(()).unwrap();
                let _ = release.recv();
            }
            Response::text(200, format!("{} done", r.path))
        },
    );
    let addr = server.addrs()[0];
    let slow = std::thread::spawn(move || get(addr, "/slow"));
    started.recv_timeout(Duration::from_secs(10)).unwrap();
    // The one page slot is taken: another page waits for it...
    let page = std::thread::spawn(move || get(addr, "/page"));
    // ...while every probe is answered from the probes' own slots.
    for path in ["/healthz", "/metrics", "/livez"] {
        let out = get(addr, path);
        assert!(out.ends_with(&format!("{path} done")), "{out}");
    }
    assert!(!page.is_finished(), "the page waits for the slot");
    release_tx.send(()).unwrap();
    assert!(slow.join().unwrap().ends_with("/slow done"));
    assert!(page.join().unwrap().ends_with("/page done"));
    server.stop();
}

#[test]
fn the_waiting_cap_fits_the_open_files_limit() {
    let limits = HttpBounds::default();
    assert_eq!(waiting_cap(&limits, None), 4096);
    assert_eq!(waiting_cap(&limits, Some(1 << 20)), 4096);
    // 1,024 descriptors: the slots and the reserve first.
    assert_eq!(waiting_cap(&limits, Some(1024)), 1024 - 256 - 16 - 256);
    assert_eq!(waiting_cap(&limits, Some(100)), 16, "never below 16");
}

#[test]
fn a_client_that_stops_reading_its_answer_is_cut_off() {
    // One request answered at a time: the second client is served only
    // once the first, which never reads its 32 MB answer, is cut off.
    let server = server_with(
        HttpBounds {
            max_answering: 1,
            io_timeout: Duration::from_millis(300),
            ..HttpBounds::default()
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
            HttpBounds {
                handlers: 2,
                ..HttpBounds::default()
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
    let server = server_with(HttpBounds::default(), |r: &Request| {
        assert!(r.path != "/panic", "a handler's bug");
        Response::text(200, "fine")
    });
    let addr = server.addrs()[0];
    assert!(get(addr, "/panic").starts_with("HTTP/1.1 500"));
    for _ in 0..(2 * HttpBounds::default().handlers) {
        assert!(get(addr, "/ok").ends_with("fine"));
    }
    server.stop();
}

#[test]
fn every_answer_carries_the_security_headers_and_head_has_no_body() {
    let server = server_with(HttpBounds::default(), |_: &Request| {
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
        HttpBounds {
            head_timeout: Duration::from_secs(30),
            ..HttpBounds::default()
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
        HttpBounds {
            shutdown_grace: Duration::from_millis(300),
            ..HttpBounds::default()
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
