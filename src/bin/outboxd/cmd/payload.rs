//! The payload arguments `enqueue` and `dead edit` share: `--payload`,
//! `--payload-file` (a file, or `-` for stdin) and `--max-payload-bytes`,
//! read and bounded in one place.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::exit::Failure;

/// `--payload JSON | --payload-file FILE` and `--max-payload-bytes`.
#[derive(Debug, clap::Args)]
pub(crate) struct PayloadArgs {
    /// The payload as JSON text.
    #[arg(long, value_name = "JSON", conflicts_with = "payload_file")]
    pub(crate) payload: Option<String>,
    /// Read the JSON payload from a file, or from stdin with `-`.
    #[arg(long, value_name = "FILE")]
    pub(crate) payload_file: Option<PathBuf>,
    /// The largest payload accepted, in bytes of JSON.
    #[arg(long, value_name = "BYTES", default_value_t = outboxd::enqueue::DEFAULT_MAX_PAYLOAD_BYTES)]
    pub(crate) max_payload_bytes: usize,
}

impl PayloadArgs {
    /// The payload given, None when neither flag is; one larger than
    /// `--max-payload-bytes` is refused with its size (exit 5).
    pub(crate) fn read(&self) -> Result<Option<String>> {
        let limit = self.max_payload_bytes;
        let payload = match (&self.payload, &self.payload_file) {
            (Some(json), _) => json.clone(),
            (None, Some(file)) => read_payload(file, limit)?,
            (None, None) => return Ok(None),
        };
        if payload.len() > limit {
            return Err(too_large(payload.len().to_string(), limit).into());
        }
        Ok(Some(payload))
    }
}

/// How far past the limit an oversized payload is counted (not kept), to
/// say its size: an endless stream on stdin must still end the command.
const SIZE_COUNT_CAP: u64 = 1 << 30;

/// Reads a payload file (`-` for stdin), keeping at most one byte past the
/// limit so a huge or endless stream cannot exhaust memory; an oversized
/// one is counted to the end (up to 1 GiB) so the error gives its size.
fn read_payload(file: &Path, limit: usize) -> Result<String> {
    let name = if file == Path::new("-") {
        "stdin".to_string()
    } else {
        file.display().to_string()
    };
    let cannot_read =
        |e: std::io::Error| Failure::input(format!("cannot read the payload from {name}: {e}"));
    let mut reader: Box<dyn Read> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(file).map_err(cannot_read)?)
    };
    let mut bytes = Vec::new();
    (&mut reader)
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() > limit {
        let rest = std::io::copy(&mut reader.take(SIZE_COUNT_CAP), &mut std::io::sink())
            .map_err(cannot_read)?;
        let size = if rest == SIZE_COUNT_CAP {
            format!("more than {}", bytes.len() as u64 + rest)
        } else {
            (bytes.len() as u64 + rest).to_string()
        };
        return Err(too_large(size, limit).into());
    }
    String::from_utf8(bytes).map_err(|_| {
        Failure::input(format!(
            "the payload in {name} is not UTF-8 text, so not JSON"
        ))
        .into()
    })
}

fn too_large(size: String, limit: usize) -> Failure {
    Failure::input(format!(
        "payload is {size} bytes, larger than the limit of {limit} bytes \
         (raise it with --max-payload-bytes)"
    ))
}
