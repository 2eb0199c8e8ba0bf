//! The overview's chart: events enqueued, delivered, retried and
//! dead-lettered per minute over the last hour, drawn as SVG on the server.
//!
//! Enqueued, delivered and dead-lettered are derived from the table
//! ([`outboxd::inspect::minute_counts`]), so the hour survives a restart of
//! `outboxd run` or the console. Retries leave no trace there: under
//! `outboxd run`, [`History`] samples the relay's retry counter
//! ([`outboxd::relay::MetricsSnapshot`]) at the end of each minute, so they
//! are shown since the relay started; under `outboxd console` (no relay in
//! the process) they are not shown.

use std::collections::VecDeque;
use std::sync::Mutex;

use maud::{html, Markup};
use outboxd::Timestamp;

/// Minutes on the chart.
pub(crate) const MINUTES: i64 = 60;

/// A minute, in the milliseconds of a [`Timestamp`].
const MINUTE_MS: i64 = 60_000;

/// The minute (counted from the Unix epoch) that `t` falls in: the chart's
/// unit of time.
pub(crate) fn minute_of(t: Timestamp) -> i64 {
    t.as_millis().div_euclid(MINUTE_MS)
}

/// When `minute` starts.
pub(crate) fn start_of(minute: i64) -> Timestamp {
    Timestamp::from_millis(minute.saturating_mul(MINUTE_MS))
}

/// When the chart's first minute starts, at `now`: the hour shown ends
/// with the minute in progress.
pub(crate) fn hour_start(now: Timestamp) -> Timestamp {
    start_of(minute_of(now) - MINUTES + 1)
}

/// Events per minute (or running totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Rows inserted into the outbox.
    pub(crate) enqueued: u64,
    /// Events marked delivered.
    pub(crate) delivered: u64,
    /// Retries scheduled.
    pub(crate) retried: u64,
    /// Events dead-lettered.
    pub(crate) dead: u64,
}

/// A minute as the table tells it (no retries there), as the chart's row.
pub(crate) fn table_row(m: outboxd::inspect::MinuteCounts) -> (i64, Counts) {
    let counts = Counts {
        enqueued: m.enqueued,
        delivered: m.delivered,
        retried: 0,
        dead: m.dead,
    };
    (m.minute, counts)
}

impl Counts {
    /// The relay's totals the chart takes from it: its retries (the table
    /// keeps no trace of them).
    pub(crate) fn of_relay(relay: &outboxd::relay::Metrics) -> Counts {
        Counts {
            retried: relay.snapshot().retried,
            ..Counts::default()
        }
    }

    /// `self - earlier`, per field (0 where a total went backwards).
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            enqueued: self.enqueued.saturating_sub(earlier.enqueued),
            delivered: self.delivered.saturating_sub(earlier.delivered),
            retried: self.retried.saturating_sub(earlier.retried),
            dead: self.dead.saturating_sub(earlier.dead),
        }
    }
}

/// The figures of the chart: one entry per minute, oldest first, the last
/// one the current minute; None where nothing was measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Series {
    /// The minute (since the Unix epoch) of the first entry.
    pub(crate) first_minute: i64,
    /// Per minute.
    pub(crate) minutes: Vec<Option<Counts>>,
    /// False when retries are not known (derived from the table).
    pub(crate) has_retries: bool,
}

/// A running relay's totals, sampled once a minute (the chart takes only
/// its retries: the other figures come from the table).
#[derive(Debug, Default)]
pub(crate) struct History {
    state: Mutex<HistoryState>,
}

#[derive(Debug, Default)]
struct HistoryState {
    /// (minute, counts during it), oldest first.
    minutes: VecDeque<(i64, Counts)>,
    /// The totals at the start of `.0`, the minute in progress.
    base: Option<(i64, Counts)>,
}

impl History {
    /// Records the totals seen at the start of `minute`; the growth since
    /// the previous record is the previous minute's figure. The first
    /// record of a minute is its start: a later one in the same minute (the
    /// sampler after [`History::series`] recorded on demand) changes nothing.
    pub(crate) fn record(&self, minute: i64, totals: Counts) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.record(minute, totals);
    }

    /// The last hour up to `now_minute`, the current minute measured
    /// against `live` totals. When the once-a-minute sample of this minute
    /// has not been taken yet (its thread wakes a few milliseconds late),
    /// `live` is recorded as this minute's start first, so the growth since
    /// the last sample is counted (in the last full minute) rather than
    /// left out of the hour.
    pub(crate) fn series(&self, now_minute: i64, live: Counts) -> Series {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.base.is_some_and(|(m, _)| m < now_minute) {
            st.record(now_minute, live);
        }
        let first_minute = now_minute - MINUTES + 1;
        let mut minutes = vec![None; MINUTES as usize];
        for (m, c) in &st.minutes {
            if let Some(slot) = slot(first_minute, *m) {
                minutes[slot] = Some(*c);
            }
        }
        if let Some((m, base)) = st.base {
            if m == now_minute {
                minutes[MINUTES as usize - 1] = Some(live.since(base));
            }
        }
        Series {
            first_minute,
            minutes,
            has_retries: true,
        }
    }
}

impl HistoryState {
    fn record(&mut self, minute: i64, totals: Counts) {
        match self.base {
            Some((base_minute, base)) if minute > base_minute => {
                // Missed ticks (a stall) fold into the last full minute.
                self.minutes.push_back((minute - 1, totals.since(base)));
                self.base = Some((minute, totals));
            }
            Some(_) => return,
            None => self.base = Some((minute, totals)),
        }
        while self
            .minutes
            .front()
            .is_some_and(|(m, _)| *m <= minute - MINUTES)
        {
            self.minutes.pop_front();
        }
    }
}

fn slot(first_minute: i64, minute: i64) -> Option<usize> {
    usize::try_from(minute - first_minute)
        .ok()
        .filter(|i| *i < MINUTES as usize)
}

impl Series {
    /// A series from per-minute rows `(minute, counts)` (the table's view):
    /// every minute of the hour is measured, zero where no row says so.
    pub(crate) fn from_rows(now_minute: i64, rows: &[(i64, Counts)]) -> Series {
        let first_minute = now_minute - MINUTES + 1;
        let mut minutes = vec![Some(Counts::default()); MINUTES as usize];
        for (m, c) in rows {
            if let Some(i) = slot(first_minute, *m) {
                minutes[i] = Some(*c);
            }
        }
        Series {
            first_minute,
            minutes,
            has_retries: false,
        }
    }

    /// The table's series with the retries `relay` counted (minutes before
    /// the relay started count none).
    pub(crate) fn with_retries_of(mut self, relay: &Series) -> Series {
        for (mine, theirs) in self.minutes.iter_mut().zip(&relay.minutes) {
            if let (Some(m), Some(r)) = (mine.as_mut(), theirs) {
                m.retried = r.retried;
            }
        }
        self.has_retries = true;
        self
    }

    /// The sum over the hour.
    pub(crate) fn total(&self) -> Counts {
        self.minutes
            .iter()
            .flatten()
            .fold(Counts::default(), |a, c| Counts {
                enqueued: a.enqueued + c.enqueued,
                delivered: a.delivered + c.delivered,
                retried: a.retried + c.retried,
                dead: a.dead + c.dead,
            })
    }
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 48.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;

/// The chart as inline SVG (no script, no style attribute: colours come
/// from the stylesheet's classes, which the CSP allows).
pub(crate) fn svg(series: &Series) -> Markup {
    type Pick = fn(&Counts) -> u64;
    let mut lines: Vec<(&str, &str, Pick)> = vec![
        ("enqueued", "s-enqueued", |c| c.enqueued),
        ("delivered", "s-delivered", |c| c.delivered),
        ("dead-lettered", "s-dead", |c| c.dead),
    ];
    if series.has_retries {
        lines.insert(2, ("retried", "s-retried", |c| c.retried));
    }
    let max = series
        .minutes
        .iter()
        .flatten()
        .flat_map(|c| [c.enqueued, c.delivered, c.retried, c.dead])
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * i as f64 / (MINUTES - 1) as f64;
    let y = |v: u64| TOP + plot_h - plot_h * v as f64 / max as f64;
    // One polyline per run of measured minutes, so gaps stay gaps.
    let runs = |pick: Pick| -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        for (i, m) in series.minutes.iter().enumerate() {
            match m {
                Some(c) => cur.push_str(&format!("{:.1},{:.1} ", x(i), y(pick(c)))),
                None if !cur.is_empty() => out.push(std::mem::take(&mut cur)),
                None => {}
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    };
    html! {
        svg class="chart" viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
            aria-label="Events per minute over the last hour" {
            title { "Events per minute over the last hour" }
            line class="axis" x1=(LEFT) y1=(TOP + plot_h) x2=(WIDTH - 8.0) y2=(TOP + plot_h) {}
            line class="axis" x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) {}
            line class="grid" x1=(LEFT) y1=(TOP) x2=(WIDTH - 8.0) y2=(TOP) {}
            text class="label" x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" { (max) }
            text class="label" x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" { "0" }
            text class="label" x=(LEFT) y=(HEIGHT - 6.0) { "60 min ago" }
            text class="label" x=(x(30)) y=(HEIGHT - 6.0) text-anchor="middle" { "30 min ago" }
            text class="label" x=(WIDTH - 8.0) y=(HEIGHT - 6.0) text-anchor="end" { "now" }
            @for (name, class, pick) in &lines {
                @for points in runs(*pick) {
                    polyline class={"series " (class)} points=(points) { title { (name) } }
                }
                // The latest minute as a dot, so a lone minute (a relay
                // that just started) still shows.
                @if let Some((i, Some(c))) = series.minutes.iter().enumerate().rev().find(|(_, m)| m.is_some()) {
                    circle class={"dot " (class)} cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(pick(c)))) r="3" { title { (name) ": " (pick(c)) } }
                }
            }
        }
        ul class="legend" {
            @for (name, class, _) in &lines {
                li { span class={"swatch " (class)} {} (name) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_counted_from_the_epoch_and_the_hour_ends_now() {
        let t: Timestamp = "2026-11-30T07:18:59.999Z".parse().unwrap();
        let m = minute_of(t);
        assert_eq!(start_of(m).to_string(), "2026-11-30T07:18:00.000Z");
        assert_eq!(start_of(m + 1).to_string(), "2026-11-30T07:19:00.000Z");
        assert_eq!(hour_start(t).to_string(), "2026-11-30T06:19:00.000Z");
        // Before the epoch a minute still starts at or before its times.
        assert_eq!(minute_of(Timestamp::from_millis(-1)), -1);
    }

    fn c(enqueued: u64, delivered: u64) -> Counts {
        Counts {
            enqueued,
            delivered,
            ..Counts::default()
        }
    }

    #[test]
    fn history_turns_totals_into_per_minute_figures() {
        let h = History::default();
        h.record(100, c(10, 5));
        h.record(101, c(25, 9));
        h.record(102, c(25, 20));
        let s = h.series(102, c(30, 21));
        assert_eq!(s.first_minute, 43);
        assert_eq!(s.minutes[56], None, "before the first record");
        assert_eq!(s.minutes[57], Some(c(15, 4)), "minute 100");
        assert_eq!(s.minutes[58], Some(c(0, 11)), "minute 101");
        assert_eq!(s.minutes[59], Some(c(5, 1)), "the current minute, live");
        assert_eq!(s.total(), c(20, 16));
    }

    #[test]
    fn a_late_sample_leaves_nothing_out_of_the_hour() {
        let h = History::default();
        h.record(100, c(10, 0));
        // Minute 101 has begun, its sample not yet taken: the 7 deliveries
        // since minute 100's start still count (in minute 100).
        let s = h.series(101, c(10, 7));
        assert_eq!(s.total(), c(0, 7), "{s:?}");
        assert_eq!(s.minutes[58], Some(c(0, 7)), "minute 100");
        // The late sample of minute 101 neither counts them twice nor loses
        // what came between.
        h.record(101, c(10, 9));
        assert_eq!(h.series(101, c(10, 9)).total(), c(0, 9));
    }

    #[test]
    fn history_keeps_one_hour() {
        let h = History::default();
        for m in 0..200 {
            h.record(m, c(m as u64 * 2, 0));
        }
        let s = h.series(199, c(398, 0));
        assert!(s.minutes.iter().all(|m| m.is_some()));
        assert_eq!(s.total().enqueued, 59 * 2);
        assert!(h.state.lock().unwrap().minutes.len() <= MINUTES as usize);
    }

    #[test]
    fn table_rows_fill_the_hour_and_the_svg_has_one_line_per_series() {
        let s = Series::from_rows(1000, &[(1000, c(3, 2)), (990, c(1, 1)), (900, c(9, 9))]);
        assert_eq!(s.total(), c(4, 3), "rows outside the hour are left out");
        let text = svg(&s).into_string();
        assert_eq!(text.matches("<polyline").count(), 3, "{text}");
        assert_eq!(text.matches("<circle").count(), 3, "{text}");
        assert!(
            !text.contains("retried"),
            "the table has no retries: {text}"
        );
        assert!(!text.contains("style="), "{text}");
        let relay = History::default().series(1000, Counts::default());
        assert!(svg(&relay).into_string().contains("retried"));
    }

    #[test]
    fn the_table_gives_the_hour_and_the_relay_its_retries() {
        let table = Series::from_rows(1000, &[(990, c(4, 3)), (1000, c(1, 1))]);
        let h = History::default();
        h.record(995, Counts::default());
        let relay = h.series(
            1000,
            Counts {
                enqueued: 99,
                delivered: 99,
                retried: 2,
                dead: 0,
            },
        );
        let s = table.with_retries_of(&relay);
        assert!(s.has_retries);
        assert_eq!(
            s.total(),
            Counts {
                enqueued: 5,
                delivered: 4,
                retried: 2,
                dead: 0,
            },
            "deliveries from before the relay started, retries since: {s:?}"
        );
        assert_eq!(s.minutes[49], Some(c(4, 3)), "minute 990, before the relay");
    }
}
