//! check-config against real servers: what no retry can fix is refused
//! with exit 6 naming the field and the fix, an outage is a warning.
//!
//! - NATS: a `tls://` server whose certificate the client cannot trust
//!   (tls_ca_file), one whose certificate is for another host, one that
//!   wants a client certificate, a `tls://` URL to a plain server (servers), `require_tls` against a plain server
//!   (require_tls), a host name that does not exist (servers[0]); with the
//!   right CA the TLS server is fine;
//! - webhooks: a receiver whose certificate is signed by a private CA, an
//!   https URL to a port without TLS, a host name that does not exist (url);
//!   a plain receiver is connected to and sent no request, a refused port
//!   is a warning;
//! - `create_stream` without `duplicate_window` creates the window the
//!   consumer's retry schedule needs plus `relay.max_pause_for_dedup`, and
//!   says so (the server asked for the stream's real window).
//!
//! Certificates come from a throwaway CA (tests/common/tls.rs); NATS cases
//! run on each server release (tests/common/nats_versions.rs). `.invalid`
//! names never exist (RFC 6761): the resolver answers NXDOMAIN.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::bin::{code, Outboxd};
use crate::common::tls::{free_port, TestCa, TlsReceiver};
use crate::common::TestDb;

/// A signing secret for the webhook configs.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn check_config(db: &TestDb, config: &Path) -> Output {
    Outboxd::on(db.db())
        .command(&["check-config", "--config", config.to_str().unwrap()])
        .env("REACH_SECRET", SECRET)
        .output()
        .unwrap()
}

/// check-config exits 6 with one line naming `field`, and each of `needles`.
fn refused(db: &TestDb, config: &Path, field: &str, needles: &[&str]) {
    let out = check_config(db, config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code::CONFIG), "{field}: {err}");
    assert!(
        err.contains(&format!(": {field}: ")),
        "{field} not named: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

/// check-config exits 0; its stdout.
fn accepted(db: &TestDb, config: &Path) -> String {
    let out = check_config(db, config);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn webhook(db: &TestDb, url: &str) -> std::path::PathBuf {
    db.write(
        "hook.toml",
        &format!(
            "[[consumer]]\nname = \"hook\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"webhook\"\n\
             url = \"{url}\"\nsecret_env = \"REACH_SECRET\"\nconnect_timeout = \"5s\"\n"
        ),
    )
}

/// A plain TCP receiver on loopback that sends what it reads on each
/// connection to the returned channel, and answers like an HTTP server
/// given bytes it cannot parse (400, then close).
fn plain_receiver() -> (u16, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            buf.truncate(n);
            if n > 0 {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
            }
            let _ = tx.send(buf);
        }
    });
    (port, rx)
}

#[test]
fn a_webhook_receiver_tls_cannot_reach_is_refused_and_none_is_sent_a_request() {
    let db = TestDb::new();
    let Some(ca) = TestCa::new(db.dir.path()) else {
        return;
    };
    // Signed by a private CA: outboxd trusts the bundled public roots only.
    let tls = TlsReceiver::start(&ca);
    let cfg = webhook(&db, &format!("https://127.0.0.1:{}/hook", tls.port));
    refused(
        &db,
        &cfg,
        "consumer[0].sink.url",
        &["UnknownIssuer", "public CA"],
    );
    // https to a port that speaks plain HTTP: what it got was a TLS
    // ClientHello, never an HTTP request.
    let (port, seen) = plain_receiver();
    let cfg = webhook(&db, &format!("https://127.0.0.1:{port}/hook"));
    refused(
        &db,
        &cfg,
        "consumer[0].sink.url",
        &["does not speak TLS", "http://"],
    );
    let got = seen.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(got.first(), Some(&0x16), "a TLS handshake record: {got:?}");
    // A host that does not exist.
    let cfg = webhook(&db, "https://receiver.outboxd-test.invalid/hook");
    refused(
        &db,
        &cfg,
        "consumer[0].sink.url",
        &["receiver.outboxd-test.invalid does not exist"],
    );
    // Plain http: connected to, nothing sent.
    let cfg = webhook(&db, &format!("http://127.0.0.1:{port}/hook"));
    let text = accepted(&db, &cfg);
    assert!(text.contains("note: connected to 127.0.0.1:"), "{text}");
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(30)).unwrap(),
        b"",
        "check-config sent the receiver bytes"
    );
    // Nothing listening: an outage, a warning.
    let cfg = webhook(&db, &format!("http://127.0.0.1:{}/hook", free_port()));
    let text = accepted(&db, &cfg);
    assert!(
        text.contains("warning: cannot connect to 127.0.0.1:"),
        "{text}"
    );
}

#[cfg(feature = "nats")]
mod nats {
    use super::*;
    use crate::common::bin::Running;
    use crate::common::nats_server::{NatsServer, Settings, StreamAdmin};
    use crate::common::nats_versions;
    use outboxd::sinks::nats::DuplicateWindowCheck;
    use outboxd::RetryPolicy;

    fn nats(db: &TestDb, servers: &str, extra: &str) -> std::path::PathBuf {
        db.write(
            "nats.toml",
            &format!(
                "[[consumer]]\nname = \"bus\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"nats\"\n\
                 servers = [\"{servers}\"]\nstream = \"EVENTS\"\nconnect_timeout = \"5s\"\n{extra}"
            ),
        )
    }

    #[test]
    fn an_untrusted_certificate_and_tls_one_side_only_are_refused_naming_the_field() {
        nats_versions::each(|| {
            let db = TestDb::new();
            let Some(ca) = TestCa::new(db.dir.path()) else {
                return;
            };
            let tls = NatsServer::with(Settings {
                tls: Some((ca.cert.clone(), ca.key.clone())),
                ..Settings::default()
            });
            let url = format!("tls://127.0.0.1:{}", tls.port);
            let cfg = nats(&db, &url, "");
            refused(
                &db,
                &cfg,
                "consumer[0].sink.tls_ca_file",
                &["UnknownIssuer", "set tls_ca_file"],
            );
            // The same server with its CA: reached (the stream is missing,
            // which create_stream allows).
            let ca_file = format!("tls_ca_file = {:?}\n", ca.ca.display().to_string());
            let cfg = nats(&db, &url, &format!("{ca_file}create_stream = {{}}\n"));
            let text = accepted(&db, &cfg);
            assert!(text.contains("stream EVENTS does not exist yet"), "{text}");
            // Also by nats://: the server requires TLS, the client follows.
            let cfg = nats(
                &db,
                &format!("nats://localhost:{}", tls.port),
                &format!("{ca_file}create_stream = {{}}\n"),
            );
            accepted(&db, &cfg);

            // A certificate the CA signs, but for another host.
            let elsewhere = NatsServer::with(Settings {
                tls: Some(ca.issue("elsewhere", "DNS:elsewhere.test")),
                ..Settings::default()
            });
            let cfg = nats(
                &db,
                &format!("tls://127.0.0.1:{}", elsewhere.port),
                &ca_file,
            );
            refused(
                &db,
                &cfg,
                "consumer[0].sink.servers",
                &["not valid for name", "subject alternative names"],
            );

            // A server that wants a client certificate (outboxd sends none).
            let mutual = NatsServer::with(Settings {
                tls: Some((ca.cert.clone(), ca.key.clone())),
                tls_verify_ca: Some(ca.ca.clone()),
                ..Settings::default()
            });
            let cfg = nats(&db, &format!("tls://127.0.0.1:{}", mutual.port), &ca_file);
            refused(
                &db,
                &cfg,
                "consumer[0].sink.servers",
                &["refused the handshake", "client certificate"],
            );

            let plain = NatsServer::start();
            let cfg = nats(&db, &plain.url(), "require_tls = true\n");
            refused(
                &db,
                &cfg,
                "consumer[0].sink.require_tls",
                &["offers no TLS", "require_tls = false"],
            );
            let cfg = nats(&db, &format!("tls://127.0.0.1:{}", plain.port), "");
            refused(
                &db,
                &cfg,
                "consumer[0].sink.servers",
                &["offers no TLS", "nats:// URL"],
            );
        });
    }

    #[test]
    fn a_server_host_that_does_not_exist_is_refused_and_one_that_is_down_is_a_warning() {
        let db = TestDb::new();
        let cfg = nats(&db, "nats://nats.outboxd-test.invalid:4222", "");
        refused(
            &db,
            &cfg,
            "consumer[0].sink.servers[0]",
            &[
                "nats.outboxd-test.invalid does not exist",
                "correct the host name",
            ],
        );
        let cfg = nats(&db, &format!("nats://127.0.0.1:{}", free_port()), "");
        let text = accepted(&db, &cfg);
        assert!(text.contains("warning: cannot connect"), "{text}");
    }

    /// The window the config below needs: its schedule's horizon plus the
    /// pause, in whole minutes up.
    fn needed(pause: Duration) -> Duration {
        let retry = RetryPolicy::default()
            .initial(Duration::from_millis(500))
            .max_delay(Duration::from_secs(2))
            .max_attempts(5);
        let horizon = DuplicateWindowCheck::new(
            &retry,
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::ZERO,
        )
        .horizon();
        Duration::from_secs((horizon + pause).as_secs().div_ceil(60) * 60)
    }

    #[test]
    fn create_stream_without_a_duplicate_window_sizes_it_to_the_schedule_and_the_pause() {
        nats_versions::each(|| {
            let db = TestDb::new();
            let server = NatsServer::start();
            let schedule = "[relay]\nlease = \"3s\"\n{pause}[retry]\ninitial = \"500ms\"\n\
                            max_delay = \"2s\"\nmax_attempts = 5\n";
            let sink = format!(
                "[[consumer]]\nname = \"bus\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"nats\"\n\
                 servers = [\"{}\"]\nstream = \"EVENTS\"\nack_timeout = \"2s\"\n\
                 create_stream = {{}}\n",
                server.url()
            );
            // The default pause: check-config says what run would create.
            let cfg = db.write("outboxd.toml", &(schedule.replace("{pause}", "") + &sink));
            let text = accepted(&db, &cfg);
            let four_hours = outboxd::clock::format_duration(needed(Duration::from_secs(4 * 3600)));
            for n in [
                &format!("created with duplicate window {four_hours}"),
                "relay.max_pause_for_dedup 4h",
                "in the server's memory",
            ] {
                assert!(text.contains(n), "{n:?} missing from: {text}");
            }
            // run creates it so, with the pause configured.
            let cfg = db.write(
                "outboxd.toml",
                &(schedule.replace("{pause}", "max_pause_for_dedup = \"10m\"\n") + &sink),
            );
            let mut run = Running::spawn(&mut Outboxd::on(db.db()).command(&[
                "run",
                "--config",
                cfg.to_str().unwrap(),
            ]));
            run.wait_started();
            let window = StreamAdmin::connect(&[server.url()]).duplicate_window("EVENTS");
            assert_eq!(window, needed(Duration::from_secs(600)));
            assert!(window > Duration::from_secs(600), "{window:?}");
            let shown = outboxd::clock::format_duration(window);
            assert!(
                run.stderr()
                    .contains(&format!("created with duplicate window {shown}")),
                "{}",
                run.stderr()
            );
            assert!(run.stop().success());
        });
    }
}
