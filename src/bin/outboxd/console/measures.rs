//! The measures taken off the request path: the status and its health
//! verdict, the overview's extras, and the chart's per-minute samples.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use outboxd::relay::Metrics;
use outboxd::router::Subscriptions;
use outboxd::status::Thresholds;
use outboxd::Timestamp;

use super::app::{Extras, Pool, StatusView};
use super::chart::{self, Counts, History};

/// The status now and its health verdict against `thresholds`: the one
/// place the console judges health (the overview's banner and `/healthz`
/// show what this returns).
pub(super) fn measure_status(pool: &Pool, thresholds: &Thresholds) -> StatusView {
    let conn = pool.get()?;
    let status = outboxd::status::status(&conn, Timestamp::now())?;
    let verdict = crate::config::alerts::verdict(&conn, thresholds, status.now)?;
    Ok((status, verdict))
}

/// The overview's extras now: each configured consumer's backlog (when
/// there are consumers), and the chart's rows from the table.
pub(super) fn measure_extras(pool: &Pool, consumers: &Subscriptions) -> Extras {
    let conn = match pool.get() {
        Ok(c) => c,
        Err(e) => {
            return Extras {
                backlog: Some(Err(e.into())),
                chart_rows: None,
            }
        }
    };
    let since = chart::hour_start(Timestamp::now()).as_millis();
    Extras {
        backlog: (!consumers.is_empty())
            .then(|| outboxd::inspect::consumer_backlog(&conn, consumers).map_err(Into::into)),
        chart_rows: Some(
            outboxd::inspect::minute_counts(&conn, since)
                .map(|rows| rows.into_iter().map(chart::table_row).collect())
                .map_err(Into::into),
        ),
    }
}

/// Starts the thread that records the relay's retries at the start of each
/// minute, for the chart.
///
/// The first record is taken here, before the server answers anything, with
/// the relay's counters at zero (they count from the relay's start, a moment
/// ago). Taken by the thread, it could come after the first retries on a
/// busy machine, and they would then count as before the hour.
pub(super) fn sample_every_minute(relay: Arc<Metrics>) -> Result<Arc<History>> {
    let history = Arc::new(History::default());
    let now = Timestamp::now();
    history.record(chart::minute_of(now), Counts::default());
    let h = Arc::downgrade(&history);
    std::thread::Builder::new()
        .name("outboxd-chart".into())
        .spawn(move || {
            let mut now = now;
            loop {
                // The next minute's start: a timer, not synchronisation.
                let next = chart::start_of(chart::minute_of(now) + 1);
                std::thread::sleep(next.since(Timestamp::now()) + Duration::from_millis(5));
                now = Timestamp::now();
                let Some(history) = h.upgrade() else { return };
                history.record(chart::minute_of(now), Counts::of_relay(&relay));
            }
        })?;
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::app::MeasureError;
    use outboxd::connection::ConnectionManager;

    #[test]
    fn a_status_that_cannot_be_read_says_why_in_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&db).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .build(ConnectionManager::read_only(&db))
            .unwrap();
        let thresholds = crate::config::alerts::without_config();
        assert!(measure_status(&pool, &thresholds).is_ok());
        conn.execute_batch("DROP TABLE event_outbox").unwrap();
        match measure_status(&pool, &thresholds) {
            Err(MeasureError::Read(e)) => assert!(e.to_string().contains("event_outbox"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_chart_counts_deliveries_made_before_the_console_started() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let mut conn = outboxd::connection::open(&db).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        let tx = conn.transaction().unwrap();
        let events: Vec<_> = (0..7)
            .map(|n| {
                outboxd::Event::new("article.created.v1", &serde_json::json!({ "n": n })).unwrap()
            })
            .collect();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        let relay = outboxd::Relay::builder(&db)
            .consumer("c", ["*"], |_: &outboxd::Delivery| {
                outboxd::Outcome::Delivered
            })
            .build()
            .unwrap()
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while relay.metrics().delivered < 7 {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay delivered nothing"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let metrics = relay.metrics_source();
        relay.shutdown(Duration::from_secs(10)).unwrap();
        // The console starts after the relay has delivered and stopped (a
        // restart): the deliveries are the table's, in the hour.
        let pool = r2d2::Pool::builder()
            .max_size(2)
            .build(ConnectionManager::read_only(&db))
            .unwrap();
        let rows = match measure_extras(&pool, &Subscriptions::default()).chart_rows {
            Some(Ok(rows)) => rows,
            other => panic!("{other:?}"),
        };
        let now_minute = chart::minute_of(Timestamp::now());
        let history = sample_every_minute(metrics).unwrap();
        let series = chart::Series::from_rows(now_minute, &rows)
            .with_retries_of(&history.series(now_minute, Counts::default()));
        assert_eq!(series.total().delivered, 7);
        assert_eq!(series.total().enqueued, 7);
    }
}
