//! What the operator commands share: the "not found" exit code, durations
//! for people, and a progress line for long operations. (Opening the
//! database: [`super::database`].)

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::exit::Failure;

/// Turns the library's "not found" into invalid input (exit 5) with a hint
/// on where to look; other errors pass through unchanged.
pub(crate) fn not_found(hint: &'static str) -> impl FnOnce(outboxd::Error) -> anyhow::Error {
    move |e| match e {
        outboxd::Error::NotFound { .. } => Failure::input(format!("{e}; {hint}")).into(),
        other => other.into(),
    }
}

/// `n` and the noun that goes with it: "1 dead letter", "3 dead letters".
/// The one pluraliser of the binary (with [`noun`], for a page that sets
/// the number apart).
pub(crate) fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", noun(n, one, many))
}

/// The noun that goes with `n`: `one` for 1, else `many`.
pub(crate) fn noun<'a>(n: impl Into<u64>, one: &'a str, many: &'a str) -> &'a str {
    if n.into() == 1 {
        one
    } else {
        many
    }
}

/// A duration for people (`850ms`, `5m 3s`, `7d`): the library's one
/// formatter, which its setting errors use too, so every message echoes a
/// duration in the units a person writes.
pub(crate) use outboxd::clock::format_duration as human;

/// A one-line progress display on stderr, redrawn in place with `\r`.
/// Silent unless stderr is a terminal, so scripts, pipes, cron mail and
/// journald never see it. Redraws at most every 100 ms and erases itself
/// when done, leaving the command's own output as the only trace.
pub(crate) struct Progress {
    out: Option<Box<dyn Write>>,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    /// A progress line on stderr, if stderr is a terminal.
    pub(crate) fn stderr() -> Progress {
        let err = std::io::stderr();
        let out: Option<Box<dyn Write>> =
            err.is_terminal().then(|| Box::new(err) as Box<dyn Write>);
        Progress::to(out)
    }

    /// A progress line on `out`, or none.
    fn to(out: Option<Box<dyn Write>>) -> Progress {
        Progress {
            out,
            last: None,
            drawn: false,
        }
    }

    /// Shows `text` (unless the last redraw was under 100 ms ago).
    pub(crate) fn show(&mut self, text: &str) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(Instant::now());
        // \x1b[K clears what a longer previous line left behind. Progress
        // is a courtesy: a failed write to the terminal is ignored.
        let _ = write!(out, "\r{text}\x1b[K");
        let _ = out.flush();
        self.drawn = true;
    }

    /// Erases the line, if one was drawn.
    pub(crate) fn finish(&mut self) {
        if let (Some(out), true) = (self.out.as_mut(), self.drawn) {
            let _ = write!(out, "\r\x1b[K");
            let _ = out.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `done/total` as a bar: `[#####.....] 50% (500/1000)`.
pub(crate) fn bar(done: u64, total: u64) -> String {
    const WIDTH: u64 = 30;
    let filled = (done.min(total) * WIDTH)
        .checked_div(total)
        .unwrap_or(WIDTH);
    let percent = (done.min(total) * 100).checked_div(total).unwrap_or(100);
    format!(
        "[{}{}] {percent:>3}% ({done}/{total})",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn bar_fills_in_proportion() {
        assert_eq!(bar(0, 10), format!("[{}]   0% (0/10)", ".".repeat(30)));
        assert_eq!(
            bar(5, 10),
            format!("[{}{}]  50% (5/10)", "#".repeat(15), ".".repeat(15))
        );
        assert_eq!(bar(0, 0), format!("[{}] 100% (0/0)", "#".repeat(30)));
    }

    #[test]
    fn progress_redraws_in_place_throttles_and_erases_itself() {
        let buf = Shared::default();
        let mut p = Progress::to(Some(Box::new(buf.clone())));
        p.show("one");
        p.show("two"); // within 100 ms of the first: skipped
        p.finish();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "\rone\x1b[K\r\x1b[K");
    }

    #[test]
    fn no_terminal_no_output() {
        let mut p = Progress::to(None);
        p.show("one");
        p.finish();
        assert!(!p.drawn);
    }
}
