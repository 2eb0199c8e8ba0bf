//! The console stays reachable under slow and idle clients: a thousand
//! connections that send one header line every 2 s, or nothing at all,
//! reconnecting whenever they are closed, keep neither `/healthz` nor
//! `/metrics` waiting (a liveness probe gives up after a second); and
//! outboxd raises its soft limit on open files to the hard one, so it can
//! hold them.

// The console is part of the binary (the `cli` feature).
#![cfg(feature = "cli")]

use crate::common;
use crate::common::console as console_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::bin::{Outboxd, Running};
use console_support::{get, spawn};

const WAIT: Duration = Duration::from_secs(20);

/// The soft and hard limits on open files of process `pid`.
fn open_files_limits(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{text}"));
    let mut fields = line["Max open files".len()..].split_whitespace();
    let soft = fields.next().unwrap().to_string();
    (soft, fields.next().unwrap().to_string())
}

/// Connections that the console should find cheap: `slow` ones send a
/// request line, then one header line every 2 s and never the end of the
/// head; `idle` ones send nothing. Each is opened again as soon as the
/// server closes it, from one thread that polls them all.
struct Flood {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    reopened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

struct Client {
    stream: Option<TcpStream>,
    slow: bool,
    /// Lines sent on this connection, and when the next one is due.
    lines: u32,
    next_line: Instant,
    /// Times opened.
    opened: u32,
}

impl Flood {
    fn start(addr: SocketAddr, slow: usize, idle: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let reopened = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, open, peak, reopened) =
                (stop.clone(), open.clone(), peak.clone(), reopened.clone());
            std::thread::spawn(move || {
                let mut clients: Vec<Client> = (0..slow + idle)
                    .map(|i| Client {
                        stream: None,
                        slow: i < slow,
                        lines: 0,
                        next_line: Instant::now(),
                        opened: 0,
                    })
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    let mut connect_failed = false;
                    for c in &mut clients {
                        if c.stream.is_none() && !connect_failed {
                            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                                Ok(s) => {
                                    s.set_nonblocking(true).unwrap();
                                    c.stream = Some(s);
                                    (c.lines, c.next_line) = (0, Instant::now());
                                    if c.opened > 0 {
                                        reopened.fetch_add(1, Ordering::Relaxed);
                                    }
                                    c.opened += 1;
                                    let n = open.fetch_add(1, Ordering::Relaxed) + 1;
                                    peak.fetch_max(n, Ordering::Relaxed);
                                }
                                // The listen queue is full: try again later.
                                Err(_) => connect_failed = true,
                            }
                        }
                        let Some(s) = &mut c.stream else { continue };
                        let mut alive = match s.read(&mut [0u8; 512]) {
                            Err(e) => e.kind() == ErrorKind::WouldBlock,
                            // Closed, or answered (a 408) before closing.
                            Ok(_) => false,
                        };
                        if alive && c.slow && Instant::now() >= c.next_line {
                            let line: &[u8] = match c.lines {
                                0 => b"GET / HTTP/1.1\r\n",
                                _ => b"X-Slow: 1\r\n",
                            };
                            alive = s.write(line).is_ok();
                            c.lines += 1;
                            c.next_line = Instant::now() + Duration::from_secs(2);
                        }
                        if !alive {
                            c.stream = None;
                            open.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    // Paces the clients' lines; nothing waits on it.
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Flood {
            stop,
            open,
            peak,
            reopened,
            thread: Some(thread),
        }
    }

    /// (the most connections open at once, how many were opened again).
    fn stop(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        (
            self.peak.load(Ordering::Relaxed),
            self.reopened.load(Ordering::Relaxed),
        )
    }
}

/// One probe as a health checker sends it, on a new connection: its status
/// and how long it took from the connect to the last byte of the answer.
fn probe(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{path}: cannot connect within 20 s: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        panic!(
            "{path}: no whole answer within {:?}: {e}",
            started.elapsed()
        );
    }
    let status = String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed())
}

/// What the issue measured: with every one of the old 256 connection slots
/// held by a slow client, /healthz and /metrics went unanswered for ~60 s.
#[test]
fn health_and_metrics_answer_within_a_second_under_1000_slow_or_idle_connections() {
    // A child process of its own: it raises its own limit on open files for
    // its thousand clients, which the other tests' process must not.
    let name = "health_and_metrics_answer_within_a_second_under_1000_slow_or_idle_connections";
    if !common::in_child_with_env(module_path!(), name, &[("OUTBOXD_TEST_FLOOD_CHILD", "1")]) {
        return;
    }
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    let soft = getrlimit(Resource::Nofile).current;
    assert!(
        soft.is_none_or(|n| n >= 2_000),
        "this test needs 2,000 open files (hard limit {:?})",
        limit.maximum
    );

    let db = common::TestDb::new();
    let mut p = spawn(&db.path, &["console", "--http", "127.0.0.1:0"], &[]);
    let addr: SocketAddr = p.console_address().parse().unwrap();
    // The first status measure is in: a probe waits for nothing else.
    assert_eq!(get(&addr.to_string(), "/healthz").status, 200);

    let flood = Flood::start(addr, 500, 500);
    // All thousand open at once (a server that holds them off keeps some
    // in its listen queue or out: then the probes show it).
    let deadline = Instant::now() + WAIT;
    while flood.peak.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Probes over several head timeouts (2 s), while the slow clients are
    // cut off and come back.
    let mut times = Vec::new();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        for path in ["/healthz", "/metrics"] {
            let (status, took) = probe(addr, path);
            assert_eq!(status, 200, "{path}");
            times.push((path, took));
        }
        // A probe every half second or so, as a busy checker would.
        std::thread::sleep(Duration::from_millis(400));
    }
    let open_at_end = flood.open.load(Ordering::Relaxed);
    let (peak, reopened) = flood.stop();
    let slowest = times.iter().max_by_key(|(_, t)| *t).unwrap();
    eprintln!(
        "{} probes under {peak} connections at most ({open_at_end} at the end, {reopened} \
         reopened): slowest {} in {:?}",
        times.len(),
        slowest.0,
        slowest.1
    );
    for (path, took) in &times {
        assert!(
            *took < Duration::from_secs(1),
            "{path} took {took:?} under the flood: {times:?}"
        );
    }
    assert!(
        peak >= 1000,
        "the flood had {peak} connections open at most"
    );
    assert!(
        reopened >= 500,
        "the slow clients were cut off and came back: {reopened}"
    );
    assert!(open_at_end >= 500, "the flood held: {open_at_end} open");
    p.assert_alive();
}

#[test]
fn outboxd_raises_its_soft_limit_on_open_files_to_the_hard_one() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    if hard.is_some_and(|h| h <= 256) {
        eprintln!("skipped: the hard limit on open files is {hard:?}");
        return;
    }
    let db = common::TestDb::new();
    let mut cmd = Outboxd::on(&db.path).command(&["console", "--http", "127.0.0.1:0"]);
    // SAFETY: setrlimit is async-signal-safe (one system call), the only
    // thing done between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(256),
                    maximum: hard,
                },
            )
            .map_err(std::io::Error::from)
        });
    }
    let mut p = Running::spawn(&mut cmd);
    p.console_address();
    let (soft, hard) = open_files_limits(p.pid());
    assert_eq!(soft, hard, "started with a soft limit of 256");
}
