//! Starting a relay: the write connection, the worker threads and the
//! writer thread, or none of them.

use std::sync::Arc;

use super::handle::RelayHandle;
use super::metrics::Metrics;
use super::{spawn, transactional, worker, writer, Relay, WRITER_THREAD};
use crate::error::Result;

impl Relay {
    /// Opens the write connection, checks the schema is current, and starts
    /// the worker threads and the writer thread. Fails, with nothing left
    /// running, when the database cannot be used or a thread cannot be
    /// started ([`Error::Spawn`](crate::Error::Spawn)).
    pub fn start(self) -> Result<RelayHandle> {
        let Relay {
            settings,
            consumers,
            routes,
            clock,
        } = self;
        let metrics = Arc::new(
            Metrics::new(consumers.iter().map(|c| c.name.clone()).collect())
                .with_availability(consumers.iter().map(|c| c.availability.clone()).collect()),
        );
        let (control_tx, control_rx) = crossbeam_channel::bounded(64);
        let (workers, flush_interval) = (settings.workers, settings.flush_interval);
        let path = Arc::new(settings.path.clone());
        let consumers = Arc::new(consumers);
        let writer = writer::Writer::open(
            settings,
            consumers.clone(),
            routes,
            clock.clone(),
            metrics.clone(),
            control_rx,
        )?;
        // The writer claims no more rows than this channel holds, so its
        // sends never block; outcomes are unbounded, so a worker never blocks.
        let (jobs_tx, jobs_rx) = crossbeam_channel::bounded(writer.capacity());
        let (outcomes_tx, outcomes_rx) = crossbeam_channel::unbounded();
        let (exited_tx, exited_rx) = crossbeam_channel::unbounded();
        let mut pool = Vec::with_capacity(workers);
        for n in 0..workers {
            let (consumers, jobs, outcomes) =
                (consumers.clone(), jobs_rx.clone(), outcomes_tx.clone());
            let session = transactional::Session::new(path.clone(), clock.clone());
            let exited = worker::Exited::new(exited_tx.clone(), n);
            let spawned = spawn(format!("outboxd-worker-{n}"), move || {
                worker::run(consumers, jobs, outcomes, flush_interval, session);
                drop(exited);
            });
            match spawned {
                Ok(handle) => pool.push(handle),
                Err(e) => {
                    // A relay short of workers would claim rows it cannot
                    // deliver: stop the ones started (they end when the jobs
                    // channel closes) and report.
                    drop(jobs_tx);
                    for handle in pool {
                        let _ = handle.join();
                    }
                    return Err(e);
                }
            }
        }
        drop((outcomes_tx, exited_tx));
        let pool = writer::Pool {
            jobs: jobs_tx,
            unstarted: jobs_rx,
            outcomes: outcomes_rx,
            exited: exited_rx,
            workers: pool,
        };
        // If this spawn fails, the closure (and with it the jobs sender) is
        // dropped, and the workers end on their own.
        let thread = spawn(WRITER_THREAD.into(), move || writer.run(pool))?;
        Ok(RelayHandle {
            control: control_tx,
            thread: Some(thread),
            metrics,
        })
    }
}
