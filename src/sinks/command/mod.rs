//! The command sink: runs a program for each event, never through a shell.
//!
//! The program gets the envelope JSON on stdin and the envelope's fields in
//! environment variables:
//!
//! | variable | value |
//! |---|---|
//! | `OUTBOXD_EVENT_ID` | the event id (a ULID, the same on every retry) |
//! | `OUTBOXD_EVENT_TYPE` | such as `article.created.v1` |
//! | `OUTBOXD_EVENT_VERSION` | such as `1` |
//! | `OUTBOXD_CAUSATION_ID` | the causation id; unset when there is none |
//! | `OUTBOXD_CORRELATION_ID` | the correlation id; unset when there is none |
//! | `OUTBOXD_OCCURRED_AT` | RFC 3339 UTC, such as `2026-11-30T07:18:00.123Z` |
//! | `OUTBOXD_ATTEMPT` | 1 on the first try, 2 on the first retry, … |
//! | `OUTBOXD_CONSUMER` | the consumer's name |
//! | `OUTBOXD_TENANT_ID` | the tenant; unset when there is none |
//! | `OUTBOXD_LEGACY` | `true` for a legacy row (written without an event id: its id is derived from the row, and it is not deduplicated); unset otherwise |
//! | `TRACEPARENT` | this attempt's W3C `traceparent` (a child of the producer's: [`crate::trace`]); unset when the event has none |
//! | `TRACESTATE` | the producer's `tracestate`; unset when there is none |
//!
//! Stdin carries the envelope JSON with the payload's bytes as the producer
//! wrote them (whitespace included).
//!
//! The program inherits outboxd's environment, minus the variables given to
//! [`env_remove`](CommandSink::env_remove) (the `outboxd` binary passes every
//! variable its config reads a secret from), unless
//! [`env_clear`](CommandSink::env_clear) starts it from an empty one.
//!
//! Its exit status is the verdict: 0 is delivered, the poison code
//! ([`EX_DATAERR`], 65, unless configured otherwise) dead-letters the event at
//! once, and anything else (another code, death by a signal, the timeout) is
//! a retry whose reason carries the last [`STDERR_TAIL_BYTES`] of stderr, on
//! one line (line breaks and other control characters escaped, so that a
//! program cannot write lines of its own into outboxd's log). Standard
//! output is read and thrown away.
//!
//! Each program runs in a process group of its own. A relay that stops
//! leaves behind a delivery still running after its shutdown grace (its row
//! is released, to be delivered again later); [`kill_running`] kills such
//! programs and everything they started, so none outlives the process that
//! ran it and races the next relay's run of the same event. The `outboxd`
//! binary calls it when `run` ends, however it ends.
//!
//! An event the program can never be started with is poison, and the
//! program does not run: a variable that would hold a NUL byte, or one the
//! system refuses as too large (`E2BIG`, "Argument list too long": on Linux
//! one variable, its name included, takes at most 128 KiB), such as a
//! correlation id of a megabyte. Finding the program when the sink is built
//! is in program.rs.

mod program;

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::consumer::{Consumer, Delivery, Outcome};
use program::resolve_program;

/// The usual poison exit code: `EX_DATAERR` from sysexits.h, "the input data
/// was incorrect".
pub const EX_DATAERR: u8 = 65;

/// How long a program may run before it is killed, unless configured.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of the end of a program's stderr goes into a retry reason.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// How long to wait for the stderr pipe to close once the program has
/// exited: a background process it started may hold the pipe open.
const STDERR_GRACE: Duration = Duration::from_secs(1);

/// The longest pause between two checks on a running program.
const MAX_POLL: Duration = Duration::from_millis(50);

/// The process ids (each its process group's id) of the programs running
/// now, in every command sink of this process. A pid is in the set from
/// its spawn until it is reaped, and is reaped only under the lock, so
/// [`kill_running`] never signals a group whose id the system may have
/// given to another process since.
static RUNNING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn running() -> MutexGuard<'static, BTreeSet<u32>> {
    // The set stays consistent whatever panicked while holding it.
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Kills the process group of every program a command sink of this process
/// is running now, and returns how many there were. Call it when the
/// relay's shutdown has returned ([`RelayHandle::shutdown`]), so that a
/// delivery still running after the grace (its row released, to be
/// delivered again) does not outlive the process and run beside the next
/// relay's delivery of the same event. A program killed here counts as a
/// retry, like a timeout, should its worker still record it.
///
/// [`RelayHandle::shutdown`]: crate::relay::RelayHandle::shutdown
pub fn kill_running() -> usize {
    let pids = running();
    for &pid in pids.iter() {
        #[cfg(unix)]
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
    pids.len()
}

/// The program given to [`CommandSink::new`] cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The program name is empty.
    #[error("the command program is empty; give a path or a name to look up in PATH")]
    EmptyProgram,
    /// A path (a name with a `/`) that does not exist.
    #[error("command program {path} does not exist")]
    NotFound {
        /// The path as resolved against the current directory.
        path: PathBuf,
    },
    /// A bare name that no directory of `PATH` holds as an executable file.
    #[error(
        "command program {name:?} was not found as an executable file in any PATH directory \
         ({path_var}); give an absolute path or fix PATH"
    )]
    NotInPath {
        /// The name as given.
        name: String,
        /// The PATH searched.
        path_var: String,
    },
    /// The path names a directory or something else that is not a file.
    #[error("command program {path} is not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The file cannot be executed by this user.
    #[error("command program {path} is not executable by this user (chmod +x it)")]
    NotExecutable {
        /// The path.
        path: PathBuf,
    },
    /// A program and its arguments given as one string, such as
    /// `"/bin/echo hello"`: no such file exists, but its first word is a
    /// program.
    #[error(
        "command program {given:?} does not exist, but {program:?} does: give the program \
         alone and its arguments apart (in outboxd.toml: program = {program:?}, args = {args:?})"
    )]
    WithArguments {
        /// The program as given.
        given: String,
        /// Its first word, which is a program.
        program: String,
        /// The other words, split at whitespace (no shell quoting).
        args: Vec<String>,
    },
    /// The file could not be inspected.
    #[error("cannot inspect command program {path}: {source}")]
    Inspect {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Runs a program for each delivery. Never a shell: the program and its
/// arguments are passed to the OS as they are, so nothing in an event can
/// be interpreted as shell syntax.
///
/// The program is checked when the sink is built (it exists, is a file, is
/// executable; a bare name is looked up in `PATH` once, then), so a typo
/// fails at start-up rather than on the first event.
///
/// ```
/// use std::time::Duration;
/// use outboxd::sinks::CommandSink;
/// let sink = CommandSink::new("cat", ["-u"])?
///     .timeout(Duration::from_secs(10))
///     .poison_exit_code(65)
///     .env("INDEX", "articles");
/// assert!(sink.program().is_absolute());
/// assert!(CommandSink::new("/no/such/program", [] as [&str; 0]).is_err());
/// # Ok::<(), outboxd::sinks::CommandError>(())
/// ```
pub struct CommandSink {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    removed_env: Vec<OsString>,
    clear_env: bool,
    timeout: Duration,
    poison_exit_code: u8,
}

impl CommandSink {
    /// A sink running `program` with `args`. A `program` containing a `/` is
    /// a path (relative ones are resolved against the current directory now);
    /// any other name is looked up in `PATH` now.
    pub fn new<I>(program: impl AsRef<OsStr>, args: I) -> Result<CommandSink, CommandError>
    where
        I: IntoIterator,
        I::Item: AsRef<OsStr>,
    {
        Ok(CommandSink {
            program: resolve_program(program.as_ref())?,
            args: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            removed_env: Vec::new(),
            clear_env: false,
            timeout: DEFAULT_COMMAND_TIMEOUT,
            poison_exit_code: EX_DATAERR,
        })
    }

    /// How long the program may run; after that it (and every process in its
    /// process group) is killed and the delivery is retried. Default
    /// [`DEFAULT_COMMAND_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> CommandSink {
        self.timeout = timeout;
        self
    }

    /// The exit code that means "this event can never be handled": the event
    /// is dead-lettered at once. Default [`EX_DATAERR`] (65). 0 turns poison
    /// verdicts off (exit 0 always means delivered).
    pub fn poison_exit_code(mut self, code: u8) -> CommandSink {
        self.poison_exit_code = code;
        self
    }

    /// Sets an extra environment variable for the program. The `OUTBOXD_*`
    /// variables are set after these and win.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> CommandSink {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Keeps these variables of outboxd's own environment from the program,
    /// such as those holding other sinks' secrets. A variable set with
    /// [`env`](Self::env) is still set.
    ///
    /// ```
    /// use outboxd::sinks::CommandSink;
    /// let sink = CommandSink::new("cat", [] as [&str; 0])?
    ///     .env_remove(["SEARCH_WEBHOOK_SECRET", "NATS_TOKEN"]);
    /// # Ok::<(), outboxd::sinks::CommandError>(())
    /// ```
    pub fn env_remove<I>(mut self, keys: I) -> CommandSink
    where
        I: IntoIterator,
        I::Item: AsRef<OsStr>,
    {
        self.removed_env
            .extend(keys.into_iter().map(|k| k.as_ref().to_owned()));
        self
    }

    /// Starts the program with an empty environment (plus [`env`](Self::env)
    /// and the `OUTBOXD_*` variables) instead of inheriting outboxd's, which
    /// may hold secrets meant for other sinks.
    pub fn env_clear(mut self) -> CommandSink {
        self.clear_env = true;
        self
    }

    /// The program that runs, as resolved when the sink was built.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The configured timeout (a relay's lease must be longer).
    pub fn time_limit(&self) -> Duration {
        self.timeout
    }

    /// The configured poison exit code.
    pub fn poison_code(&self) -> u8 {
        self.poison_exit_code
    }

    fn command(&self, vars: &[(&'static str, Option<String>)]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if self.clear_env {
            cmd.env_clear();
        }
        for key in &self.removed_env {
            cmd.env_remove(key);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        for (key, value) in vars {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so a timeout kills whatever it started too.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }

    fn run(&self, delivery: &Delivery) -> Outcome {
        let env = &delivery.envelope;
        let trace = delivery.trace.as_ref();
        let vars: [(&'static str, Option<String>); 12] = [
            ("OUTBOXD_EVENT_ID", Some(env.event_id.to_string())),
            ("OUTBOXD_EVENT_TYPE", Some(env.event_type.to_string())),
            ("OUTBOXD_EVENT_VERSION", Some(env.event_version.to_string())),
            ("OUTBOXD_CAUSATION_ID", env.causation_id.clone()),
            ("OUTBOXD_CORRELATION_ID", env.correlation_id.clone()),
            ("OUTBOXD_OCCURRED_AT", Some(env.occurred_at.to_string())),
            ("OUTBOXD_ATTEMPT", Some(delivery.attempt.to_string())),
            ("OUTBOXD_CONSUMER", Some(delivery.consumer.clone())),
            ("OUTBOXD_TENANT_ID", delivery.tenant_id.clone()),
            (
                "OUTBOXD_LEGACY",
                delivery.legacy.then(|| "true".to_string()),
            ),
            // Unset without a context, so none is inherited from outboxd's.
            ("TRACEPARENT", trace.map(|t| t.traceparent.to_string())),
            (
                "TRACESTATE",
                trace.and_then(|t| Some(t.tracestate.as_ref()?.to_string())),
            ),
        ];
        if let Some((key, _)) = vars
            .iter()
            .find(|(_, v)| v.as_deref().is_some_and(|v| v.contains('\0')))
        {
            return Outcome::poison(format!(
                "{key} would hold a NUL byte, which an environment variable cannot carry"
            ));
        }

        // Built before the program starts: one that cannot be had is a retry
        // with no program to kill.
        let input = match super::buffer::envelope_json(env) {
            Ok(input) => input,
            Err(e) => return e.retry(),
        };

        // Spawned under the lock, so that a kill_running() that has just
        // run cannot miss a program it would have killed.
        let mut child = {
            let mut set = running();
            match self.command(&vars).spawn() {
                Ok(child) => {
                    set.insert(child.id());
                    child
                }
                Err(e) => return self.not_started(&e, &vars),
            }
        };

        // The three pipes are served by their own threads so that neither a
        // program that never reads stdin nor one that floods stdout or stderr
        // can block the wait below.
        if let Some(mut stdin) = child.stdin.take() {
            spawn_io("outboxd-cmd-stdin", move || {
                // EPIPE (the program exited or closed stdin) is not an error
                // here: the exit status decides.
                let _ = stdin.write_all(&input);
            });
        }
        if let Some(mut stdout) = child.stdout.take() {
            spawn_io("outboxd-cmd-stdout", move || {
                let _ = io::copy(&mut stdout, &mut io::sink());
            });
        }
        let (tail_tx, tail_rx) = mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            spawn_io("outboxd-cmd-stderr", move || {
                let _ = tail_tx.send(read_tail(stderr, STDERR_TAIL_BYTES));
            });
        }

        let waited = wait_with_deadline(&mut child, Instant::now() + self.timeout);
        let stderr = tail_rx.recv_timeout(STDERR_GRACE).unwrap_or_default();
        let stderr = super::bounded_text(&stderr, STDERR_TAIL_BYTES, true);
        let with_stderr = |head: String| {
            if stderr.is_empty() {
                head
            } else {
                format!("{head}; stderr: {stderr}")
            }
        };
        let program = self.program.display();
        match waited {
            Err(e) => Outcome::retry(format!("cannot wait for {program}: {e}")),
            Ok(None) => Outcome::retry(with_stderr(format!(
                "{program} timed out after {:?} and was killed",
                self.timeout
            ))),
            Ok(Some(status)) => match status.code() {
                Some(0) => Outcome::Delivered,
                Some(code)
                    if self.poison_exit_code != 0 && code == i32::from(self.poison_exit_code) =>
                {
                    Outcome::poison(with_stderr(format!(
                        "{program} exited with status {code} (the poison code)"
                    )))
                }
                Some(code) => {
                    Outcome::retry(with_stderr(format!("{program} exited with status {code}")))
                }
                None => Outcome::retry(with_stderr(format!("{program} {}", describe(status)))),
            },
        }
    }
}

impl CommandSink {
    /// The program could not be started: a retry, unless the system refused
    /// the event's own variables as too large (E2BIG), which no later try
    /// changes.
    fn not_started(&self, e: &io::Error, vars: &[(&'static str, Option<String>)]) -> Outcome {
        let program = self.program.display();
        if e.kind() != io::ErrorKind::ArgumentListTooLong {
            return Outcome::retry(format!("cannot start {program}: {e}"));
        }
        let (key, len) = vars
            .iter()
            .map(|(key, v)| (*key, v.as_deref().map_or(0, str::len)))
            .max_by_key(|&(_, len)| len)
            .unwrap_or(("", 0));
        Outcome::poison(format!(
            "cannot start {program}: {e}: the system refuses this event's environment as too \
             large; the largest of its variables is {key} ({len} bytes, where Linux takes at \
             most {MAX_ARG_STRLEN} bytes for one variable and its name); the program was not \
             started"
        ))
    }
}

/// Linux's limit on one argument or environment string, its name and `=`
/// included (`MAX_ARG_STRLEN`: 32 pages of 4 KiB).
const MAX_ARG_STRLEN: usize = 131_072;

impl Consumer for CommandSink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        self.run(delivery)
    }
}

impl fmt::Debug for CommandSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values of extra variables may be secrets: only their names show.
        let env_keys: Vec<&OsString> = self.env.iter().map(|(k, _)| k).collect();
        f.debug_struct("CommandSink")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &env_keys)
            .field("removed_env", &self.removed_env)
            .field("clear_env", &self.clear_env)
            .field("timeout", &self.timeout)
            .field("poison_exit_code", &self.poison_exit_code)
            .finish()
    }
}

fn spawn_io(name: &str, f: impl FnOnce() + Send + 'static) {
    // A failed spawn drops `f`, which closes the pipe it owned; the program
    // then sees EOF or EPIPE, and the verdict still comes from its exit.
    let _ = thread::Builder::new().name(name.to_string()).spawn(f);
}

/// Reads `r` to its end, keeping only the last `max` bytes.
fn read_tail(mut r: impl Read, max: usize) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * max {
                    tail.drain(..tail.len() - max);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if tail.len() > max {
        tail.drain(..tail.len() - max);
    }
    tail
}

/// Waits for the child until `deadline`; past it, kills the child's process
/// group, reaps the child and returns `None`. Polls `try_wait` with pauses
/// that grow from 1 ms to [`MAX_POLL`]: quick programs are seen within a
/// millisecond or two, and the child is only ever reaped here, under the
/// [`RUNNING`] lock, so its pid cannot be reused before a kill.
fn wait_with_deadline(child: &mut Child, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        match poll(child) {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(e) => {
                // Never leave a child running unobserved.
                let _ = kill_and_reap(child);
                return Err(e);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            kill_and_reap(child)?;
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// `try_wait` under the [`RUNNING`] lock: a child that has ended is reaped
/// and its pid forgotten in one step.
fn poll(child: &mut Child) -> io::Result<Option<ExitStatus>> {
    let mut set = running();
    let polled = child.try_wait();
    if !matches!(polled, Ok(None)) {
        set.remove(&child.id());
    }
    polled
}

/// Kills the child's process group and waits for the child to end. Polls
/// rather than blocking in `wait`, so the lock is never held for long.
fn kill_and_reap(child: &mut Child) -> io::Result<ExitStatus> {
    kill_group(child);
    loop {
        if let Some(status) = poll(child)? {
            return Ok(status);
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn kill_group(child: &mut Child) {
    // The group id is the child's pid (process_group(0)), and the child is
    // not yet reaped, so the id still names its group.
    #[cfg(unix)]
    let _ = rustix::process::kill_process_group(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::KILL,
    );
    // The direct child at least, should the group kill have failed.
    let _ = child.kill();
}

/// "killed by signal 9 (SIGKILL)" and the like.
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            use rustix::process::Signal;
            let name = match Signal::from_named_raw(sig) {
                Some(Signal::HUP) => " (SIGHUP)",
                Some(Signal::INT) => " (SIGINT)",
                Some(Signal::QUIT) => " (SIGQUIT)",
                Some(Signal::ILL) => " (SIGILL)",
                Some(Signal::ABORT) => " (SIGABRT)",
                Some(Signal::BUS) => " (SIGBUS)",
                Some(Signal::FPE) => " (SIGFPE)",
                Some(Signal::KILL) => " (SIGKILL)",
                Some(Signal::SEGV) => " (SIGSEGV)",
                Some(Signal::PIPE) => " (SIGPIPE)",
                Some(Signal::TERM) => " (SIGTERM)",
                _ => "",
            };
            return format!("was killed by signal {sig}{name}");
        }
    }
    format!("ended with {status}")
}
