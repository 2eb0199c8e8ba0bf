//! Feature `otel`: the trace context of the current `tracing` span, read
//! through its OpenTelemetry layer (tracing-opentelemetry 0.34 with
//! opentelemetry 0.33, re-exported here so that a host's layer and this
//! code agree on one version: a span recorded by another version's layer
//! has no context this code can see).

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use opentelemetry;
pub use tracing_opentelemetry;

use super::{TraceContext, TraceParent, TraceState};

/// Set once the missing context has been logged.
static TOLD: AtomicBool = AtomicBool::new(false);

/// The current span's context, `None` (logged once per process) when
/// there is no span, no OpenTelemetry layer, or no valid span context.
pub fn current() -> Option<TraceContext> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    let parent = sc
        .is_valid()
        .then(|| {
            TraceParent::new(
                sc.trace_id().to_bytes(),
                sc.span_id().to_bytes(),
                sc.is_sampled(),
            )
        })
        .flatten();
    let Some(traceparent) = parent else {
        if !TOLD.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "no OpenTelemetry context in the current tracing span: events are enqueued \
                 without trace context (is the tracing-opentelemetry 0.34 layer installed?)"
            );
        }
        return None;
    };
    // A state the producer's SDK accepted but W3C's grammar does not is
    // left out rather than stored.
    let tracestate = TraceState::parse(&sc.trace_state().header()).ok().flatten();
    Some(TraceContext {
        traceparent,
        tracestate,
        parent_span_id: None,
    })
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// A span whose OpenTelemetry parent is a producer's remote context
    /// gives that context to the event (the layer's no-op tracer keeps the
    /// parent's span context), state and sampling included.
    #[test]
    fn the_current_spans_context_fills_the_event() {
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer());
        tracing::subscriber::with_default(subscriber, || {
            let state =
                opentelemetry::trace::TraceState::from_key_value([("congo", "t61")]).unwrap();
            let remote = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                TraceFlags::SAMPLED,
                true,
                state,
            );
            let span = tracing::info_span!("publish");
            span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote))
                .unwrap();
            let got = span.in_scope(current).expect("a context");
            assert_eq!(
                got.traceparent.trace_id(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            assert!(got.traceparent.sampled());
            assert_eq!(got.tracestate.unwrap().as_str(), "congo=t61");
            // Outside any span: nothing, and no panic.
            assert!(current().is_none());
        });
    }
}
