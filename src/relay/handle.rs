//! A running relay's handle: waking it, shutting it down, waiting for it,
//! its counters.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::metrics::{Metrics, MetricsSnapshot};
use super::panic::panic_message;
use super::{DEFAULT_DROP_GRACE, WRITER_THREAD};
use crate::error::{Error, Result};

/// Messages from the handle to the writer.
pub(crate) enum Control {
    Notify,
    Shutdown(Duration),
}

/// A running relay. Dropping it shuts the relay down with
/// [`DEFAULT_DROP_GRACE`] and waits for it: keep it for as long as the
/// relay should run.
#[must_use = "dropping the handle stops the relay at once"]
pub struct RelayHandle {
    pub(super) control: Sender<Control>,
    pub(super) thread: Option<JoinHandle<Result<()>>>,
    pub(super) metrics: Arc<Metrics>,
}

impl RelayHandle {
    /// Wakes the relay to claim at once: call it after committing events in
    /// the same process. Cheap, and never blocks.
    pub fn notify(&self) {
        let _ = self.control.try_send(Control::Notify);
    }

    /// Stops claiming, lets in-flight deliveries finish within `grace`,
    /// records their outcomes, releases the rest, and waits for the threads.
    pub fn shutdown(mut self, grace: Duration) -> Result<()> {
        let _ = self.control.send(Control::Shutdown(grace));
        self.join_inner()
    }

    /// Waits for the relay to stop without asking it to. The writer ends by
    /// itself only when it fails ([`Error::Panicked`]): pair it with
    /// [`is_finished`](Self::is_finished) to notice a relay that died.
    pub fn join(mut self) -> Result<()> {
        self.join_inner()
    }

    /// True once the relay's writer thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// The relay's counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// A shared view of the counters, for a metrics endpoint that outlives
    /// borrows of the handle.
    pub fn metrics_source(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn join_inner(&mut self) -> Result<()> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|panic| {
                Err(Error::Panicked {
                    thread: WRITER_THREAD.into(),
                    message: panic_message(&*panic),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.control.send(Control::Shutdown(DEFAULT_DROP_GRACE));
            let _ = self.join_inner();
        }
    }
}
