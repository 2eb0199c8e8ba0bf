//! The sinks through the real binary: what reaches the log, the consumers'
//! environment and stdout when `outboxd run` delivers.
//!
//! - no log level, in either format, prints a configured secret;
//! - a command consumer inherits none of the variables outboxd reads a
//!   secret from;
//! - a command's stderr cannot forge a log line;
//! - `outboxd run` writes one JSON line per event whatever the payload's
//!   whitespace;
//! - check-config refuses a loopback URL under deny_private_addresses and a
//!   program written with its arguments;
//! - a sql sink binds every named parameter from the delivery, and a
//!   constraint failure dead-letters the event with nothing written.
//!
//! Synchronisation is by bounded polling of the database; never by fixed
//! sleeps.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::bin::{code, Outboxd, Running, Sandbox, WAIT};
use common::http::{Answer, Receiver};
use common::{wait_until, TestDb};
use outboxd::{Event, EventId};

/// The planted secrets. Each is long enough that a hex dump cutting it into
/// 16-byte rows still shows an 8-byte piece of it whole (see `leaks`).
const QUERY_TOKEN: &str = "QrySecret7xKq2mWz9pLvB4nT";
const HEADER_TOKEN: &str = "HdrSecret4Vb8Nc1Xz6Qw3Ek";
const WEBHOOK_SECRET: &str = "whsec_RTJlV2ViaG9va1NpZ25pbmdLZXktWnE4MUxwMFh2";
const WEBHOOK_KEY: &str = "E2eWebhookSigningKey-Zq81Lp0Xv";
const OLD_WEBHOOK_SECRET: &str = "whsec_RTJlT2xkU2lnbmluZ0tleUZvclJvdGF0aW9uLTc3";
const OLD_WEBHOOK_KEY: &str = "E2eOldSigningKeyForRotation-77";
const SECRET_VAR: &str = "E2E_HOOK_SECRET";
const OLD_SECRET_VAR: &str = "E2E_HOOK_OLD_SECRET";
/// The console's tokens: one named by `[http] token_env`, one by
/// `--http-token-env` (no console is served; the variables are secrets all
/// the same).
const HTTP_TOKEN: &str = "HttpConsoleToken-Jk29Pq7Lm3";
const HTTP_TOKEN_VAR: &str = "E2E_HTTP_TOKEN";
const CLI_HTTP_TOKEN: &str = "CliConsoleToken-Rt58Wx1Zc6";
const CLI_HTTP_TOKEN_VAR: &str = "E2E_CLI_HTTP_TOKEN";

fn secrets() -> Vec<&'static str> {
    vec![
        QUERY_TOKEN,
        HEADER_TOKEN,
        WEBHOOK_SECRET,
        WEBHOOK_SECRET.strip_prefix("whsec_").unwrap(),
        WEBHOOK_KEY,
        OLD_WEBHOOK_SECRET,
        OLD_WEBHOOK_SECRET.strip_prefix("whsec_").unwrap(),
        OLD_WEBHOOK_KEY,
        HTTP_TOKEN,
        CLI_HTTP_TOKEN,
    ]
}

/// The first 8-byte piece of a secret that `text` holds, if any: a secret
/// printed whole, or cut into the rows of a hex dump, or wrapped.
fn leaks(text: &str, secret: &str) -> Option<String> {
    let bytes = secret.as_bytes();
    bytes
        .windows(8)
        .map(|w| std::str::from_utf8(w).unwrap())
        .find(|piece| text.contains(piece))
        .map(str::to_string)
}

// ---------------------------------------------------------------------------
// Helpers.

/// `outboxd --db DB ARGS`, in the database's directory (tests/common/bin.rs).
fn outboxd(db: &TestDb, args: &[&str]) -> Command {
    Outboxd::on(&db.path).command(args)
}

/// Runs `cmd` (an `outboxd run`) until `done` holds, then stops it with
/// SIGTERM and expects a clean exit; (stdout, stderr).
fn run_until(mut cmd: Command, what: &str, mut done: impl FnMut() -> bool) -> (String, String) {
    let mut run = Running::spawn(&mut cmd);
    wait_until(what, WAIT, || {
        run.assert_alive();
        done()
    });
    let status = run.stop();
    assert!(status.success(), "{status}:\n{}", run.stderr());
    (run.stdout(), run.stderr())
}

fn enqueue_one(db: &TestDb) -> EventId {
    let event = Event::new("article.created.v1", &serde_json::json!({"id": 1}))
        .unwrap()
        .tenant("acme");
    db.enqueue(&[event])[0]
}

fn status_of(db: &TestDb, id: EventId) -> String {
    db.scalar(&format!(
        "SELECT status FROM event_outbox WHERE event_id = '{id}'"
    ))
}

/// A receiver that fails each event's first request with a 500 whose body
/// echoes the request's path and authorization header (as some error pages
/// do), and accepts the second.
fn echo_receiver() -> Receiver {
    Receiver::start(|req, earlier| {
        let id = req.header("webhook-id");
        if earlier.iter().any(|e| e.header("webhook-id") == id) {
            return Answer::new("200 OK", "ok");
        }
        Answer::new(
            "500 Internal Server Error",
            &format!(
                "cannot handle POST {} (authorization: {})",
                req.path,
                req.header("authorization").unwrap_or_default()
            ),
        )
    })
}

/// A config with a webhook consumer carrying every planted secret and a
/// command consumer that dumps its environment to a file and, on its first
/// attempt, to stderr (so a secret it inherited would reach the log too).
/// Both fail once and succeed on the retry 100 ms later.
fn secrets_config(db: &Sandbox, receiver: &Receiver) -> PathBuf {
    let dump = db.script(
        "dump-env.sh",
        r#"env > "$OUT/env-$OUTBOXD_ATTEMPT"
if [ "$OUTBOXD_ATTEMPT" = 1 ]; then env >&2; exit 1; fi"#,
    );
    let toml = format!(
        r#"[http]
token_env = "{HTTP_TOKEN_VAR}"

[[consumer]]
name = "hook"
types = ["*"]
retry = {{ initial = "100ms", max_attempts = 2 }}
[consumer.sink]
kind = "webhook"
url = "http://{addr}/hook?token={QUERY_TOKEN}"
secrets_env = ["{SECRET_VAR}", "{OLD_SECRET_VAR}"]
headers = {{ authorization = "Bearer {HEADER_TOKEN}", x-source = "e2e" }}

[[consumer]]
name = "dump"
types = ["*"]
retry = {{ initial = "100ms", max_attempts = 2 }}
[consumer.sink]
kind = "command"
program = "{dump}"
env = {{ OUT = "{out}" }}
"#,
        addr = receiver.addr,
        dump = dump.display(),
        out = db.dir.path().display(),
    );
    db.write("outboxd.toml", &toml)
}

/// `outboxd run` with the secrets config until the event is delivered to
/// both consumers; (stdout, stderr).
fn run_until_delivered(db: &TestDb, config: &Path, log_args: &[&str]) -> (String, String) {
    let id = enqueue_one(db);
    let mut args = log_args.to_vec();
    args.extend(["run", "--config", config.to_str().unwrap()]);
    args.extend(["--http-token-env", CLI_HTTP_TOKEN_VAR]);
    let mut cmd = outboxd(db, &args);
    cmd.env(SECRET_VAR, WEBHOOK_SECRET)
        .env(OLD_SECRET_VAR, OLD_WEBHOOK_SECRET)
        .env(HTTP_TOKEN_VAR, HTTP_TOKEN)
        .env(CLI_HTTP_TOKEN_VAR, CLI_HTTP_TOKEN)
        .env("E2E_PLAIN", "plain-value");
    run_until(cmd, "the event to be delivered to both consumers", || {
        status_of(db, id) == "delivered"
    })
}

// ---------------------------------------------------------------------------
// Secrets.

#[test]
fn no_log_level_in_either_format_prints_a_secret() {
    let receiver = echo_receiver();
    for format in ["text", "json"] {
        for level in ["error", "warn", "info", "debug", "trace"] {
            let db = Sandbox::migrated();
            let config = secrets_config(&db, &receiver);
            let (stdout, stderr) = run_until_delivered(
                &db,
                &config,
                &["--log-level", level, "--log-format", format],
            );
            let output = format!("{stdout}{stderr}");
            for secret in secrets() {
                if let Some(piece) = leaks(&output, secret) {
                    panic!(
                        "--log-level {level} --log-format {format}: {piece:?} of a secret \
                         is in the output:\n{output}"
                    );
                }
            }
            // The runs did log what could leak: the receiver's echo of the
            // request in the retry reason from warn on, the HTTP client's
            // own lines (redacted by it up to debug) from debug on.
            if level != "error" {
                assert!(output.contains("cannot handle POST"), "{level}:\n{output}");
                assert!(output.contains("<redacted>"), "{level}:\n{output}");
            }
            if matches!(level, "debug" | "trace") {
                assert!(output.contains("ureq"), "{level}:\n{output}");
            }
        }
    }
}

#[test]
fn command_consumers_inherit_no_variable_outboxd_reads_a_secret_from() {
    let receiver = echo_receiver();
    let db = Sandbox::migrated();
    let config = secrets_config(&db, &receiver);
    run_until_delivered(&db, &config, &[]);
    for attempt in [1, 2] {
        let env = std::fs::read_to_string(db.file(&format!("env-{attempt}"))).unwrap();
        for var in [
            SECRET_VAR,
            OLD_SECRET_VAR,
            HTTP_TOKEN_VAR,
            CLI_HTTP_TOKEN_VAR,
        ] {
            assert!(
                !env.lines().any(|l| l.starts_with(&format!("{var}="))),
                "{var} in\n{env}"
            );
        }
        for secret in secrets() {
            assert!(leaks(&env, secret).is_none(), "{secret} in\n{env}");
        }
        // The rest of the environment is inherited as before.
        assert!(env.lines().any(|l| l == "E2E_PLAIN=plain-value"), "{env}");
        assert!(env.lines().any(|l| l == "OUTBOXD_TENANT_ID=acme"), "{env}");
    }
}

// ---------------------------------------------------------------------------
// Shutdown.

/// The pid written into `file`, once it is there whole.
fn pid_in(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.strip_suffix('\n')?.parse().ok()
}

/// True while `pid` is a process that has not ended (a zombie has).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

#[test]
fn a_command_running_past_the_shutdown_grace_is_killed_with_what_it_started() {
    let db = Sandbox::migrated();
    // A program that hangs, with a process of its own in the background.
    let hang = db.script(
        "hang.sh",
        r#"sleep 300 &
echo $! > "$OUT/grandchild.tmp" && mv "$OUT/grandchild.tmp" "$OUT/grandchild"
echo $$ > "$OUT/child.tmp" && mv "$OUT/child.tmp" "$OUT/child"
wait"#,
    );
    let config = db.write(
        "outboxd.toml",
        &format!(
            r#"[relay]
lease = "5m"
[[consumer]]
name = "hang"
types = ["*"]
[consumer.sink]
kind = "command"
program = "{}"
timeout = "4m"
env = {{ OUT = "{}" }}
"#,
            hang.display(),
            db.dir.path().display()
        ),
    );
    let id = enqueue_one(&db);
    let mut cmd = outboxd(
        &db,
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--shutdown-grace",
            "200ms",
        ],
    );
    let mut run = Running::spawn(&mut cmd);
    let (child, grandchild) = (db.file("child"), db.file("grandchild"));
    wait_until("the program to start", WAIT, || {
        run.assert_alive();
        pid_in(&child).is_some() && pid_in(&grandchild).is_some()
    });
    let pids = [pid_in(&child).unwrap(), pid_in(&grandchild).unwrap()];
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    run.signal("-TERM");
    let status = run.wait(WAIT);
    assert!(status.success(), "{status}:\n{}", run.stderr());
    // The program and its background process end with outboxd, rather
    // than run on beside the next relay's delivery of the same event.
    wait_until("the program and what it started to be killed", WAIT, || {
        pids.iter().all(|&p| !alive(p))
    });
    assert!(
        run.stderr().contains("killed command sink programs"),
        "{}",
        run.stderr()
    );
    // Its row was given back, to be delivered again.
    assert_eq!(status_of(&db, id), "pending");
}

// ---------------------------------------------------------------------------
// Log lines.

#[test]
fn a_command_cannot_forge_a_log_line() {
    let db = Sandbox::migrated();
    let forger = db.script(
        "forge.sh",
        r#"printf 'oops\n2030-01-01T00:00:00.000000Z  INFO outboxd: FORGED all delivered\r\n' >&2
exit 1"#,
    );
    let config = db.write(
        "outboxd.toml",
        &format!(
            r#"[[consumer]]
name = "forger"
types = ["*"]
retry = {{ max_attempts = 1 }}
[consumer.sink]
kind = "command"
program = "{}"
"#,
            forger.display()
        ),
    );
    let id = enqueue_one(&db);
    let args = [
        "--log-format",
        "text",
        "run",
        "--config",
        config.to_str().unwrap(),
    ];
    let (_, stderr) = run_until(outboxd(&db, &args), "the event to be dead-lettered", || {
        status_of(&db, id) == "dead"
    });
    let forged: Vec<&str> = stderr.lines().filter(|l| l.contains("FORGED")).collect();
    assert!(!forged.is_empty(), "the reason is logged:\n{stderr}");
    for line in &forged {
        assert!(!line.starts_with("2030-01-01"), "a forged line:\n{stderr}");
        assert!(
            line.contains(r"oops\n2030-01-01T00:00:00.000000Z  INFO outboxd: FORGED all delivered"),
            "{line}"
        );
    }
    assert!(
        !stderr.lines().any(|l| l.starts_with("2030")),
        "a forged line:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------
// JSON lines.

#[test]
fn run_writes_one_json_line_per_event_whatever_the_payload_whitespace() {
    let db = Sandbox::migrated();
    // Pretty-printed, through the CLI as a user would.
    let pretty = "{\n  \"title\": \"Hello\",\n  \"tags\": [\n    \"a\",\n    \"b\"\n  ],\n  \"n\": 123456789012345678901234567890\n}\n";
    let file = db.write("pretty.json", pretty);
    let out = outboxd(
        &db,
        &[
            "enqueue",
            "--type",
            "article.created.v1",
            "--payload-file",
            file.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A foreign producer's row, by plain SQL: "\n" escaped in a string, and
    // raw line and paragraph separators.
    let foreign = "{\"text\": \"one\\ntwo\",\r\n\t\"sep\": \"x\u{2028}y\u{2029}z\u{85}\"}";
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?1, 'article.updated.v1', ?2)",
            rusqlite::params![EventId::new().to_string(), foreign],
        )
        .unwrap();

    let (stdout, stderr) = run_until(outboxd(&db, &["run"]), "both events delivered", || {
        db.count("status = 'delivered'") == 2
    });
    // Split as eagerly as any reader does (Python's str.splitlines).
    let lines: Vec<&str> = stdout
        .split([
            '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
            '\u{2029}',
        ])
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 2, "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Two workers deliver the two events: either line may come first.
    let mut payloads: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["payload"].clone())
        .collect();
    let mut want: Vec<serde_json::Value> = [pretty, foreign]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    payloads.sort_by_key(|v| v.to_string());
    want.sort_by_key(|v| v.to_string());
    assert_eq!(payloads, want);
    // The big number digit for digit, not as a float.
    assert!(
        stdout.contains("\"n\":123456789012345678901234567890}"),
        "{stdout}"
    );
}

#[test]
fn jsonl_delivery_fields_come_from_the_config() {
    let db = Sandbox::migrated();
    let config = db.write(
        "outboxd.toml",
        r#"[[consumer]]
name = "audit"
types = ["*"]
[consumer.sink]
kind = "jsonl"
path = "out.jsonl"
delivery_fields = true
"#,
    );
    let id = enqueue_one(&db);
    let args = ["run", "--config", config.to_str().unwrap()];
    run_until(outboxd(&db, &args), "the event to be delivered", || {
        status_of(&db, id) == "delivered"
    });
    let text = std::fs::read_to_string(db.file("out.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(line["event_id"], id.to_string());
    assert_eq!(line["tenant_id"], "acme");
    assert_eq!(line["legacy"], false);
}

#[test]
fn a_sql_sink_binds_every_parameter_and_dead_letters_a_constraint_failure() {
    let db = Sandbox::migrated();
    db.conn()
        .execute_batch(
            "CREATE TABLE seen (event_id TEXT, event_type TEXT, event_version INTEGER,
                 tenant_id TEXT, ordering_key TEXT, causation_id TEXT, correlation_id TEXT,
                 occurred_at TEXT, occurred_at_ms INTEGER, title TEXT NOT NULL,
                 envelope_id TEXT, consumer TEXT, attempt INTEGER, legacy INTEGER)",
        )
        .unwrap();
    let config = db.write(
        "sql.toml",
        "[[consumer]]\nname = \"projection\"\ntypes = [\"article.*.v1\"]\n\
         [consumer.sink]\nkind = \"sql\"\nstatements = [\"\"\"\
         INSERT INTO seen VALUES (:event_id, :event_type, :event_version, :tenant_id,
           :ordering_key, :causation_id, :correlation_id, :occurred_at, :occurred_at_ms,
           json_extract(:payload, '$.title'), json_extract(:envelope, '$.event_id'),
           :consumer, :attempt, :legacy)\"\"\"]\n",
    );
    let at: outboxd::Timestamp = "2026-11-30T07:18:00.250Z".parse().unwrap();
    let ids = db.enqueue(&[
        Event::new("article.created.v1", &serde_json::json!({"title": "Hello"}))
            .unwrap()
            .tenant("acme")
            .ordering_key("article:7")
            .causation_id("cmd-1")
            .correlation_id("req-9")
            .occurred_at(at),
        Event::new(
            "article.created.v1",
            &serde_json::json!({"body": "no title"}),
        )
        .unwrap(),
    ]);
    run_until(
        outboxd(&db, &["run", "--config", config.to_str().unwrap()]),
        "both events finished",
        || db.count("status <> 'pending'") == 2,
    );
    let row: Vec<String> = db
        .conn()
        .query_row("SELECT * FROM seen", [], |r| {
            (0..14)
                .map(|i| {
                    r.get::<_, rusqlite::types::Value>(i)
                        .map(|v| format!("{v:?}"))
                })
                .collect()
        })
        .unwrap();
    let id = ids[0].to_string();
    let text = |s: &str| format!("Text({s:?})");
    assert_eq!(
        row,
        [
            text(&id),
            text("article.created.v1"),
            "Integer(1)".into(),
            text("acme"),
            text("article:7"),
            text("cmd-1"),
            text("req-9"),
            text("2026-11-30T07:18:00.250Z"),
            format!("Integer({})", at.as_millis()),
            text("Hello"),
            text(&id),
            text("projection"),
            "Integer(1)".into(),
            "Integer(0)".into(),
        ]
    );
    assert_eq!(status_of(&db, ids[0]), "delivered");
    assert_eq!(status_of(&db, ids[1]), "dead");
    let reason: String = db.scalar(&format!(
        "SELECT last_error FROM event_outbox WHERE event_id = '{}'",
        ids[1]
    ));
    assert!(
        reason.contains("statement 0: NOT NULL constraint failed: seen.title"),
        "{reason}"
    );
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM seen"), 1);
}

// ---------------------------------------------------------------------------
// check-config.

fn check_config(db: &TestDb, toml: &str) -> Output {
    let config = db.write("check.toml", toml);
    outboxd(db, &["check-config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap()
}

#[test]
fn check_config_refuses_a_loopback_url_under_deny_private_addresses() {
    let db = Sandbox::migrated();
    let toml = |url: &str, deny: bool| {
        format!(
            r#"[[consumer]]
name = "hook"
types = ["*"]
[consumer.sink]
kind = "webhook"
url = "{url}"
secret_file = "hook.secret"
deny_private_addresses = {deny}
"#
        )
    };
    db.write("hook.secret", WEBHOOK_SECRET);
    for url in [
        "http://127.0.0.1:8080/hook?token=abcdefgh",
        "http://localhost/hook",
        "http://[::1]/hook",
    ] {
        let out = check_config(&db, &toml(url, true));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code::CONFIG), "{url}: {stderr}");
        assert!(stderr.contains("consumer[0].sink.url"), "{stderr}");
        assert!(stderr.contains("deny_private_addresses"), "{stderr}");
        assert!(!stderr.contains("abcdefgh"), "{stderr}");
        // The same URL without the guard is a good config.
        let out = check_config(&db, &toml(url, false));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn check_config_suggests_args_for_a_program_with_arguments() {
    let db = Sandbox::migrated();
    let out = check_config(
        &db,
        r#"[[consumer]]
name = "echo"
types = ["*"]
[consumer.sink]
kind = "command"
program = "/bin/echo hello"
"#,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code::CONFIG), "{stderr}");
    assert!(stderr.contains("consumer[0].sink.program"), "{stderr}");
    assert!(
        stderr.contains(r#"program = "/bin/echo", args = ["hello"]"#),
        "{stderr}"
    );
}
