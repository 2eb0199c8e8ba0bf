//! The buffers a sink builds a delivery's bytes in: reserved at their size
//! before they are written, and fallibly, so that a payload the memory left
//! cannot hold is a failed delivery of that event (a retry saying so), never
//! an abort of the process, and no buffer grows by doubling past the size
//! it needs.

use std::collections::TryReserveError;
use std::fmt;
use std::io::{self, Write};

use serde::Serialize;

use crate::consumer::Outcome;
use crate::envelope::Envelope;

/// A buffer could not be had: `bytes` were asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfMemory {
    pub bytes: usize,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: cannot hold the {} bytes of the event's envelope (the payload is \
             tried again later; lower relay.max_payload_bytes or give the relay more memory)",
            self.bytes
        )
    }
}

impl OutOfMemory {
    /// The failed delivery: a retry, since memory may be free later.
    pub fn retry(self) -> Outcome {
        Outcome::retry(self.to_string())
    }
}

/// A `Vec<u8>` whose every growth is reserved fallibly: a write it cannot
/// make room for fails with [`io::ErrorKind::OutOfMemory`].
#[derive(Debug, Default)]
pub(crate) struct Buffer(pub Vec<u8>);

impl Buffer {
    /// An empty buffer with room for exactly `bytes`.
    pub fn with_capacity(bytes: usize) -> Result<Buffer, OutOfMemory> {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes)
            .map_err(|_| OutOfMemory { bytes })?;
        Ok(Buffer(v))
    }
}

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_reserve(buf.len()).map_err(oom)?;
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn oom(e: TryReserveError) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, e)
}

/// Counts what is written to it, keeping nothing.
#[derive(Debug, Default)]
struct Count(usize);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The length of `value`'s compact JSON, without building it: a payload
/// (a raw JSON value) is counted in one step.
pub(crate) fn json_len(value: &impl Serialize) -> usize {
    let mut count = Count::default();
    // Writing to a counter cannot fail, nor can an envelope's serialisation.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The envelope's JSON ([`Envelope::to_json`]'s bytes) in a buffer of its
/// exact size, reserved before it is written.
pub(crate) fn envelope_json(env: &Envelope) -> Result<Vec<u8>, OutOfMemory> {
    let bytes = json_len(env);
    let mut buffer = Buffer::with_capacity(bytes)?;
    serde_json::to_writer(&mut buffer, env).map_err(|_| OutOfMemory { bytes })?;
    Ok(buffer.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(payload: &str) -> Envelope {
        serde_json::from_value(serde_json::json!({
            "event_id": "01JDQ8F6ZC1Y0D3W9N7K2M4P5R", "event_type": "a.b.v1",
            "event_version": 1, "causation_id": "c\u{2028}\"", "correlation_id": null,
            "occurred_at": "2026-11-30T07:18:00Z", "payload": serde_json::from_str::<serde_json::Value>(payload).unwrap(),
        }))
        .unwrap()
    }

    #[test]
    fn the_envelope_is_built_in_a_buffer_of_its_exact_size() {
        let env = envelope(r#"{"x":[1,2,"é"]}"#);
        let json = envelope_json(&env).unwrap();
        assert_eq!(json, env.to_json().into_bytes());
        assert_eq!(json.capacity(), json.len());
        assert_eq!(json_len(&env), json.len());
    }

    #[test]
    fn a_buffer_that_cannot_be_had_is_an_error_naming_its_size() {
        let e = Buffer::with_capacity(usize::MAX).unwrap_err();
        assert_eq!(e.bytes, usize::MAX);
        let Outcome::Retry { reason, .. } = e.retry() else {
            panic!("out of memory is a retry")
        };
        assert!(reason.contains("out of memory"), "{reason}");
        let mut b = Buffer::with_capacity(1).unwrap();
        b.write_all(b"ab").unwrap();
        assert_eq!(b.0, b"ab");
    }
}
