//! Feature `otlp`: `run`'s own spans, one per delivery attempt, exported
//! over OTLP/HTTP (protobuf, encoded in [`proto`]) with the `ureq` client
//! the webhook sink uses.
//!
//! A span's ids are the attempt's trace context: the trace id and the
//! span id the sinks send (`traceparent`), so a receiver's spans are its
//! children, and the producer's span as its parent. An event without trace
//! context gets a root span of a new trace; one whose producer did not
//! sample its trace (the `sampled` flag off) gets none.
//!
//! Export never slows delivery: a worker hands its span to a bounded queue
//! ([`TracingSettings::queue`]) and goes on; a full queue drops the span,
//! and a failed export its batch, both counted and logged (at most once a
//! minute). One thread sends batches of up to [`MAX_BATCH`] spans.

mod proto;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use outboxd::consumer::{Consumer, Delivery, Outcome, TransactionalConsumer};
use outboxd::text::{clip, Keep};

use crate::config::tracing::TracingSettings;
use proto::{Span, Value};

/// The most spans in one export request.
const MAX_BATCH: usize = 512;

/// How long a span waits for others to share its request.
const BATCH_WAIT: Duration = Duration::from_millis(500);

/// The longest failure reason a span's status carries.
const MAX_STATUS_MESSAGE: usize = 256;

enum Msg {
    Span(Box<Span>),
    /// Export everything queued before it, then answer.
    Flush(Sender<()>),
}

/// The exporter's queue and counts; clones share them.
#[derive(Clone)]
pub(crate) struct Exporter {
    queue: Sender<Msg>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    dropped: AtomicU64,
    exported: AtomicU64,
}

impl Exporter {
    /// Starts the export thread.
    pub(crate) fn start(settings: &TracingSettings) -> Exporter {
        let (queue, rx) = crossbeam_channel::bounded(settings.queue);
        let counts = Arc::new(Counts::default());
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(settings.timeout))
            .build()
            .into();
        let thread_counts = counts.clone();
        let settings = settings.clone();
        std::thread::Builder::new()
            .name("outboxd-otlp".into())
            .spawn(move || export_loop(&rx, &agent, &settings, &thread_counts))
            .expect("a thread for the OTLP exporter");
        Exporter { queue, counts }
    }

    fn record(&self, span: Span) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(Msg::Span(Box::new(span)))
        {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Exports what is queued, waiting at most `limit`, and logs the
    /// counts (at `run`'s end).
    pub(crate) fn flush(&self, limit: Duration) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let done = self.queue.send_timeout(Msg::Flush(tx), limit).is_ok()
            && rx.recv_timeout(limit).is_ok();
        tracing::info!(
            exported = self.counts.exported.load(Ordering::Relaxed),
            dropped = self.counts.dropped.load(Ordering::Relaxed),
            flushed = done,
            "OTLP span export stopped"
        );
    }

    /// `sink` with a span recorded for each of its attempts.
    pub(crate) fn traced<C>(&self, sink: C) -> Traced<C> {
        Traced {
            inner: sink,
            exporter: self.clone(),
        }
    }
}

/// A consumer whose every attempt becomes a span.
pub(crate) struct Traced<C> {
    inner: C,
    exporter: Exporter,
}

impl<C: Consumer> Consumer for Traced<C> {
    fn deliver(&self, d: &Delivery) -> Outcome {
        let start = SystemTime::now();
        let outcome = self.inner.deliver(d);
        if let Some(span) = span_of(d, start, SystemTime::now(), &outcome) {
            self.exporter.record(span);
        }
        outcome
    }
}

impl<C: TransactionalConsumer> TransactionalConsumer for Traced<C> {
    fn deliver(&self, tx: &rusqlite::Transaction<'_>, d: &Delivery) -> Outcome {
        let start = SystemTime::now();
        let outcome = self.inner.deliver(tx, d);
        if let Some(span) = span_of(d, start, SystemTime::now(), &outcome) {
            self.exporter.record(span);
        }
        outcome
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The span of one attempt; `None` when the producer's trace is not sampled.
fn span_of(d: &Delivery, start: SystemTime, end: SystemTime, outcome: &Outcome) -> Option<Span> {
    let (trace_id, span_id, parent_span_id, trace_state) = match &d.trace {
        Some(t) if !t.traceparent.sampled() => return None,
        Some(t) => (
            t.traceparent.trace_id_bytes(),
            t.traceparent.span_id_bytes(),
            t.parent_span_id,
            t.tracestate.as_ref().map(|s| s.as_str().to_string()),
        ),
        None => (nonzero(), nonzero(), None, None),
    };
    let env = &d.envelope;
    let (result, error) = match outcome {
        Outcome::Delivered => ("delivered", None),
        Outcome::Retry { reason, .. } => ("retry", Some(reason)),
        Outcome::Poison { reason } => ("poison", Some(reason)),
        Outcome::Unavailable { reason, .. } => ("unavailable", Some(reason)),
    };
    let mut attributes = vec![
        ("outboxd.event_id", Value::Str(env.event_id.to_string())),
        ("outboxd.event_type", Value::Str(env.event_type.to_string())),
        ("outboxd.consumer", Value::Str(d.consumer.clone())),
        ("outboxd.attempt", Value::Int(i64::from(d.attempt))),
        ("outboxd.outcome", Value::Str(result.into())),
    ];
    if let Some(created) = d.created_at {
        let since = |t: SystemTime| {
            let ms = i64::try_from(unix_nanos(t) / 1_000_000).unwrap_or(i64::MAX);
            Value::Int(ms.saturating_sub(created.as_millis()).max(0))
        };
        attributes.push(("outboxd.commit_to_start_ms", since(start)));
        attributes.push(("outboxd.commit_to_outcome_ms", since(end)));
    }
    Some(Span {
        trace_id,
        span_id,
        parent_span_id,
        trace_state,
        name: format!("deliver {}", d.consumer),
        start_unix_nano: unix_nanos(start),
        end_unix_nano: unix_nanos(end),
        attributes,
        error: error.map(|r| clip(r, MAX_STATUS_MESSAGE, Keep::Head).into_owned()),
    })
}

fn nonzero<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = rand::random();
        if id != [0; N] {
            return id;
        }
    }
}

fn export_loop(rx: &Receiver<Msg>, agent: &ureq::Agent, s: &TracingSettings, counts: &Counts) {
    let mut last_warning: Option<Instant> = None;
    let mut dropped_told = 0;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        let mut flush = None;
        let deadline = Instant::now() + BATCH_WAIT;
        let mut next = Ok(first);
        loop {
            match next {
                Ok(Msg::Span(span)) => batch.push(*span),
                Ok(Msg::Flush(reply)) => flush = Some(reply),
                Err(_) => break,
            }
            if flush.is_some() || batch.len() >= MAX_BATCH {
                break;
            }
            next = rx.recv_deadline(deadline).map_err(|_| ());
        }
        if !batch.is_empty() {
            match post(agent, s, &batch) {
                Ok(()) => {
                    counts
                        .exported
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    counts
                        .dropped
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        last_warning = Some(Instant::now());
                        tracing::warn!(
                            endpoint = %s.endpoint,
                            error = %e,
                            dropped = counts.dropped.load(Ordering::Relaxed),
                            "cannot export spans to the OTLP collector; they are dropped"
                        );
                    }
                }
            }
        }
        let dropped = counts.dropped.load(Ordering::Relaxed);
        if dropped > dropped_told
            && last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            last_warning = Some(Instant::now());
            dropped_told = dropped;
            tracing::warn!(
                dropped,
                "spans dropped: the OTLP export queue was full or failed"
            );
        }
        if let Some(reply) = flush {
            let _ = reply.send(());
        }
    }
}

/// One export request; the auth header's value never reaches an error.
fn post(agent: &ureq::Agent, s: &TracingSettings, batch: &[Span]) -> Result<(), String> {
    let body = proto::export_request(&s.resource, batch);
    let mut request = agent
        .post(&s.endpoint)
        .header("content-type", "application/x-protobuf");
    if let Some((name, value)) = &s.auth {
        request = request.header(name, value);
    }
    match request.send(&body[..]) {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("the collector answered {}", r.status())),
        Err(e) => Err(e.to_string()),
    }
}
