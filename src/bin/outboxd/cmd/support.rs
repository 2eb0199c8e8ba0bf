//! What the operator commands share: opening a migrated database for
//! writing without touching one they must refuse, the "not found" exit code,
//! durations for people, and a progress line for long operations.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use rusqlite::Connection;

use super::{open_for_writing, require_existing};
use crate::exit::Failure;

/// Opens an existing, migrated database for writing. The schema is checked
/// on a read-only connection first: opening for writing switches the
/// journal mode to WAL, a write that a database the command is about to
/// refuse must not get.
pub fn open_migrated(path: &Path) -> Result<Connection> {
    require_existing(path)?;
    outboxd::schema::ensure_current(&outboxd::connection::open_read_only(path)?)?;
    open_for_writing(path)
}

/// Opens an existing, migrated database read-only.
pub fn open_migrated_read_only(path: &Path) -> Result<Connection> {
    let conn = outboxd::connection::open_read_only(path)?;
    outboxd::schema::ensure_current(&conn)?;
    Ok(conn)
}

/// Turns the library's "not found" into invalid input (exit 5) with a hint
/// on where to look; other errors pass through unchanged.
pub fn not_found(hint: &'static str) -> impl FnOnce(outboxd::Error) -> anyhow::Error {
    move |e| match e {
        outboxd::Error::NotFound { .. } => Failure::input(format!("{e}; {hint}")).into(),
        other => other.into(),
    }
}

/// A duration for people, in its two largest units: `850ms`, `42s`,
/// `5m 3s`, `2h 10m`, `3d 4h`; a zero second unit is left out (`5m`, `7d`).
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let s = ms / 1000;
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    let two = |big: u128, big_unit: &str, small: u128, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit} {small}{small_unit}")
        }
    };
    match () {
        _ if s == 0 => format!("{ms}ms"),
        _ if m == 0 => format!("{s}s"),
        _ if h == 0 => two(m, "m", s % 60, "s"),
        _ if days == 0 => two(h, "h", m % 60, "m"),
        _ => two(days, "d", h % 24, "h"),
    }
}

/// A one-line progress display on stderr, redrawn in place with `\r`.
/// Silent unless stderr is a terminal, so scripts, pipes, cron mail and
/// journald never see it. Redraws at most every 100 ms and erases itself
/// when done, leaving the command's own output as the only trace.
pub struct Progress {
    out: Option<Box<dyn Write>>,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    /// A progress line on stderr, if stderr is a terminal.
    pub fn stderr() -> Progress {
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
    pub fn show(&mut self, text: &str) {
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
    pub fn finish(&mut self) {
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
pub fn bar(done: u64, total: u64) -> String {
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
    fn human_durations() {
        let cases = [
            (850, "850ms"),
            (42_000, "42s"),
            (303_000, "5m 3s"),
            (7_800_000, "2h 10m"),
            (273_600_000, "3d 4h"),
            (300_000, "5m"),
            (604_800_000, "7d"),
        ];
        for (ms, want) in cases {
            assert_eq!(human(Duration::from_millis(ms)), want);
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
