//! Two `outboxd run` processes on one file while their wall clocks step
//! both ways (libfaketime, each relay its own offset) and one is killed
//! (issue 30 items 1 and 3, docs/liveness.md): leases are judged by the
//! owner's lock file, never by a clock, so no event is delivered twice
//! without a crash, and the killed relay's leases, an hour ahead on its
//! clock, are taken by the other at once.

use crate::common;

use std::collections::HashMap;

use common::bin::{Running, Sandbox, WAIT};
use outboxd::Event;

use super::run_faults::{faked, libfaketime};

/// `relay name` delivered event `id`, one line each.
fn deliveries(log: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, id)| (r.to_owned(), id.to_owned()))
        .collect()
}

fn enqueue(sb: &Sandbox, n: u64) {
    let mut conn = sb.conn();
    let tx = conn.transaction().unwrap();
    for i in 0..n {
        outboxd::enqueue(&tx, &Event::new("clock.step.v1", &i).unwrap()).unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn two_relays_under_clock_steps_both_ways_and_a_kill_9_deliver_each_event_once() {
    if !libfaketime().exists() {
        common::missing("libfaketime is not installed (apt-get install faketime)");
        return;
    }
    let sb = Sandbox::migrated();
    let log = sb.file("delivered.log");
    let relay = |name: &str| {
        let script = sb.script(
            &format!("record-{name}.sh"),
            &format!(
                "cat >/dev/null\nsleep 0.02\necho \"{name} $OUTBOXD_EVENT_ID\" >> {}",
                log.display()
            ),
        );
        let config = sb.write(
            &format!("{name}.toml"),
            &format!(
                "database = \"app.db\"\n[relay]\nworkers = 2\nbatch_size = 4\nlease = \"2s\"\n\
                 poll_interval = \"5ms\"\n\
                 [[consumer]]\nname = \"c\"\ntypes = [\"*\"]\n\
                 [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\ntimeout = \"2s\"\n",
                script.display()
            ),
        );
        let offset = sb.write(&format!("offset-{name}"), "+0\n");
        let config = config.to_str().unwrap().to_owned();
        let run = Running::spawn(&mut faked(
            sb.command(&["run", "--config", &config]),
            &offset,
        ));
        (run, offset)
    };
    let step =
        |offset: &std::path::Path, to: &str| std::fs::write(offset, format!("{to}\n")).unwrap();
    let (mut a, offset_a) = relay("A");
    let (mut b, offset_b) = relay("B");

    // Steps forward and back, each while both relays deliver; one relay at
    // least is never behind the producer's clock (events committed after a
    // step back wait for the step's size on that relay, docs/relay.md).
    let mut written = 0;
    for (offset, to) in [
        (&offset_b, "+1h"),
        (&offset_a, "+1h"),
        (&offset_b, "-1h"),
        (&offset_b, "+2h"),
        (&offset_a, "-1h"),
        (&offset_a, "+0"),
    ] {
        enqueue(&sb, 20);
        written += 20;
        common::wait_until("deliveries under way", WAIT, || {
            a.assert_alive();
            b.assert_alive();
            deliveries(&log).len() as u64 >= written - 15
        });
        step(offset, to);
    }
    common::wait_until("every event delivered", WAIT, || {
        sb.count("status = 'delivered'") == written as i64
    });
    let before_kill = deliveries(&log);
    let mut times: HashMap<&str, usize> = HashMap::new();
    for (_, id) in &before_kill {
        *times.entry(id).or_default() += 1;
    }
    let twice = times.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "delivered twice without a crash: {before_kill:?}");
    assert_eq!(times.len() as u64, written);

    // A, an hour ahead, is killed while it delivers; B takes its leases
    // (an hour ahead on B's clock) at once. (B's clock is not left behind
    // the producer's: events committed after a step back wait for the
    // step's size, as docs/relay.md says.)
    step(&offset_a, "+1h");
    step(&offset_b, "+0");
    enqueue(&sb, 40);
    written += 40;
    common::wait_until("A to deliver after the kill's start", WAIT, || {
        deliveries(&log)[before_kill.len()..]
            .iter()
            .any(|(r, _)| r == "A")
    });
    a.kill9();
    common::wait_until("B to deliver the rest, A's leases too", WAIT, || {
        b.assert_alive();
        sb.count("status = 'delivered'") == written as i64
    });
    assert!(b.stop().success(), "{}", b.stderr());
    let all = deliveries(&log);
    let mut by_id: HashMap<&str, Vec<&str>> = HashMap::new();
    for (r, id) in &all {
        by_id.entry(id).or_default().push(r);
    }
    assert_eq!(by_id.len() as u64, written, "an event was lost");
    let repeated: Vec<_> = by_id.iter().filter(|(_, rs)| rs.len() > 1).collect();
    // Only what A had in flight at the kill (its claims hold at most 4).
    assert!(repeated.len() <= 4, "{repeated:?}");
    assert!(
        repeated
            .iter()
            .all(|(_, rs)| rs.len() == 2 && rs.contains(&"A")),
        "{repeated:?}"
    );
    println!(
        "# liveness under clock steps: {written} written, {} delivered, {} repeated (each \
         across the kill of A), 0 lost",
        by_id.len(),
        repeated.len()
    );
}
