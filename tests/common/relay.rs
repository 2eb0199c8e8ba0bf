//! Starting a relay in a test: the consumers and settings a test is about,
//! and nothing else.
//!
//! ```ignore
//! let relay = db.relay().consumer("a", ["a.b.v1"], rec.consumer()).started();
//! ```

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use outboxd::{Relay, RelayBuilder, RelayHandle};

use super::TestDb;

/// Long enough for anything a test waits on, even on a loaded machine.
pub const LONG: Duration = Duration::from_secs(30);

impl TestDb {
    /// A relay builder on this database: add the consumers and settings the
    /// test is about, then [`StartRelay::started`].
    pub fn relay(&self) -> RelayBuilder {
        Relay::builder(&self.path)
    }
}

/// Builds and starts a relay whose settings a test knows to be valid.
pub trait StartRelay {
    /// `build()` and `start()`, failing the test at once if either fails.
    fn started(self) -> RelayHandle;
}

impl StartRelay for RelayBuilder {
    fn started(self) -> RelayHandle {
        self.build()
            .expect("the test's relay settings are valid")
            .start()
            .expect("the test's relay starts")
    }
}

/// Stops a relay, giving in-flight deliveries [`LONG`], and fails the test
/// if it did not stop cleanly.
pub fn stop(relay: RelayHandle) {
    relay.shutdown(LONG).expect("the relay stops cleanly");
}

/// Holds a consumer inside its delivery until the test lets it go: for
/// tests of what happens while a delivery runs (shutdown, a lost lease, a
/// heartbeat). Clones share one gate.
#[derive(Clone)]
pub struct Gate {
    started: (Sender<()>, Receiver<()>),
    go: (Sender<()>, Receiver<()>),
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            started: crossbeam_channel::unbounded(),
            go: crossbeam_channel::unbounded(),
        }
    }

    /// In the consumer: says a delivery started, then waits for [`open`](Self::open).
    pub fn hold(&self) {
        self.started.0.send(()).unwrap();
        self.go.1.recv().unwrap();
    }

    /// In the test: waits until a delivery is held.
    pub fn wait_started(&self) {
        self.started
            .1
            .recv_timeout(LONG)
            .expect("a delivery started");
    }

    /// In the test: lets one held delivery go on.
    pub fn open(&self) {
        self.go.0.send(()).unwrap();
    }
}
