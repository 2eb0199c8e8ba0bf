//! `outboxd run` facing a hostile machine, black-box on the real binary: a
//! memory limit with large foreign payloads among small events (issue
//! 11.3).
//!
//! Each test skips itself, with a message, when the tool it needs is
//! missing (`prlimit`). Synchronisation is by bounded polling of the
//! database; `OUTBOXD_FULL=1` selects the long forms.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::bin::{Running, Sandbox, WAIT};
use common::event;
use outboxd::EventId;

fn full() -> bool {
    std::env::var_os("OUTBOXD_FULL").is_some()
}

/// True when `program --version` runs here.
fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A config with one JSON-lines consumer writing to `out.jsonl`, two
/// workers, and the given `[relay]` lines.
fn jsonl_config(sb: &Sandbox, name: &str, relay: &str) -> String {
    let text = format!(
        "database = \"app.db\"\n[relay]\nworkers = 2\n{relay}\n\
         [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"jsonl\"\npath = \"out.jsonl\"\n"
    );
    sb.write(name, &text).to_str().unwrap().to_string()
}

/// `outboxd run --config CONFIG`, through `runner` (such as prlimit).
fn run_through(sb: &Sandbox, runner: &[&str], config: &str) -> Running {
    let runner: Vec<std::ffi::OsString> = runner.iter().map(Into::into).collect();
    sb.outboxd()
        .through(&runner)
        .spawn(&["run", "--config", config])
}

/// The event ids in the JSON-lines output, in order.
fn delivered(sb: &Sandbox) -> Vec<String> {
    std::fs::read_to_string(sb.file("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["event_id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Waits until no row is pending, failing (with the relay's log) if the
/// relay exits first or does not get there in `timeout`.
fn wait_drained(sb: &Sandbox, relay: &mut Running, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while sb.count("status = 'pending'") > 0 {
        relay.assert_alive();
        assert!(
            Instant::now() < deadline,
            "rows still pending after {timeout:?}; log:\n{}",
            relay.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Inserts `n` rows whose payload is a JSON string of `bytes` bytes, as a
/// foreign producer could, and returns their ids.
fn large_rows(db: &Path, n: usize, bytes: u64) -> Vec<String> {
    let conn = outboxd::connection::open(db).unwrap();
    (0..n)
        .map(|_| {
            let id = EventId::new().to_string();
            conn.execute(
                "INSERT INTO event_outbox (event_id, event_type, payload)
                 VALUES (?1, 'big.blob.v1', '\"' || replace(hex(zeroblob(?2 / 2 - 1)), '0', 'x') || '\"')",
                rusqlite::params![id, bytes as i64],
            )
            .unwrap();
            id
        })
        .collect()
}

/// Issue 11.3: the claim read up to `batch_size` rows whole, so a few large
/// foreign payloads under a memory limit made every start abort in the
/// claim ("memory allocation of 50000002 bytes failed"), and nothing, not
/// even the small events beside them, was delivered. Now a relay under
/// `prlimit --as` dead-letters the payloads above `max_payload_bytes`
/// unread, with their size in the reason, and delivers the small ones;
/// requeued with the maximum raised, the large ones are delivered too, one
/// at a time within `batch_bytes`.
#[test]
fn large_payloads_among_small_ones_never_abort_a_relay_under_a_memory_limit() {
    if !have("prlimit") {
        println!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    // The address-space limits: the first is too small for a relay that
    // loads a batch of these payloads (on main it retried its claim with
    // SQLITE_NOMEM forever, delivering nothing), the second for one that
    // loads several (on main: "memory allocation failed", abort).
    let (large, bytes, limits) = if full() {
        (8, 50_000_000, ["500000000", "700000000"])
    } else {
        (4, 40_000_000, ["400000000", "700000000"])
    };
    let sb = Sandbox::migrated();
    let mut small = sb.enqueue(&(0..5).map(|n| event("small.one.v1", n)).collect::<Vec<_>>());
    let big = large_rows(&sb.db(), large, bytes);
    small.extend(
        sb.enqueue(
            &(5..10)
                .map(|n| event("small.one.v1", n))
                .collect::<Vec<_>>(),
        ),
    );
    let as_limit = limits.map(|l| format!("--as={l}"));

    // The defaults: the large payloads are over max_payload_bytes.
    let config = jsonl_config(&sb, "default.toml", "");
    let mut relay = run_through(&sb, &["prlimit", &as_limit[0]], &config);
    wait_drained(&sb, &mut relay, WAIT * 3);
    assert!(relay.stop().success(), "{}", relay.stderr());
    let got = delivered(&sb);
    let small: Vec<String> = small.iter().map(|i| i.to_string()).collect();
    assert_eq!(got, small, "the small events, each once, in order");
    for id in &big {
        let reason: String = sb.scalar(&format!(
            "SELECT last_error FROM event_outbox WHERE event_id = '{id}' AND status = 'dead'"
        ));
        assert!(
            reason.contains(&format!("payload is {bytes} bytes")),
            "{reason}"
        );
    }

    // Requeued, with a maximum above them: delivered, one at a time.
    sb.ok(&["dead", "requeue", "--all"]);
    let config = jsonl_config(
        &sb,
        "raised.toml",
        &format!("max_payload_bytes = {}", bytes * 2),
    );
    let mut relay = run_through(&sb, &["prlimit", &as_limit[1]], &config);
    wait_drained(&sb, &mut relay, WAIT * 3);
    assert!(relay.stop().success(), "{}", relay.stderr());
    let got = delivered(&sb);
    assert_eq!(got[small.len()..], big[..], "then the large ones");
    assert_eq!(
        sb.count("status = 'delivered'"),
        (small.len() + big.len()) as i64
    );
    println!(
        "# prlimit --as={}: {} small events delivered, {large} payloads of {bytes} bytes \
         dead-lettered unread; --as={}: delivered after a requeue with max_payload_bytes raised",
        limits[0],
        small.len(),
        limits[1]
    );
}
