//! One harness for running the real `outboxd` binary (tests/binary/cli.rs,
//! cli_ops.rs, e2e_run.rs, process_faults.rs): a [`Sandbox`] directory with
//! its database, [`Outboxd`] to run a command and check its exit code and
//! error line, [`Running`] for a long-lived `outboxd run`, and the exit
//! codes of the CLI contract in [`code`].
//!
//! Every command runs with a clean environment (no `OUTBOXD_DB`,
//! `OUTBOXD_CONFIG` or `RUST_LOG` from the caller) and no terminal on
//! stdin, so tests see what a script or a service manager sees.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::TestDb;

/// The binary under test.
pub const OUTBOXD: &str = env!("CARGO_BIN_EXE_outboxd");

/// The exit codes `outboxd --help` documents (src/bin/outboxd/exit.rs).
pub mod code {
    pub const OK: i32 = 0;
    pub const PROBLEMS: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const DATABASE: i32 = 3;
    pub const SCHEMA: i32 = 4;
    pub const INPUT: i32 = 5;
    pub const CONFIG: i32 = 6;
    pub const INTERNAL: i32 = 7;
}

/// How long a command or a shutdown may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// How to start `outboxd`: which database (`--db`), in which directory, as
/// which user.
#[derive(Debug, Clone)]
pub struct Outboxd {
    db: Option<PathBuf>,
    dir: Option<PathBuf>,
    runner: Vec<OsString>,
}

impl Outboxd {
    /// `outboxd --db DB …`, run in DB's directory.
    pub fn on(db: impl AsRef<Path>) -> Outboxd {
        let db = db.as_ref().to_path_buf();
        Outboxd {
            dir: db.parent().map(Path::to_path_buf),
            db: Some(db),
            runner: Vec::new(),
        }
    }

    /// Without `--db`: the default (`./outboxd.db`) or `OUTBOXD_DB` decides.
    pub fn without_db(mut self) -> Outboxd {
        self.db = None;
        self
    }

    /// Run in `dir`.
    pub fn in_dir(mut self, dir: impl AsRef<Path>) -> Outboxd {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Run through `runner` (such as setpriv, to drop root).
    pub fn through(mut self, runner: &[OsString]) -> Outboxd {
        self.runner = runner.to_vec();
        self
    }

    /// The command, ready to spawn: clean environment, stdin from nothing.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = match self.runner.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(OUTBOXD);
                c
            }
            None => Command::new(OUTBOXD),
        };
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        cmd.env_remove("OUTBOXD_DB")
            .env_remove("OUTBOXD_CONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        if let Some(db) = &self.db {
            cmd.arg("--db").arg(db);
        }
        cmd.args(args);
        cmd
    }

    /// Runs to the end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("the outboxd binary runs")
    }

    /// Runs to the end with `stdin` as its standard input.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the outboxd binary runs");
        // A payload larger than the limit may be cut off by outboxd early.
        let _ = child.stdin.take().unwrap().write_all(stdin);
        child.wait_with_output().unwrap()
    }

    /// Runs, checks the exit code and that nothing panicked; returns stdout.
    pub fn expect(&self, args: &[&str], code: i32) -> String {
        expect_output(args, self.run(args), code)
    }

    /// Runs and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.expect(args, code::OK)
    }

    /// Runs, checks the exit code, and parses stdout as one JSON value.
    pub fn json(&self, args: &[&str], code: i32) -> serde_json::Value {
        let out = self.expect(args, code);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("outboxd {args:?}: {e}: {out}"))
    }

    /// Runs and checks the failure: the exit code, one line on stderr
    /// (`outboxd: error: …`) mentioning `needle`, nothing on stdout.
    /// Returns the error line.
    pub fn fails(&self, args: &[&str], code: i32, needle: &str) -> String {
        check_failure(args, self.run(args), code, needle)
    }

    /// [`fails`](Self::fails), with `stdin` as the standard input.
    pub fn fails_with_stdin(&self, args: &[&str], stdin: &[u8], code: i32, needle: &str) -> String {
        check_failure(args, self.run_with_stdin(args, stdin), code, needle)
    }

    /// Starts a long-running command (`run`), its output collected.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running::spawn(&mut self.command(args))
    }
}

fn expect_output(args: &[&str], out: Output, code: i32) -> String {
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "outboxd {args:?}: wrong exit code\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "outboxd {args:?}: {stderr}");
    stdout
}

fn check_failure(args: &[&str], out: Output, code: i32, needle: &str) -> String {
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "outboxd {args:?}: wrong exit code; stderr: {stderr}"
    );
    assert_one_line_error(&stderr, needle);
    assert!(
        out.stdout.is_empty(),
        "outboxd {args:?} printed to stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// `stderr` is exactly one line, `outboxd: error: …`, mentioning `needle`.
pub fn assert_one_line_error(stderr: &str, needle: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr}");
    assert!(
        lines[0].starts_with("outboxd: error: "),
        "error line has the wrong prefix: {stderr}"
    );
    assert!(
        lines[0].contains(needle),
        "error line does not mention {needle:?}: {stderr}"
    );
}

/// A temporary directory with `app.db` (migrated or not) where `outboxd`
/// runs; configs, scripts and outputs of a test go beside the database.
/// Derefs to [`TestDb`] for the library's view of the database.
pub struct Sandbox {
    db: TestDb,
    runner: Vec<OsString>,
}

impl std::ops::Deref for Sandbox {
    type Target = TestDb;
    fn deref(&self) -> &TestDb {
        &self.db
    }
}

impl Sandbox {
    /// An empty directory: `app.db` does not exist yet.
    pub fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        Sandbox {
            db: TestDb { dir, path },
            runner: Vec::new(),
        }
    }

    /// A directory whose `app.db` is migrated.
    pub fn migrated() -> Sandbox {
        Sandbox {
            db: TestDb::new(),
            runner: Vec::new(),
        }
    }

    /// Runs every command through `runner` (such as [`drop_root`]'s).
    pub fn run_through(&mut self, runner: Vec<OsString>) {
        self.runner = runner;
    }

    /// A file in the sandbox.
    pub fn path(&self, name: &str) -> PathBuf {
        self.file(name)
    }

    /// `outboxd --db app.db`, in the sandbox.
    pub fn outboxd(&self) -> Outboxd {
        self.on(&self.path)
    }

    /// `outboxd --db DB`, in the sandbox.
    pub fn on(&self, db: &Path) -> Outboxd {
        Outboxd::on(db)
            .in_dir(self.dir.path())
            .through(&self.runner)
    }

    /// See [`Outboxd::command`].
    pub fn command(&self, args: &[&str]) -> Command {
        self.outboxd().command(args)
    }

    /// See [`Outboxd::run`].
    pub fn run(&self, args: &[&str]) -> Output {
        self.outboxd().run(args)
    }

    /// See [`Outboxd::ok`].
    pub fn ok(&self, args: &[&str]) -> String {
        self.outboxd().ok(args)
    }

    /// See [`Outboxd::expect`].
    pub fn expect(&self, args: &[&str], code: i32) -> String {
        self.outboxd().expect(args, code)
    }

    /// See [`Outboxd::json`].
    pub fn json(&self, args: &[&str], code: i32) -> serde_json::Value {
        self.outboxd().json(args, code)
    }

    /// See [`Outboxd::spawn`].
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.outboxd().spawn(args)
    }

    /// [`Outboxd::fails`] on app.db, and nothing in the sandbox changed:
    /// bad input loses nothing and writes nothing.
    pub fn fails(&self, args: &[&str], code: i32, needle: &str) -> String {
        self.fails_on(&self.path, args, code, needle)
    }

    /// [`Sandbox::fails`] on another database.
    pub fn fails_on(&self, db: &Path, args: &[&str], code: i32, needle: &str) -> String {
        let before = self.snapshot();
        let err = self.on(db).fails(args, code, needle);
        assert!(
            self.snapshot() == before,
            "outboxd {args:?} changed the files in its directory"
        );
        err
    }

    /// [`Sandbox::fails`] with `stdin` as the standard input.
    pub fn fails_with_stdin(&self, args: &[&str], stdin: &[u8], code: i32, needle: &str) -> String {
        let before = self.snapshot();
        let err = self.outboxd().fails_with_stdin(args, stdin, code, needle);
        assert!(
            self.snapshot() == before,
            "outboxd {args:?} changed the files in its directory"
        );
        err
    }

    /// `status --json`, which exits 1 (and still prints) when a threshold
    /// is crossed, such as an event due since 2020.
    pub fn status_json(&self) -> serde_json::Value {
        let out = self.run(&["status", "--json"]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "outboxd status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A shell script in the sandbox, made executable.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.write(name, &format!("#!/bin/sh\n{body}\n"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Every file in the sandbox and its bytes, leaving out SQLite's -shm
    /// index and an empty -wal (a reader may create them; they hold no data).
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if !entry.file_type().unwrap().is_file() || name.ends_with("-shm") {
                continue;
            }
            let bytes = std::fs::read(entry.path()).unwrap();
            if name.ends_with("-wal") && bytes.is_empty() {
                continue;
            }
            files.insert(name, bytes);
        }
        files
    }
}

/// As root, permission bits stop nothing. A runner that starts a program as
/// `nobody` (setpriv), when that works here; None otherwise.
pub fn drop_root() -> Option<Vec<OsString>> {
    let runner: Vec<OsString> = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ]
    .map(OsString::from)
    .into();
    let probe = Command::new(&runner[0])
        .args(&runner[1..])
        .arg(OUTBOXD)
        .arg("--version")
        .output();
    matches!(probe, Ok(out) if out.status.success()).then_some(runner)
}

/// True when this process runs as root (permission bits do not stop it).
pub fn is_root() -> bool {
    // /proc/self/status: "Uid:\treal\teffective\t...".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Where a running process's output goes.
enum Captured {
    /// Collected in memory by two threads, joined once the process has
    /// exited so that every byte it wrote is there.
    Pipes {
        stdout: Arc<Mutex<Vec<u8>>>,
        stderr: Arc<Mutex<Vec<u8>>>,
        readers: Vec<std::thread::JoinHandle<()>>,
    },
    /// stderr appended to a file (it survives the process, and many
    /// processes of one test may share a directory of logs).
    Log(PathBuf),
}

/// A running process (usually `outboxd run`), SIGKILLed and reaped when
/// dropped, so a failing test leaves nothing running.
pub struct Running {
    child: Child,
    captured: Captured,
}

impl Running {
    /// Starts `cmd` with stdout and stderr collected in memory.
    pub fn spawn(cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the program runs");
        let mut readers = Vec::new();
        let mut collect = |mut r: Box<dyn Read + Send>| {
            let buf = Arc::new(Mutex::new(Vec::new()));
            let b = buf.clone();
            readers.push(std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    b.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }));
            buf
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Running {
            child,
            captured: Captured::Pipes {
                stdout,
                stderr,
                readers,
            },
        }
    }

    /// Starts `cmd` in its own process group (a signal meant for the test's
    /// group, a terminal's Ctrl-C, does not reach it), stdout where `cmd`
    /// sends it, stderr appended to `log`.
    pub fn spawn_logging(cmd: &mut Command, log: PathBuf) -> Running {
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("the program runs");
        Running {
            child,
            captured: Captured::Log(log),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stdout so far (empty when not collected).
    pub fn stdout(&self) -> String {
        match &self.captured {
            Captured::Pipes { stdout, .. } => {
                String::from_utf8_lossy(&stdout.lock().unwrap()).into_owned()
            }
            Captured::Log(_) => String::new(),
        }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        match &self.captured {
            Captured::Pipes { stderr, .. } => {
                String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned()
            }
            Captured::Log(log) => std::fs::read_to_string(log).unwrap_or_default(),
        }
    }

    /// Sends a signal (`-TERM`, `-STOP`…) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {sig} {} failed", self.pid());
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        self.child.wait().unwrap();
    }

    /// True once it has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Panics, with its stderr, if the process has exited.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("outboxd exited early ({status}):\n{}", self.stderr());
        }
    }

    /// Waits for the process to end, at most `timeout`; then its output is
    /// complete.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Captured::Pipes { readers, .. } = &mut self.captured {
                    // The pipes close with the process, unless a child it
                    // left behind holds them: wait for that a little only.
                    let until = Instant::now() + Duration::from_secs(5);
                    while readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "process {} did not exit within {timeout:?}; stderr:\n{}",
                    self.pid(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, and the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal("-TERM");
        self.wait(WAIT)
    }

    /// Waits until stderr logs `after` followed by an address and returns
    /// the address (`127.0.0.1:PORT`). Tests start servers on port 0 and
    /// read the port outboxd bound from its log, so no other process can
    /// take the port between the test choosing it and outboxd binding it.
    pub fn logged_address(&mut self, after: &str) -> String {
        let mut found = None;
        super::wait_until(&format!("outboxd to log {after:?}"), WAIT, || {
            self.assert_alive();
            let log = self.stderr();
            found = log.split_once(after).and_then(|(_, rest)| {
                let addr: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || ".:[]".contains(*c))
                    .collect();
                // Only once the line is written past the address.
                (rest.len() > addr.len()).then_some(addr)
            });
            found.is_some()
        });
        found.unwrap()
    }

    /// Where it serves the console: the address in its "serving the
    /// console at http://ADDR/" line.
    pub fn console_address(&mut self) -> String {
        self.logged_address("serving the console at http://")
    }

    /// Waits until stderr says the relay runs (its consumers registered).
    pub fn wait_started(&mut self) {
        super::wait_until("outboxd to start", WAIT, || {
            self.assert_alive();
            self.stderr().contains("outboxd running")
        });
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test may have stopped it (SIGSTOP); continue it first so no
        // stopped process is left behind should the kill fail.
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
