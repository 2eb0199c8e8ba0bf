//! The three sinks against real files, real child programs and a real HTTP
//! server on 127.0.0.1.
#![cfg(feature = "sinks")]

use crate::common;

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outboxd::consumer::{Consumer, Delivery, Outcome};
use outboxd::sinks::webhook::{sign, verify, SignatureError, WebhookSecret};
use outboxd::sinks::{CommandError, CommandSink, JsonlSink, WebhookSink};
use outboxd::{Envelope, EventId, EventType, Timestamp};
use serde_json::value::RawValue;

use common::http::{Answer, Receiver};

fn delivery(payload: &str) -> Delivery {
    Delivery::new(Envelope {
        event_id: EventId::new(),
        event_type: EventType::parse("article.created.v1").unwrap(),
        event_version: 1,
        causation_id: None,
        correlation_id: Some("req-42".into()),
        occurred_at: Timestamp::from_millis(1_796_023_080_123),
        payload: RawValue::from_string(payload.to_string()).unwrap(),
    })
    .attempt(3)
    .consumer("indexer")
    .tenant_id(Some("acme".into()))
}

fn retry_reason(o: Outcome) -> String {
    match o {
        Outcome::Retry { reason, .. } => reason,
        other => panic!("expected a retry, got {other:?}"),
    }
}

fn poison_reason(o: Outcome) -> String {
    match o {
        Outcome::Poison { reason } => reason,
        other => panic!("expected poison, got {other:?}"),
    }
}

// ---------------------------------------------------------------- jsonl

#[test]
fn jsonl_appends_one_parseable_line_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let a = delivery(r#"{"id":1,"text":"line\nbreak"}"#);
    let b = delivery(r#"[1,2,3]"#);
    {
        let sink = JsonlSink::file(&path, true).unwrap();
        assert_eq!(sink.deliver(&a), Outcome::Delivered);
    }
    // Reopening appends.
    let sink = JsonlSink::file(&path, false).unwrap();
    assert_eq!(sink.deliver(&b), Outcome::Delivered);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        serde_json::from_str::<Envelope>(lines[0]).unwrap(),
        a.envelope
    );
    assert_eq!(
        serde_json::from_str::<Envelope>(lines[1]).unwrap(),
        b.envelope
    );
    assert!(text.ends_with('\n'));
}

/// Payloads as a foreign producer may store them: pretty-printed, with
/// "\n" escaped inside strings, with a raw U+2028 and U+0085, with a number
/// no f64 holds.
const AWKWARD_PAYLOADS: [&str; 3] = [
    "{\n  \"title\": \"Hello\",\n  \"tags\": [\n    \"a\",\n    \"b\"\n  ]\n}\n",
    "{\"text\": \"line one\\nline two\",\r\n\t\"sep\": \"x\u{2028}y\u{2029}z\u{85}\"}",
    "[ 1, 2.50, 123456789012345678901234567890 ]",
];

/// Splits as the most eager line readers do (Python's str.splitlines).
fn eager_lines(text: &str) -> Vec<&str> {
    text.split([
        '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
        '\u{2029}',
    ])
    .filter(|l| !l.is_empty())
    .collect()
}

#[test]
fn jsonl_writes_one_line_per_event_whatever_the_payload_whitespace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let sink = JsonlSink::file(&path, false).unwrap();
    let deliveries: Vec<Delivery> = AWKWARD_PAYLOADS.iter().map(|p| delivery(p)).collect();
    for d in &deliveries {
        assert_eq!(sink.deliver(d), Outcome::Delivered);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let lines = eager_lines(&text);
    assert_eq!(lines.len(), deliveries.len(), "{text}");
    for (line, d) in lines.iter().zip(&deliveries) {
        let got: Envelope = serde_json::from_str(line).expect("each line is an envelope");
        assert_eq!(got.event_id, d.envelope.event_id);
        // The same JSON value; the big number digit for digit.
        let want: serde_json::Value = serde_json::from_str(d.envelope.payload.get()).unwrap();
        let have: serde_json::Value = serde_json::from_str(got.payload.get()).unwrap();
        assert_eq!(have, want);
    }
    assert!(text.contains(",123456789012345678901234567890]"), "{text}");
    assert!(text.contains(r#""line one\nline two""#), "{text}");
    assert!(text.contains(r#""x\u2028y\u2029z\u0085""#), "{text}");
}

#[test]
fn jsonl_delivery_fields_add_the_tenant_and_the_legacy_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let sink = JsonlSink::file(&path, false).unwrap().delivery_fields(true);
    let mut a = delivery(AWKWARD_PAYLOADS[0]);
    a.tenant_id = Some("acme\u{2028}x".into());
    let mut b = delivery("1");
    b.tenant_id = None;
    b.legacy = true;
    assert_eq!(sink.deliver(&a), Outcome::Delivered);
    assert_eq!(sink.deliver(&b), Outcome::Delivered);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines = eager_lines(&text);
    assert_eq!(lines.len(), 2, "{text}");
    let a_line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(a_line["tenant_id"], "acme\u{2028}x");
    assert_eq!(a_line["legacy"], false);
    assert_eq!(a_line["event_id"], a.envelope.event_id.to_string());
    assert_eq!(a_line["payload"]["tags"][1], "b");
    let b_line: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(b_line["tenant_id"], serde_json::Value::Null);
    assert_eq!(b_line["legacy"], true);
    // After the envelope's own fields, which come first and unchanged.
    assert!(lines[1].starts_with(&b.envelope.to_json()[..b.envelope.to_json().len() - 1]));
    assert!(
        lines[1].ends_with(r#","tenant_id":null,"legacy":true}"#),
        "{}",
        lines[1]
    );
}

#[test]
fn jsonl_lines_never_interleave_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let sink = Arc::new(JsonlSink::file(&path, false).unwrap());
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(20_000));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let sink = Arc::clone(&sink);
            let d = delivery(&big);
            thread::spawn(move || {
                for _ in 0..30 {
                    assert_eq!(sink.deliver(&d), Outcome::Delivered);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let mut n = 0;
    for line in text.lines() {
        serde_json::from_str::<Envelope>(line).expect("every line is a whole envelope");
        n += 1;
    }
    assert_eq!(n, 180);
}

#[test]
fn jsonl_write_errors_are_retries() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    if Path::new("/dev/full").exists() {
        let sink = JsonlSink::file("/dev/full", true).unwrap();
        let reason = retry_reason(sink.deliver(&delivery("1")));
        assert!(reason.contains("/dev/full"), "{reason}");
        assert!(reason.to_lowercase().contains("space"), "{reason}");
    }
    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("the pipe is gone"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let reason = retry_reason(JsonlSink::to_writer(Broken).deliver(&delivery("1")));
    assert!(reason.contains("the pipe is gone"), "{reason}");

    let err = JsonlSink::file("/no/such/dir/events.jsonl", false).unwrap_err();
    assert!(
        err.to_string().contains("/no/such/dir/events.jsonl"),
        "{err}"
    );
}

/// The event ids of the lines in `path`, in order.
fn jsonl_ids(path: &Path) -> Vec<EventId> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Envelope>(l).unwrap().event_id)
        .collect()
}

#[test]
fn jsonl_writes_to_a_new_file_at_the_path_after_a_rotation_by_move() {
    // logrotate without copytruncate: the file is moved away (and later
    // deleted); the next line must go to a new file at the path, not into
    // the moved one and then into nothing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.jsonl");
    let rotated = dir.path().join("q.jsonl.1");
    let sink = JsonlSink::file(&path, true).unwrap();
    let (a, b, c) = (delivery("1"), delivery("2"), delivery("3"));
    assert_eq!(sink.deliver(&a), Outcome::Delivered);
    std::fs::rename(&path, &rotated).unwrap();
    assert_eq!(sink.deliver(&b), Outcome::Delivered);
    assert_eq!(jsonl_ids(&rotated), [a.envelope.event_id]);
    assert_eq!(jsonl_ids(&path), [b.envelope.event_id]);
    std::fs::remove_file(&rotated).unwrap();
    assert_eq!(sink.deliver(&c), Outcome::Delivered);
    assert_eq!(jsonl_ids(&path), [b.envelope.event_id, c.envelope.event_id]);
}

#[test]
fn jsonl_recreates_a_deleted_file_and_appends_to_a_replaced_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let sink = JsonlSink::file(&path, false).unwrap();
    let (a, b, c) = (delivery("1"), delivery("2"), delivery("3"));
    assert_eq!(sink.deliver(&a), Outcome::Delivered);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(sink.deliver(&b), Outcome::Delivered);
    assert_eq!(jsonl_ids(&path), [b.envelope.event_id]);
    // Created as at the start: mode 0666 less the umask, as the first one.
    let first = std::fs::metadata(&path).unwrap().permissions().mode();
    std::fs::remove_file(&path).unwrap();
    drop(JsonlSink::file(&path, false).unwrap());
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode(),
        first
    );

    // Another file moved into place is appended to, never truncated.
    let other = dir.path().join("other");
    std::fs::write(&other, format!("{}\n", a.envelope.to_json())).unwrap();
    std::fs::rename(&other, &path).unwrap();
    assert_eq!(sink.deliver(&c), Outcome::Delivered);
    assert_eq!(jsonl_ids(&path), [a.envelope.event_id, c.envelope.event_id]);
}

#[test]
fn jsonl_retries_while_the_directory_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("log");
    std::fs::create_dir(&sub).unwrap();
    let path = sub.join("events.jsonl");
    let sink = JsonlSink::file(&path, true).unwrap();
    let (a, b) = (delivery("1"), delivery("2"));
    assert_eq!(sink.deliver(&a), Outcome::Delivered);
    std::fs::remove_dir_all(&sub).unwrap();
    let reason = retry_reason(sink.deliver(&b));
    assert!(reason.contains(&*path.to_string_lossy()), "{reason}");
    assert!(reason.contains("directory must exist"), "{reason}");
    // Once the directory is back, the retry writes the line there.
    std::fs::create_dir(&sub).unwrap();
    assert_eq!(sink.deliver(&b), Outcome::Delivered);
    assert_eq!(jsonl_ids(&path), [b.envelope.event_id]);
}

// ---------------------------------------------------------------- command

/// A shell script run as `/bin/sh <script>`: the shell is the program under
/// test here, never part of the sink. (Running the script through sh rather
/// than exec'ing it avoids ETXTBSY when another test thread forks while the
/// file is still open for writing.)
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    path
}

fn sh_sink(dir: &Path, name: &str, body: &str) -> CommandSink {
    let path = script(dir, name, body);
    CommandSink::new("/bin/sh", [path]).unwrap().env("OUT", dir)
}

#[test]
fn command_exit_0_delivers_with_stdin_and_env() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(
        dir.path(),
        "ok.sh",
        r#"cat > "$OUT/stdin.json"
env | grep '^OUTBOXD_' | sort > "$OUT/env"
echo "${OUTBOXD_CAUSATION_ID-unset}" > "$OUT/causation""#,
    );
    let d = delivery(r#"{"id":7}"#);
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    let stdin = std::fs::read_to_string(dir.path().join("stdin.json")).unwrap();
    assert_eq!(stdin, d.envelope.to_json());
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    for expected in [
        format!("OUTBOXD_EVENT_ID={}", d.envelope.event_id),
        "OUTBOXD_EVENT_TYPE=article.created.v1".into(),
        "OUTBOXD_EVENT_VERSION=1".into(),
        "OUTBOXD_CORRELATION_ID=req-42".into(),
        "OUTBOXD_OCCURRED_AT=2026-11-30T07:18:00.123Z".into(),
        "OUTBOXD_ATTEMPT=3".into(),
        "OUTBOXD_CONSUMER=indexer".into(),
        "OUTBOXD_TENANT_ID=acme".into(),
    ] {
        assert!(env.lines().any(|l| l == expected), "{expected} in\n{env}");
    }
    assert!(!env.contains("OUTBOXD_LEGACY"), "{env}");
    let causation = std::fs::read_to_string(dir.path().join("causation")).unwrap();
    assert_eq!(causation.trim(), "unset");

    // The payload's bytes reach stdin as they were stored, whitespace and all.
    let d = delivery(AWKWARD_PAYLOADS[1]);
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    let stdin = std::fs::read_to_string(dir.path().join("stdin.json")).unwrap();
    assert!(stdin.contains(AWKWARD_PAYLOADS[1]), "{stdin}");
}

#[test]
fn command_environment_can_drop_inherited_variables() {
    // The test process's own environment is what the child inherits: this
    // test runs again in a process of its own with these variables set.
    let vars = [
        ("SINKS_TEST_HIDDEN_SECRET", "hidden-value-1"),
        ("SINKS_TEST_PLAIN", "plain-value"),
    ];
    let name = "command_environment_can_drop_inherited_variables";
    if !common::in_child_with_env(module_path!(), name, &vars) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "env.sh", r#"env > "$OUT/env""#)
        .env_remove(["SINKS_TEST_HIDDEN_SECRET", "SINKS_TEST_NOT_SET"])
        .env("SINKS_TEST_EXPLICIT", "explicit");
    let mut d = delivery("1");
    d.legacy = true;
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    assert!(!env.contains("hidden-value-1"), "{env}");
    assert!(
        env.lines().any(|l| l == "SINKS_TEST_PLAIN=plain-value"),
        "{env}"
    );
    assert!(
        env.lines().any(|l| l == "SINKS_TEST_EXPLICIT=explicit"),
        "{env}"
    );
    assert!(env.lines().any(|l| l == "OUTBOXD_LEGACY=true"), "{env}");
}

#[test]
fn command_stderr_cannot_start_a_line_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(
        dir.path(),
        "forge.sh",
        r#"printf 'oops\n2030-01-01T00:00:00.000000Z  INFO outboxd: all delivered\r\n\033[2Kclean\342\200\250x' >&2; exit 1"#,
    );
    let reason = retry_reason(sink.deliver(&delivery("1")));
    assert!(
        !reason.contains(['\n', '\r', '\u{1b}', '\u{2028}']),
        "{reason:?}"
    );
    assert!(
        reason.contains(r"oops\n2030-01-01T00:00:00.000000Z  INFO outboxd: all delivered\r\n\u{1b}[2Kclean\u{2028}x"),
        "{reason}"
    );
}

#[test]
fn command_failure_is_a_retry_with_the_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "fail.sh", "echo 'boom: db down' >&2; exit 1");
    let reason = retry_reason(sink.deliver(&delivery("1")));
    assert!(reason.contains("exited with status 1"), "{reason}");
    assert!(reason.contains("boom: db down"), "{reason}");

    // Only the last 2 KiB of a long stderr is kept.
    let sink = sh_sink(
        dir.path(),
        "noisy.sh",
        "echo FIRST >&2; head -c 100000 /dev/zero | tr '\\0' x >&2; echo ' THE END' >&2; exit 3",
    );
    let reason = retry_reason(sink.deliver(&delivery("1")));
    assert!(reason.contains("exited with status 3"), "{reason}");
    assert!(reason.ends_with("THE END"), "{reason}");
    assert!(!reason.contains("FIRST"), "{reason}");
    assert!(reason.len() < 2048 + 200, "{} bytes", reason.len());
}

#[test]
fn command_poison_code_is_poison() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "bad.sh", "echo 'not an article' >&2; exit 65");
    let reason = poison_reason(sink.deliver(&delivery("1")));
    assert!(reason.contains("status 65"), "{reason}");
    assert!(reason.contains("not an article"), "{reason}");

    // Another poison code: 65 becomes an ordinary failure.
    let sink = sh_sink(dir.path(), "bad2.sh", "exit \"$CODE\"").poison_exit_code(3);
    let sink = sink.env("CODE", "65");
    assert!(matches!(
        sink.deliver(&delivery("1")),
        Outcome::Retry { .. }
    ));
    let sink = sh_sink(dir.path(), "bad3.sh", "exit 3").poison_exit_code(3);
    assert!(matches!(
        sink.deliver(&delivery("1")),
        Outcome::Poison { .. }
    ));
}

/// True once `pid` is gone or a zombie.
fn process_is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn command_timeout_kills_the_program_and_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(
        dir.path(),
        "hang.sh",
        r#"sleep 60 &
echo $! > "$OUT/grandchild.pid"
echo 'still working' >&2
wait"#,
    )
    .timeout(Duration::from_millis(700));
    let started = Instant::now();
    let reason = retry_reason(sink.deliver(&delivery("1")));
    let took = started.elapsed();
    assert!(reason.contains("timed out after 700ms"), "{reason}");
    assert!(reason.contains("still working"), "{reason}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let pid: u32 = std::fs::read_to_string(dir.path().join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_is_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "sleep {pid} outlived the timeout"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn command_flooding_stdout_or_ignoring_stdin_does_not_block() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "flood.sh", "head -c 50000000 /dev/zero")
        .timeout(Duration::from_secs(60));
    assert_eq!(sink.deliver(&delivery("1")), Outcome::Delivered);

    // A payload far larger than a pipe buffer, to a program that never reads.
    let big = format!(r#"{{"blob":"{}"}}"#, "y".repeat(4 << 20));
    let sink = sh_sink(dir.path(), "deaf.sh", "exit 0").timeout(Duration::from_secs(60));
    assert_eq!(sink.deliver(&delivery(&big)), Outcome::Delivered);
}

#[test]
fn command_refuses_values_an_environment_cannot_carry() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "never.sh", "touch \"$OUT/ran\"");
    let mut d = delivery("1");
    d.envelope.causation_id = Some("cmd\0-1".into());
    let reason = poison_reason(sink.deliver(&d));
    assert!(reason.contains("OUTBOXD_CAUSATION_ID"), "{reason}");
    assert!(!dir.path().join("ran").exists());
}

#[test]
fn command_killed_by_a_signal_is_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sh_sink(dir.path(), "die.sh", "echo dying >&2; kill -KILL $$");
    let reason = retry_reason(sink.deliver(&delivery("1")));
    assert!(reason.contains("killed by signal 9 (SIGKILL)"), "{reason}");
    assert!(reason.contains("dying"), "{reason}");
}

#[test]
fn command_passes_shell_metacharacters_literally() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let nasty = format!(
        "$(touch {m}); `touch {m}` && touch {m} | > * ;",
        m = marker.display()
    );
    let path = script(
        dir.path(),
        "literal.sh",
        r#"printf '%s' "$1" > "$OUT/arg"
cat > "$OUT/stdin.json""#,
    );
    let sink = CommandSink::new("/bin/sh", [path.as_os_str(), nasty.as_ref()])
        .unwrap()
        .env("OUT", dir.path());
    let payload = serde_json::json!({ "cmd": nasty }).to_string();
    let d = delivery(&payload);
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("arg")).unwrap(),
        nasty
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("stdin.json")).unwrap(),
        d.envelope.to_json()
    );
    assert!(
        !marker.exists(),
        "something interpreted the payload as shell"
    );
}

#[test]
fn command_program_is_checked_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let none: [&str; 0] = [];

    let missing = dir.path().join("nope");
    let err = CommandSink::new(&missing, none).unwrap_err();
    assert!(matches!(err, CommandError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains(&missing.display().to_string()));

    let plain = script(dir.path(), "plain.sh", "exit 0");
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = CommandSink::new(&plain, none).unwrap_err();
    assert!(matches!(err, CommandError::NotExecutable { .. }), "{err}");
    assert!(err.to_string().contains("plain.sh"), "{err}");

    let err = CommandSink::new(dir.path(), none).unwrap_err();
    assert!(matches!(err, CommandError::NotAFile { .. }), "{err}");

    let err = CommandSink::new("outboxd-no-such-program-anywhere", none).unwrap_err();
    assert!(matches!(err, CommandError::NotInPath { .. }), "{err}");
    assert!(err.to_string().contains("PATH"), "{err}");

    assert!(matches!(
        CommandSink::new("", none).unwrap_err(),
        CommandError::EmptyProgram
    ));

    // A program and its arguments in one string: the error says to split
    // them, naming the program and the arguments.
    for given in ["/bin/sh -c true", "sh -c true"] {
        let err = CommandSink::new(given, none).unwrap_err();
        assert!(matches!(err, CommandError::WithArguments { .. }), "{err}");
        let shown = err.to_string();
        assert!(
            shown.contains(r#"args = ["-c", "true"]"#) && shown.contains("program = "),
            "{shown}"
        );
    }
    // ... but only when the first word is a program.
    let err = CommandSink::new("/no/such/program --flag", none).unwrap_err();
    assert!(matches!(err, CommandError::NotFound { .. }), "{err}");
    // A path with a space that does exist is simply that program.
    let spaced = script(dir.path(), "with space.sh", "exit 0");
    std::fs::set_permissions(&spaced, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(CommandSink::new(&spaced, none).unwrap().program(), spaced);

    let sh = CommandSink::new("sh", none).unwrap();
    assert!(sh.program().is_absolute(), "{:?}", sh.program());
    assert_eq!(sh.poison_code(), 65);
}

// ---------------------------------------------------------------- webhook

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLD_SECRET: &str = "whsec_cm90YXRlZC1zZWNyZXQtZm9yLXRlc3RzLTAxMjM0NTY=";

#[test]
fn signature_matches_the_standard_webhooks_vector() {
    // The example in the Standard Webhooks spec; recomputed independently with
    //   python3 -c 'import hmac,hashlib,base64; k=base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    //   print(base64.b64encode(hmac.new(k, b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{\"test\": 2432232314}",
    //   hashlib.sha256).digest()).decode())'
    let key = WebhookSecret::parse(SECRET).unwrap();
    let body = br#"{"test": 2432232314}"#;
    let sig = sign(
        key.as_bytes(),
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        body,
    );
    assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");

    let ok = |h: &str| {
        verify(
            key.as_bytes(),
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            h,
        )
    };
    assert_eq!(ok(&sig), Ok(()));
    assert_eq!(ok(&format!("v1,bm9wZQ== {sig}")), Ok(()));
    assert_eq!(ok("v1,bm9wZQ=="), Err(SignatureError::Mismatch));
    assert_eq!(ok("v1a,whatever"), Err(SignatureError::Missing));
    assert_eq!(
        verify(
            key.as_bytes(),
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b"{}",
            &sig
        ),
        Err(SignatureError::Mismatch)
    );
}

/// A webhook receiver answering by path: `/ok` 200, `/500`, `/429` (with
/// Retry-After: 7), `/410`, `/400` (with a 100 kB body), `/302` (to `/ok`),
/// `/echo…` a 500 whose body echoes the request's path and credentials (as
/// some error pages do), `/slow` never; anything else 404.
fn webhook_server() -> Receiver {
    Receiver::start(|req, _| match req.path.as_str() {
        "/ok" => Answer::new("200 OK", "thanks"),
        "/500" => Answer::new("500 Internal Server Error", "database down"),
        "/429" => Answer::new("429 Too Many Requests", "slow down").header("Retry-After", "7"),
        "/410" => Answer::new("410 Gone", "gone for good"),
        "/400" => Answer::new("400 Bad Request", &"e".repeat(100_000)),
        "/302" => Answer::new("302 Found", "").header(
            "Location",
            &format!("http://{}/ok", req.header("host").unwrap_or_default()),
        ),
        p if p.starts_with("/echo") => {
            let echoed: Vec<String> = req
                .headers
                .iter()
                .filter(|(k, _)| k == "authorization" || k == "x-source")
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            Answer::new(
                "500 Internal Server Error",
                &format!("you sent {p} with {echoed:?}"),
            )
        }
        "/slow" => Answer::Hang,
        _ => Answer::new("404 Not Found", ""),
    })
}

fn sink(url: &str) -> WebhookSink {
    WebhookSink::builder(url)
        .secret(SECRET)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[test]
fn webhook_2xx_delivers_a_signed_request() {
    let server = webhook_server();
    let sink = WebhookSink::builder(server.url("/ok"))
        .secret(OLD_SECRET)
        .secret(SECRET)
        .header("x-tenant", "acme")
        .build()
        .unwrap();
    let d = delivery(r#"{"id":7}"#);
    assert_eq!(sink.deliver(&d), Outcome::Delivered);

    let req = server.next();
    assert_eq!(req.path, "/ok");
    assert_eq!(req.body, d.envelope.to_json().as_bytes());
    let id = req.header("webhook-id").unwrap();
    assert_eq!(id, d.envelope.event_id.to_string());
    let ts: i64 = req.header("webhook-timestamp").unwrap().parse().unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now - ts).abs() < 60, "timestamp {ts}, now {now}");
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("x-tenant"), Some("acme"));
    assert_eq!(req.header("outboxd-tenant-id"), Some("acme"));
    assert_eq!(req.header("outboxd-legacy"), None);
    let sigs = req.header("webhook-signature").unwrap();
    assert_eq!(sigs.split(' ').count(), 2, "{sigs}");
    for secret in [SECRET, OLD_SECRET] {
        let key = WebhookSecret::parse(secret).unwrap();
        assert_eq!(verify(key.as_bytes(), id, ts, &req.body, sigs), Ok(()));
    }
    assert_eq!(
        verify(b"another key entirely", id, ts, &req.body, sigs),
        Err(SignatureError::Mismatch)
    );

    // Independently, with Python's hmac when it is installed.
    if let Ok(out) = std::process::Command::new("python3")
        .args([
            "-c",
            "import hmac,hashlib,base64,sys; k=base64.b64decode(sys.argv[1]); \
             m=(sys.argv[2]+'.'+sys.argv[3]+'.').encode()+sys.stdin.buffer.read(); \
             print('v1,'+base64.b64encode(hmac.new(k,m,hashlib.sha256).digest()).decode())",
            SECRET.strip_prefix("whsec_").unwrap(),
            id,
            &ts.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(&req.body)?;
            child.wait_with_output()
        })
    {
        let expected = String::from_utf8(out.stdout).unwrap();
        assert!(
            sigs.split(' ').any(|s| s == expected.trim()),
            "python says {expected}, we sent {sigs}"
        );
    }
}

#[test]
fn webhook_carries_the_tenant_and_the_legacy_flag_in_headers_not_the_body() {
    let server = webhook_server();
    let sink = sink(&server.url("/ok"));
    let mut d = delivery(AWKWARD_PAYLOADS[0]);
    d.tenant_id = Some("a b/é%".into());
    d.ordering_key = Some("cms_page:42 é".into());
    d.legacy = true;
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    let req = server.next();
    assert_eq!(req.header("outboxd-tenant-id"), Some("a%20b%2F%C3%A9%25"));
    assert_eq!(
        req.header("outboxd-ordering-key"),
        Some("cms_page%3A42%20%C3%A9")
    );
    assert_eq!(req.header("outboxd-legacy"), Some("true"));
    // The body is the envelope as ever, the payload's bytes as stored.
    assert_eq!(req.body, d.envelope.to_json().as_bytes());
    assert!(String::from_utf8_lossy(&req.body).contains(AWKWARD_PAYLOADS[0].trim_end()));

    d.tenant_id = None;
    d.ordering_key = None;
    d.legacy = false;
    assert_eq!(sink.deliver(&d), Outcome::Delivered);
    let req = server.next();
    assert_eq!(req.header("outboxd-tenant-id"), None);
    assert_eq!(req.header("outboxd-ordering-key"), None);
    assert_eq!(req.header("outboxd-legacy"), None);

    // They are the sink's own headers.
    let err = WebhookSink::builder(server.url("/ok"))
        .secret(SECRET)
        .header("outboxd-tenant-id", "x")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("sets this header itself"), "{err}");
}

#[test]
fn webhook_reasons_never_carry_configured_secrets() {
    let server = webhook_server();
    let sink = WebhookSink::builder(server.url("/echo?token=Qry7Tok3nValue"))
        .secret(SECRET)
        .header("authorization", "Bearer H3aderT0kenValue")
        .header("x-source", "outboxd-test")
        .build()
        .unwrap();
    let reason = retry_reason(sink.deliver(&delivery("1")));
    let req = server.next();
    // The receiver did get them, and echoed them back.
    assert_eq!(req.path, "/echo?token=Qry7Tok3nValue");
    assert!(reason.contains("500"), "{reason}");
    for secret in [
        "Qry7Tok3nValue",
        "H3aderT0kenValue",
        SECRET,
        SECRET.strip_prefix("whsec_").unwrap(),
    ] {
        assert!(!reason.contains(secret), "{secret} in {reason}");
    }
    assert!(reason.contains("outboxd-test"), "{reason}");
    assert!(reason.contains("<redacted>"), "{reason}");
}

#[test]
fn webhook_schedule_in_the_docs_is_the_codes() {
    // README.md and the example config state the webhook consumers' default
    // schedule; they must say what RetryPolicy::webhook() does.
    let p = outboxd::RetryPolicy::webhook();
    let total: Duration = (1..p.attempts()).map(|n| p.delay_after(n).unwrap()).sum();
    let most: Duration = (1..p.attempts())
        .map(|n| p.delay_with_jitter(n, 1.0).unwrap())
        .sum();
    let days = |d: Duration| format!("{:.1}", d.as_secs_f64() / 86_400.0);
    assert_eq!((days(total).as_str(), days(most).as_str()), ("5.2", "5.7"));
    for (doc, text) in [
        ("README.md", include_str!("../../README.md")),
        (
            "packaging/outboxd.example.toml",
            include_str!("../../packaging/outboxd.example.toml"),
        ),
    ] {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            text.contains(&format!("{} days", days(total))) && text.contains(&days(most)),
            "{doc} states another webhook schedule"
        );
        assert!(!text.contains("about 8 days"), "{doc}");
    }
}

#[test]
fn webhook_statuses_map_to_outcomes() {
    let server = webhook_server();

    let reason = retry_reason(sink(&server.url("/500")).deliver(&delivery("1")));
    assert!(
        reason.contains("500") && reason.contains("database down"),
        "{reason}"
    );

    match sink(&server.url("/429")).deliver(&delivery("1")) {
        Outcome::Unavailable { reason, after } => {
            assert_eq!(after, Some(Duration::from_secs(7)));
            assert!(reason.contains("429"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    let reason = poison_reason(sink(&server.url("/410")).deliver(&delivery("1")));
    assert!(
        reason.contains("410") && reason.contains("gone for good"),
        "{reason}"
    );

    let reason = poison_reason(sink(&server.url("/400")).deliver(&delivery("1")));
    assert!(reason.contains("400"), "{reason}");
    assert!(
        reason.len() < 1024,
        "the body snippet is bounded: {}",
        reason.len()
    );

    let reason = poison_reason(sink(&server.url("/302")).deliver(&delivery("1")));
    assert!(
        reason.contains(&format!("Location: {}", server.url("/ok"))),
        "{reason}"
    );
    // Exactly the five requests above reached the server: the redirect was
    // not followed.
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/500", "/429", "/410", "/400", "/302"]);
}

#[test]
fn webhook_timeouts_are_retries_and_a_closed_port_is_unavailable() {
    let server = webhook_server();
    let slow = WebhookSink::builder(server.url("/slow"))
        .secret(SECRET)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    // The receiver never answers (it drops the connection after a minute):
    // "timed out" is the sink's own 500 ms limit.
    let reason = retry_reason(slow.deliver(&delivery("1")));
    assert!(reason.contains("timed out"), "{reason}");

    // A port nobody listens on.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    match sink(&format!("http://{closed}/")).deliver(&delivery("1")) {
        Outcome::Unavailable { reason, .. } => assert!(reason.contains("cannot POST"), "{reason}"),
        other => panic!("expected an unavailable receiver, got {other:?}"),
    }
}

#[test]
fn webhook_private_address_guard() {
    // A URL that names a non-public address is refused when the sink is
    // built, so check-config and start-up report it (the guard on resolved
    // addresses at each delivery is unit-tested in src/sinks/webhook.rs).
    let server = webhook_server();
    let port = server.addr.port();
    for url in [
        format!("http://127.0.0.1:{port}/ok"),
        format!("http://localhost:{port}/ok"),
        format!("http://[::ffff:127.0.0.1]:{port}/ok"),
        format!("http://[::1]:{port}/ok?token=abcdef"),
        "https://10.1.2.3/hook".to_string(),
    ] {
        let err = WebhookSink::builder(&url)
            .secret(SECRET)
            .deny_private_addresses(true)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, outboxd::sinks::WebhookError::PrivateAddress { .. }),
            "{url}: {err}"
        );
        let shown = err.to_string();
        assert!(shown.contains("deny_private_addresses"), "{shown}");
        assert!(!shown.contains("abcdef"), "{shown}");
    }
    // A public name is accepted: it is checked when it resolves.
    assert!(WebhookSink::builder("https://example.com/hook")
        .secret(SECRET)
        .deny_private_addresses(true)
        .build()
        .is_ok());
    // Without the guard the same server is reached, and it is the first
    // request it sees.
    assert_eq!(
        sink(&server.url("/ok")).deliver(&delivery("1")),
        Outcome::Delivered
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/ok"]);
}
