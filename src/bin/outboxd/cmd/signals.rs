//! SIGINT/SIGTERM for the commands that serve until told to stop (`run`,
//! `console`), and the command sinks' programs a stop leaves behind.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;
use crossbeam_channel::Receiver;

use crate::exit::Failure;

/// Kills the programs of command sinks still running (deliveries the relay
/// left behind after its grace: their rows are released, and another run
/// will deliver them again), and says how many at WARN.
pub(crate) fn kill_programs_left_behind() {
    let killed = outboxd::sinks::command::kill_running();
    if killed > 0 {
        tracing::warn!(
            killed,
            "killed command sink programs still running after the shutdown grace; their \
             events will be delivered again"
        );
    }
}

/// The first SIGINT/SIGTERM/SIGHUP is sent on the channel; a second one
/// exits the process at once with 130 (killing command sinks' programs
/// first).
pub(crate) fn install_handler() -> Result<Receiver<()>> {
    static SIGNALS: AtomicUsize = AtomicUsize::new(0);
    let (tx, rx) = crossbeam_channel::bounded(1);
    ctrlc::set_handler(move || {
        if SIGNALS.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = tx.try_send(());
        } else {
            eprintln!("outboxd: second signal; exiting without waiting for deliveries in flight (their leases expire)");
            outboxd::sinks::command::kill_running();
            std::process::exit(130);
        }
    })
    .map_err(|e| {
        // ctrlc starts a thread to wait for signals; failing that is the
        // system's limits, not the user's input.
        let why = match &e {
            ctrlc::Error::System(io) => io.to_string(),
            other => other.to_string(),
        };
        Failure::internal(format!(
            "cannot install the SIGINT/SIGTERM handler: {why}"
        ))
    })?;
    Ok(rx)
}
