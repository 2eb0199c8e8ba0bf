//! Worker threads: run consumers. They never write to SQLite, with one
//! exception: a transactional consumer's transaction, on the worker's own
//! connection ([`super::transactional`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::availability::Change;
use super::job::{Job, JobOutcome};
use super::panic::panic_message;
use super::transactional::Session;
use crate::consumer::{Delivery, Outcome};
use crate::relay::{ConsumerEntry, ConsumerKind};
use crate::trace::TraceContext;

/// A worker's loop: ends when the writer drops the jobs sender (shutdown),
/// or when the writer is gone.
///
/// Outcomes are sent in groups: a worker that has more jobs waiting keeps
/// its outcomes (up to [`MAX_GROUP`], and no longer than `flush_interval`)
/// and sends them together, so the writer wakes once per group rather than
/// once per event. When no job is waiting, it sends at once.
pub(crate) fn run(
    consumers: Arc<Vec<ConsumerEntry>>,
    jobs: Receiver<Job>,
    outcomes: Sender<Vec<JobOutcome>>,
    flush_interval: Duration,
    mut session: Session,
) {
    let mut group: Vec<JobOutcome> = Vec::new();
    let mut oldest = Instant::now();
    loop {
        // A worker holding outcomes waits for more work only until they are
        // due to be sent: it never sits on them while idle.
        let next = if group.is_empty() {
            jobs.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            jobs.recv_deadline(oldest + flush_interval)
        };
        let mut job = match next {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => {
                if outcomes.send(std::mem::take(&mut group)).is_err() {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        // The row's payload moves into the one delivery its consumers
        // share, in turn: a delivery holds one copy of it, whatever the
        // number of consumers.
        let mut held = Vec::new();
        let (results, invalid) = match std::mem::take(&mut job.raw).into_checked() {
            Ok(row) => {
                if let Some(e) = &row.trace_dropped {
                    tracing::warn!(
                        event_id = %row.envelope.event_id,
                        error = %e,
                        "the event's trace context is invalid: delivered without it"
                    );
                }
                let mut delivery = Delivery {
                    envelope: row.envelope,
                    attempt: job.attempt,
                    consumer: String::new(),
                    legacy: job.legacy,
                    tenant_id: row.tenant_id,
                    ordering_key: job.ordering_key.clone(),
                    trace: None,
                    created_at: Some(row.created_at),
                };
                let results = job
                    .consumers
                    .iter()
                    .map(|&i| {
                        let entry = &consumers[i];
                        if let Some(reason) = entry.availability.admit(Instant::now()) {
                            held.push(i);
                            return (i, Outcome::unavailable(reason));
                        }
                        delivery.consumer.clone_from(&entry.name);
                        // Every attempt to every consumer is a span of its own.
                        delivery.trace = row.trace.as_ref().map(TraceContext::child);
                        let outcome = deliver(entry, &job, &delivery, &mut session);
                        pause_or_resume(entry, &outcome);
                        (i, outcome)
                    })
                    .collect();
                (results, None)
            }
            Err(e) => (Vec::new(), Some(format!("invalid row: {e}"))),
        };
        if group.is_empty() {
            oldest = Instant::now();
        }
        group.push(JobOutcome {
            row_id: job.row_id,
            token: job.token,
            results,
            held,
            invalid,
        });
        let due = jobs.is_empty() || group.len() >= MAX_GROUP || oldest.elapsed() >= flush_interval;
        if due && outcomes.send(std::mem::take(&mut group)).is_err() {
            return;
        }
    }
    if !group.is_empty() {
        let _ = outcomes.send(group);
    }
}

/// Says that worker `n` has ended, once everything it held is dropped (its
/// last outcomes sent, its connection closed), even when it unwinds. The
/// outcomes channel closing says only that the last worker dropped its
/// sender, which it does before the rest: judged by that, a worker still
/// closing its connection looked like one stuck in a consumer.
pub(crate) struct Exited {
    to: Sender<usize>,
    n: usize,
}

impl Exited {
    pub(crate) fn new(to: Sender<usize>, n: usize) -> Exited {
        Exited { to, n }
    }
}

impl Drop for Exited {
    fn drop(&mut self) {
        let _ = self.to.send(self.n);
    }
}

/// Pauses a consumer whose destination did not answer, or resumes one
/// whose probe got an answer, and says so.
fn pause_or_resume(entry: &ConsumerEntry, outcome: &Outcome) {
    let consumer = &entry.name;
    match entry
        .availability
        .observe(outcome, &entry.retry, Instant::now())
    {
        Change::None => {}
        Change::Paused => {
            let Outcome::Unavailable { reason, .. } = outcome else {
                return;
            };
            tracing::warn!(
                %consumer, %reason,
                "destination unavailable: consumer paused, probing it with one event at a time; \
                 its events spend no attempt meanwhile"
            )
        }
        Change::Resumed(after) => tracing::info!(
            %consumer, unavailable_for = ?after,
            "destination available again: consumer resumed, delivering its backlog"
        ),
    }
}

/// The most outcomes a worker holds back before sending them.
const MAX_GROUP: usize = 64;

fn deliver(
    entry: &ConsumerEntry,
    job: &Job,
    delivery: &Delivery,
    session: &mut Session,
) -> Outcome {
    let env = &delivery.envelope;
    let span = tracing::info_span!(
        "deliver",
        event_id = %env.event_id,
        event_type = %env.event_type,
        consumer = %entry.name,
        attempt = job.attempt,
        causation_id = env.causation_id.as_deref(),
        correlation_id = env.correlation_id.as_deref(),
        trace_id = delivery
            .trace
            .as_ref()
            .map(|t| tracing::field::display(t.traceparent.trace_id())),
    );
    let _enter = span.enter();
    let outcome = match &entry.consumer {
        // A panicking consumer is a failed delivery, not a dead relay.
        ConsumerKind::Plain(c) => catch_unwind(AssertUnwindSafe(|| c.deliver(delivery)))
            .unwrap_or_else(|panic| {
                Outcome::retry(format!("consumer panicked: {}", panic_message(&*panic)))
            }),
        ConsumerKind::Transactional(c) => session.deliver(&**c, &entry.name, job, delivery),
    };
    match &outcome {
        Outcome::Delivered => tracing::debug!("delivered"),
        // Whether it is tried again is the writer's verdict (the retries may
        // be spent), logged once it is recorded.
        Outcome::Retry { reason, .. } => tracing::warn!(%reason, "delivery failed"),
        Outcome::Unavailable { reason, .. } => {
            tracing::debug!(%reason, "destination unavailable")
        }
        Outcome::Poison { reason } => {
            tracing::warn!(%reason, "consumer rejected the event as poison")
        }
    }
    outcome
}
