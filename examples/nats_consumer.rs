//! The far side of the `nats` sink: a service that reads outboxd's events
//! from a JetStream stream, on any machine.
//!
//!   cargo run --example nats_consumer -- nats://127.0.0.1:4222 EVENTS [max-messages]
//!
//! It uses a durable pull consumer (the server remembers how far it got, so
//! a restart resumes there), acknowledges each message only after handling
//! it, and skips message ids it has handled already: JetStream redelivers a
//! message whose ack did not arrive in time, and a repeat published after
//! the stream's duplicate window is stored twice. A real service records
//! the ids in the same transaction as its effect; this one keeps them in
//! memory. It stops after `max-messages`, or when none came for 5 s.

use std::collections::HashSet;
use std::io::Write;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures_util::StreamExt;
use outboxd::Envelope;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let stream = args.next().unwrap_or_else(|| "EVENTS".into());
    let max: usize = args.next().map_or(Ok(usize::MAX), |n| n.parse())?;
    run(&url, &stream, max, &mut std::io::stdout())
}

/// Handles up to `max` messages of `stream`, printing one line per event to
/// `out`. A function of its own so the test of the NATS sink runs it
/// (tests/hosts/nats_sink.rs includes this file as a module).
pub fn run(url: &str, stream: &str, max: usize, out: &mut impl Write) -> Result<(), Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(consume(url, stream, max, out))
}

async fn consume(url: &str, stream: &str, max: usize, out: &mut impl Write) -> Result<(), Error> {
    let js = jetstream::new(async_nats::connect(url).await?);
    let consumer = js
        .get_stream(stream)
        .await?
        .get_or_create_consumer(
            "example-service",
            pull::Config {
                durable_name: Some("example-service".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer
        .stream()
        .heartbeat(Duration::from_secs(1))
        .expires(Duration::from_secs(2))
        .messages()
        .await?;
    let mut seen = HashSet::new();
    let mut handled = 0;
    while handled < max {
        let message = match tokio::time::timeout(Duration::from_secs(5), messages.next()).await {
            Ok(Some(m)) => m?,
            Ok(None) | Err(_) => break,
        };
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        if seen.insert(id.clone()) {
            // The effect: here, print the event. Make it idempotent on `id`.
            let envelope: Envelope = serde_json::from_slice(&message.payload)?;
            writeln!(
                out,
                "{} {} {}",
                envelope.event_id,
                envelope.event_type,
                envelope.payload.get()
            )?;
        } else {
            eprintln!("{id}: seen already, skipped");
        }
        // Acknowledge after the effect, so a crash before it redelivers.
        message.ack_with(AckKind::Ack).await?;
        handled += 1;
    }
    eprintln!("handled {handled} messages");
    Ok(())
}
