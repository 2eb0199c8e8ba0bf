//! The console's reads: every SQL statement its pages run, each bounded so a
//! page costs the same on a million events as on a hundred.
//!
//! Lists page by key, never by OFFSET: events by row id (newest first), dead
//! letters by (finished_at, id) on the index of finished rows. Filters that
//! no index serves (a type pattern, a tenant, a consumer's progress, a time
//! range) are applied while walking the key order, and a page stops after
//! [`SCAN_BUDGET`] rows, offering to go on from where it stopped. The test
//! `no_page_query_scans_a_whole_table` runs EXPLAIN QUERY PLAN on every
//! statement here. The dedup ledger is read through `outboxd::dedup` (its
//! key, `has`, `progress`: look-ups on its primary key, tested there), the
//! one module that knows its layout.
//!
//! Text columns are read whatever type a foreign producer stored in them:
//! the console shows a row it cannot parse rather than failing.

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Row};

use outboxd::router::{Pattern, Subscriptions};
use outboxd::{dedup, Timestamp};

use super::chart::Counts;

/// Rows a list page examines at most before it stops and offers "go on".
pub const SCAN_BUDGET: usize = 5_000;

/// Rows on one list page.
pub const PAGE: usize = 50;

/// The most of a payload shown on an event's page.
pub const PAYLOAD_CAP: usize = 64 * 1024;

/// Any stored value as text (a foreign producer may have bound a number or
/// a blob where text belongs).
fn text(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
    })
}

// ---------------------------------------------------------------------------
// Events.

/// One row of the events list.
#[derive(Debug, Clone)]
pub struct EventRow {
    /// Row id.
    pub id: i64,
    /// Event id (None for a legacy row).
    pub event_id: Option<String>,
    /// Type as stored.
    pub event_type: String,
    /// Tenant.
    pub tenant: Option<String>,
    /// pending, delivered or dead.
    pub status: String,
    /// Failed attempts.
    pub attempts: i64,
    /// When it is (or was) due, ms.
    pub available_at: i64,
    /// Lease end, ms, when claimed.
    pub lease_until: Option<i64>,
    /// When it occurred, ms.
    pub occurred_at: i64,
    /// When it finished, ms.
    pub finished_at: Option<i64>,
    /// The start of the last error.
    pub last_error: Option<String>,
}

impl EventRow {
    /// The state an operator thinks in: due, delayed, leased, delivered, dead.
    pub fn state(&self, now: Timestamp) -> &'static str {
        match self.status.as_str() {
            "delivered" => "delivered",
            "dead" => "dead",
            _ if self.lease_until.is_some() => "leased",
            _ if self.available_at <= now.as_millis() => "due",
            _ => "delayed",
        }
    }
}

fn event_row(r: &Row<'_>) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        id: r.get(0)?,
        event_id: text(r, 1)?,
        event_type: text(r, 2)?.unwrap_or_default(),
        tenant: text(r, 3)?,
        status: text(r, 4)?.unwrap_or_default(),
        attempts: r.get(5)?,
        available_at: r.get(6)?,
        lease_until: r.get(7)?,
        occurred_at: r.get(8)?,
        finished_at: r.get(9)?,
        last_error: text(r, 10)?,
    })
}

/// The states the events list filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    /// Any pending row.
    Pending,
    /// Pending, not leased, due.
    Due,
    /// Pending, not leased, not yet due.
    Delayed,
    /// Claimed by a relay.
    Leased,
    /// Pending after at least one failed attempt.
    Retrying,
    /// Delivered.
    Delivered,
    /// Dead-lettered.
    Dead,
}

impl StateFilter {
    /// Every filter, with its name in URLs.
    pub const ALL: [(StateFilter, &'static str); 7] = [
        (StateFilter::Pending, "pending"),
        (StateFilter::Due, "due"),
        (StateFilter::Delayed, "delayed"),
        (StateFilter::Leased, "leased"),
        (StateFilter::Retrying, "retrying"),
        (StateFilter::Delivered, "delivered"),
        (StateFilter::Dead, "dead"),
    ];

    /// The filter named `s`.
    pub fn parse(s: &str) -> Option<StateFilter> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(f, _)| *f)
    }

    fn matches(self, row: &EventRow, now: Timestamp) -> bool {
        let state = row.state(now);
        match self {
            StateFilter::Pending => row.status == "pending",
            StateFilter::Due => state == "due",
            StateFilter::Delayed => state == "delayed",
            StateFilter::Leased => state == "leased",
            StateFilter::Retrying => row.status == "pending" && row.attempts > 0,
            StateFilter::Delivered => state == "delivered",
            StateFilter::Dead => state == "dead",
        }
    }
}

/// What the events list shows.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// State.
    pub state: Option<StateFilter>,
    /// Type pattern.
    pub event_type: Option<Pattern>,
    /// Exact tenant.
    pub tenant: Option<String>,
    /// A consumer, with `missing`: rows it has (false) or has not (true)
    /// delivered.
    pub consumer: Option<String>,
    /// See `consumer`.
    pub missing: bool,
    /// Occurred at or after.
    pub since: Option<Timestamp>,
    /// Occurred before.
    pub until: Option<Timestamp>,
    /// Only rows with a smaller id (the page's key).
    pub before: Option<i64>,
}

/// One page of the events list.
#[derive(Debug, Clone, Default)]
pub struct EventsPage {
    /// Matching rows, newest first.
    pub rows: Vec<EventRow>,
    /// The key to go on from, when there may be more.
    pub next_before: Option<i64>,
    /// Rows examined.
    pub scanned: usize,
}

const SQL_EVENTS_WALK: &str = "SELECT id, event_id, event_type, tenant_id, status, attempts, \
     available_at, lease_until, occurred_at, finished_at, substr(last_error, 1, 300) \
     FROM event_outbox WHERE id < ?1 ORDER BY id DESC LIMIT ?2";

/// Walks rows newest first from `f.before`, keeping those that match,
/// until a page is full or [`SCAN_BUDGET`] rows were examined.
pub fn events_page(
    conn: &Connection,
    f: &EventFilter,
    now: Timestamp,
) -> rusqlite::Result<EventsPage> {
    let mut walk = conn.prepare_cached(SQL_EVENTS_WALK)?;
    let mut page = EventsPage::default();
    let mut rows = walk.query(params![f.before.unwrap_or(i64::MAX), SCAN_BUDGET as i64])?;
    let mut last_seen = None;
    while let Some(r) = rows.next()? {
        let row = event_row(r)?;
        page.scanned += 1;
        last_seen = Some(row.id);
        if !matches(&row, f, now) {
            continue;
        }
        if let Some(consumer) = &f.consumer {
            let key = dedup::key(row.event_id.as_deref(), row.id);
            let has = dedup::has(conn, &key, consumer)?;
            if has == f.missing {
                continue;
            }
        }
        page.rows.push(row);
        if page.rows.len() == PAGE {
            break;
        }
    }
    // More may follow unless the walk reached the first row.
    let walked_out = page.rows.len() < PAGE && page.scanned < SCAN_BUDGET;
    page.next_before = if walked_out { None } else { last_seen };
    Ok(page)
}

fn matches(row: &EventRow, f: &EventFilter, now: Timestamp) -> bool {
    f.state.is_none_or(|s| s.matches(row, now))
        && f.event_type
            .as_ref()
            .is_none_or(|p| p.matches(&row.event_type))
        && f.tenant
            .as_ref()
            .is_none_or(|t| row.tenant.as_deref() == Some(t.as_str()))
        && f.since.is_none_or(|t| row.occurred_at >= t.as_millis())
        && f.until.is_none_or(|t| row.occurred_at < t.as_millis())
}

/// Everything about one event, for its page.
#[derive(Debug, Clone)]
pub struct EventDetail {
    /// The list's columns.
    pub row: EventRow,
    /// Version column as stored.
    pub event_version: Option<String>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Causation id.
    pub causation_id: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// When it was inserted, ms.
    pub created_at: i64,
    /// The whole last error.
    pub last_error: Option<String>,
    /// Up to [`PAYLOAD_CAP`] bytes of the payload.
    pub payload: String,
    /// The payload's full size in bytes.
    pub payload_bytes: i64,
    /// Why the relay cannot build its envelope, if it cannot (only checked
    /// for payloads within the cap).
    pub envelope_error: Option<String>,
    /// (consumer, delivered at ms) from the dedup ledger.
    pub progress: Vec<(String, i64)>,
    /// Other rows carrying the same event id.
    pub same_id: Vec<i64>,
}

const SQL_EVENT: &str = "SELECT id, event_id, event_type, tenant_id, status, attempts, \
     available_at, lease_until, occurred_at, finished_at, last_error, \
     event_version, idempotency_key, ordering_key, causation_id, correlation_id, created_at, \
     substr(CAST(payload AS BLOB), 1, ?2), length(CAST(payload AS BLOB)) \
     FROM event_outbox WHERE id = ?1";

// An id in any letter case: foreign producers may write any, and the
// event-id index compares under NOCASE (schema version 6).
const SQL_ROWS_WITH_EVENT_ID: &str =
    "SELECT id FROM event_outbox WHERE event_id = ?1 COLLATE NOCASE ORDER BY id LIMIT 20";

/// Finds an event by row id (digits) or event id (a ULID in any case).
pub fn find_event(conn: &Connection, id: &str) -> rusqlite::Result<Option<EventDetail>> {
    let row_id = if let Ok(n) = id.parse::<i64>() {
        Some(n)
    } else {
        conn.prepare_cached(SQL_ROWS_WITH_EVENT_ID)?
            .query_row([id], |r| r.get(0))
            .optional()?
    };
    let Some(row_id) = row_id else {
        return Ok(None);
    };
    let detail = conn
        .prepare_cached(SQL_EVENT)?
        .query_row(params![row_id, PAYLOAD_CAP as i64], |r| {
            let payload_bytes: i64 = r.get(18)?;
            let payload = match r.get_ref(17)? {
                ValueRef::Blob(b) | ValueRef::Text(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            let mut row = event_row(r)?;
            let last_error = text(r, 10)?;
            row.last_error = last_error.clone();
            // The relay's own check, for a payload small enough to load.
            let envelope_error = if payload_bytes as usize <= PAYLOAD_CAP {
                outboxd::envelope::check_row(&outboxd::envelope::RawRow {
                    row_id,
                    event_id: r.get_ref(1)?,
                    event_type: r.get_ref(2)?,
                    event_version: r.get_ref(11)?,
                    causation_id: r.get_ref(14)?,
                    correlation_id: r.get_ref(15)?,
                    payload: r.get_ref(17)?,
                    occurred_at: r.get_ref(8)?,
                    created_at: r.get_ref(16)?,
                    tenant_id: r.get_ref(3)?,
                })
                .err()
                .map(|e| e.to_string())
            } else {
                None
            };
            Ok(EventDetail {
                row,
                event_version: text(r, 11)?,
                idempotency_key: text(r, 12)?,
                ordering_key: text(r, 13)?,
                causation_id: text(r, 14)?,
                correlation_id: text(r, 15)?,
                created_at: r.get(16)?,
                last_error,
                payload,
                payload_bytes,
                envelope_error,
                progress: Vec::new(),
                same_id: Vec::new(),
            })
        })
        .optional()?;
    let Some(mut detail) = detail else {
        return Ok(None);
    };
    let key = dedup::key(detail.row.event_id.as_deref(), detail.row.id);
    detail.progress = dedup::progress(conn, &key)?
        .into_iter()
        .map(|(consumer, at)| (consumer, at.as_millis()))
        .collect();
    if let Some(event_id) = &detail.row.event_id {
        detail.same_id = conn
            .prepare_cached(SQL_ROWS_WITH_EVENT_ID)?
            .query_map([event_id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?
            .into_iter()
            .filter(|id| *id != detail.row.id)
            .collect();
    }
    Ok(Some(detail))
}

// ---------------------------------------------------------------------------
// Dead letters.

/// One page of dead letters, newest first.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    /// The rows.
    pub rows: Vec<EventRow>,
    /// The key to go on from: (finished_at, id).
    pub next: Option<(i64, i64)>,
}

const SQL_DEAD_WALK: &str = "SELECT id, event_id, event_type, tenant_id, status, attempts, \
     available_at, lease_until, occurred_at, finished_at, substr(last_error, 1, 300) \
     FROM event_outbox WHERE status <> 'pending' AND status = 'dead' \
     AND (finished_at, id) < (?1, ?2) ORDER BY finished_at DESC, id DESC LIMIT ?3";

const SQL_DEAD_TOTAL: &str =
    "SELECT count(*) FROM event_outbox WHERE status <> 'pending' AND status = 'dead'";

/// How many dead letters there are (a count over the index of finished
/// rows, its dead part only).
pub fn dead_total(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached(SQL_DEAD_TOTAL)?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Dead letters after the key `after` (newest first), of types matching
/// `pattern`, within [`SCAN_BUDGET`].
pub fn dead_page(
    conn: &Connection,
    pattern: Option<&Pattern>,
    after: Option<(i64, i64)>,
) -> rusqlite::Result<DeadPage> {
    let (at, id) = after.unwrap_or((i64::MAX, i64::MAX));
    let mut stmt = conn.prepare_cached(SQL_DEAD_WALK)?;
    let mut rows = stmt.query(params![at, id, SCAN_BUDGET as i64])?;
    let mut page = DeadPage::default();
    let (mut scanned, mut last) = (0, None);
    while let Some(r) = rows.next()? {
        let row = event_row(r)?;
        scanned += 1;
        last = Some((row.finished_at.unwrap_or(0), row.id));
        if pattern.is_none_or(|p| p.matches(&row.event_type)) {
            page.rows.push(row);
            if page.rows.len() == PAGE {
                break;
            }
        }
    }
    let walked_out = page.rows.len() < PAGE && scanned < SCAN_BUDGET;
    page.next = if walked_out { None } else { last };
    Ok(page)
}

// ---------------------------------------------------------------------------
// The overview's extras.

/// Rows examined at most per kind when counting each consumer's retrying
/// and dead events (a bound for the background measure, not a page).
pub const CONSUMER_SCAN: usize = 100_000;

const SQL_RETRYING_ROWS: &str = "SELECT id, event_id, event_type FROM event_outbox \
     WHERE status = 'pending' AND attempts > 0 LIMIT ?1";

const SQL_DEAD_ROWS: &str = "SELECT id, event_id, event_type FROM event_outbox \
     WHERE status <> 'pending' AND status = 'dead' LIMIT ?1";

/// Each consumer's retrying and dead events that it has not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// (retrying, dead) per consumer, in the order given.
    pub per_consumer: Vec<(u64, u64)>,
    /// True when [`CONSUMER_SCAN`] cut the count short.
    pub truncated: bool,
}

/// Counts each consumer's [`Backlog`], routing each row's type by the
/// library's router.
pub fn consumer_backlog(conn: &Connection, consumers: &Subscriptions) -> rusqlite::Result<Backlog> {
    let mut counts = vec![(0u64, 0u64); consumers.len()];
    let mut truncated = false;
    for (sql, dead) in [(SQL_RETRYING_ROWS, false), (SQL_DEAD_ROWS, true)] {
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query([CONSUMER_SCAN as i64 + 1])?;
        let mut n = 0;
        while let Some(r) = rows.next()? {
            n += 1;
            if n > CONSUMER_SCAN {
                truncated = true;
                break;
            }
            let (id, event_id, ty): (i64, Option<String>, Option<String>) =
                (r.get(0)?, text(r, 1)?, text(r, 2)?);
            let ty = ty.unwrap_or_default();
            let key = dedup::key(event_id.as_deref(), id);
            for (i, sub) in consumers.iter().enumerate() {
                if sub.takes(&ty) && !dedup::has(conn, &key, &sub.name)? {
                    if dead {
                        counts[i].1 += 1;
                    } else {
                        counts[i].0 += 1;
                    }
                }
            }
        }
    }
    Ok(Backlog {
        per_consumer: counts,
        truncated,
    })
}

// ---------------------------------------------------------------------------
// The chart, from the table.

const SQL_FINISHED_PER_MINUTE: &str = "SELECT finished_at / 60000, count(*) FROM event_outbox \
     WHERE status <> 'pending' AND status = ?1 AND finished_at >= ?2 GROUP BY 1";

// Two subqueries: each is one seek at an end of the key (min() and max()
// over one table together would walk it).
const SQL_ID_RANGE: &str =
    "SELECT (SELECT min(id) FROM event_outbox), (SELECT max(id) FROM event_outbox)";

const SQL_FIRST_ROW_FROM: &str =
    "SELECT id, created_at FROM event_outbox WHERE id >= ?1 ORDER BY id LIMIT 1";

const SQL_CREATED_PER_MINUTE: &str = "SELECT created_at / 60000, count(*) FROM event_outbox \
     WHERE id >= ?1 AND created_at >= ?2 GROUP BY 1";

const SQL_ENQUEUED_TOTAL: &str = "SELECT seq FROM sqlite_sequence WHERE name = 'event_outbox'";

/// Rows ever inserted into the outbox (its AUTOINCREMENT sequence).
pub fn enqueued_total(conn: &Connection) -> rusqlite::Result<u64> {
    let seq: Option<i64> = conn
        .prepare_cached(SQL_ENQUEUED_TOTAL)?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(seq.map_or(0, |s| u64::try_from(s).unwrap_or(0)))
}

/// Per minute since `since` (ms): rows inserted, delivered and
/// dead-lettered, as the table tells. Inserts are counted from the first
/// row created since then, found by a binary search on the row id (ids
/// follow commit order, so creation times rise with them), which needs no
/// index on `created_at`.
pub fn minute_counts(conn: &Connection, since: i64) -> rusqlite::Result<Vec<(i64, Counts)>> {
    let mut by_minute = std::collections::BTreeMap::<i64, Counts>::new();
    let mut finished = conn.prepare_cached(SQL_FINISHED_PER_MINUTE)?;
    for status in ["delivered", "dead"] {
        let rows = finished.query_map(params![status, since], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (m, n) = row?;
            let c = by_minute.entry(m).or_default();
            let n = u64::try_from(n).unwrap_or(0);
            if status == "dead" {
                c.dead = n;
            } else {
                c.delivered = n;
            }
        }
    }
    let (lo, hi): (Option<i64>, Option<i64>) = conn
        .prepare_cached(SQL_ID_RANGE)?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if let (Some(mut lo), Some(mut hi)) = (lo, hi) {
        // The first id whose row was created at or after `since`.
        let mut first = conn.prepare_cached(SQL_FIRST_ROW_FROM)?;
        hi += 1;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let found: Option<(i64, i64)> = first
                .query_row([mid], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match found {
                Some((id, created)) if created < since => lo = id + 1,
                _ => hi = mid,
            }
        }
        let mut created = conn.prepare_cached(SQL_CREATED_PER_MINUTE)?;
        let rows = created.query_map(params![lo, since], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (m, n) = row?;
            by_minute.entry(m).or_default().enqueued = u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(by_minute.into_iter().collect())
}

/// Every statement above, for the query-plan test.
#[cfg(test)]
pub const ALL: &[(&str, &str)] = &[
    ("events walk", SQL_EVENTS_WALK),
    ("event", SQL_EVENT),
    ("rows with event id", SQL_ROWS_WITH_EVENT_ID),
    ("dead walk", SQL_DEAD_WALK),
    ("dead total", SQL_DEAD_TOTAL),
    ("retrying rows", SQL_RETRYING_ROWS),
    ("dead rows", SQL_DEAD_ROWS),
    ("finished per minute", SQL_FINISHED_PER_MINUTE),
    ("id range", SQL_ID_RANGE),
    ("first row from", SQL_FIRST_ROW_FROM),
    ("created per minute", SQL_CREATED_PER_MINUTE),
    ("enqueued total", SQL_ENQUEUED_TOTAL),
];

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd::EventId;

    const T0: i64 = 1_764_487_080_000;

    fn db() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = outboxd::connection::open(dir.path().join("q.db")).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        (dir, conn)
    }

    fn insert(conn: &Connection, ty: &str, status: &str, at: i64, tenant: Option<&str>) -> i64 {
        conn.execute(
            "INSERT INTO event_outbox (event_id, event_type, tenant_id, status, occurred_at,
                 created_at, available_at, finished_at, attempts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?5, ?6, ?7)",
            params![
                EventId::new().to_string(),
                ty,
                tenant,
                status,
                at,
                (status != "pending").then_some(at + 10),
                i64::from(status == "dead") * 3,
            ],
        )
        .unwrap();
        conn.last_insert_rowid()
    }

    /// Every plan step over an outboxd table must be a SEARCH (an index or
    /// key range) or a walk of the partial index that holds pending rows
    /// only; a SCAN of a table or of a whole index is refused. (Run with
    /// --nocapture to see the plans.)
    #[test]
    fn no_page_query_scans_a_whole_table() {
        let (_dir, conn) = db();
        for (name, sql) in ALL {
            let n = conn.prepare(sql).unwrap().parameter_count();
            let args: Vec<rusqlite::types::Value> =
                (0..n).map(|_| rusqlite::types::Value::Integer(1)).collect();
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(args), |r| r.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            println!("{name}: {plan:?}");
            for step in &plan {
                let bounded = step.starts_with("SEARCH")
                    || step.contains("USING INDEX event_outbox_due")
                    // Sorting what a bounded step found.
                    || step.starts_with("USE TEMP B-TREE")
                    || step.starts_with("SCAN sqlite_sequence")
                    || step == "SCAN CONSTANT ROW"
                    || step.starts_with("SCALAR SUBQUERY");
                assert!(bounded, "{name}: {step}\nin {plan:?}");
            }
        }
    }

    #[test]
    fn events_page_by_key_with_filters() {
        let (_dir, conn) = db();
        let now = Timestamp::from_millis(T0 + 1_000_000);
        let mut ids = Vec::new();
        for i in 0..120 {
            let ty = if i % 2 == 0 {
                "article.created.v1"
            } else {
                "order.placed.v1"
            };
            let status = if i % 3 == 0 { "dead" } else { "delivered" };
            ids.push(insert(
                &conn,
                ty,
                status,
                T0 + i,
                Some(if i % 4 == 0 { "acme" } else { "b" }),
            ));
        }
        let all = events_page(&conn, &EventFilter::default(), now).unwrap();
        assert_eq!(all.rows.len(), PAGE);
        assert_eq!(all.rows[0].id, ids[119], "newest first");
        let next = events_page(
            &conn,
            &EventFilter {
                before: all.next_before,
                ..EventFilter::default()
            },
            now,
        )
        .unwrap();
        assert_eq!(next.rows[0].id, ids[119 - PAGE]);
        let filter = EventFilter {
            state: Some(StateFilter::Dead),
            event_type: Some(Pattern::parse("article.*").unwrap()),
            tenant: Some("acme".into()),
            ..EventFilter::default()
        };
        let page = events_page(&conn, &filter, now).unwrap();
        // i % 3 == 0, even, i % 4 == 0: i % 12 == 0 → 10 rows.
        assert_eq!(page.rows.len(), 10);
        assert_eq!(page.next_before, None, "the walk reached the first row");
        assert!(page.rows.iter().all(|r| r.status == "dead"));
    }

    #[test]
    fn consumer_filter_reads_the_ledger() {
        let (_dir, conn) = db();
        let now = Timestamp::from_millis(T0 + 1000);
        let a = insert(&conn, "article.created.v1", "delivered", T0, None);
        let b = insert(&conn, "article.created.v1", "dead", T0, None);
        let key: String = conn
            .query_row(
                "SELECT event_id FROM event_outbox WHERE id = ?1",
                [a],
                |r| r.get(0),
            )
            .unwrap();
        conn.execute(
            "INSERT INTO delivered_events VALUES (?1, 'hook', ?2, ?3)",
            params![key, a, T0],
        )
        .unwrap();
        let f = |missing| EventFilter {
            consumer: Some("hook".into()),
            missing,
            ..EventFilter::default()
        };
        let done = events_page(&conn, &f(false), now).unwrap();
        assert_eq!(done.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [a]);
        let missing = events_page(&conn, &f(true), now).unwrap();
        assert_eq!(missing.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [b]);
        let subs = Subscriptions::parse([("hook", ["*"]), ("other", ["order.*"])]).unwrap();
        let backlog = consumer_backlog(&conn, &subs).unwrap();
        assert_eq!(backlog.per_consumer, [(0, 1), (0, 0)]);
        assert!(!backlog.truncated);
    }

    #[test]
    fn event_detail_by_row_or_event_id_in_any_case() {
        let (_dir, conn) = db();
        let id = insert(&conn, "article.created.v1", "pending", T0, Some("<script>"));
        let event_id: String = conn
            .query_row(
                "SELECT event_id FROM event_outbox WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap();
        let by_row = find_event(&conn, &id.to_string()).unwrap().unwrap();
        assert_eq!(by_row.row.tenant.as_deref(), Some("<script>"));
        assert_eq!(by_row.payload, "null");
        assert_eq!(by_row.envelope_error, None);
        let lower = find_event(&conn, &event_id.to_ascii_lowercase())
            .unwrap()
            .unwrap();
        assert_eq!(lower.row.id, id);
        assert!(find_event(&conn, "999").unwrap().is_none());
        assert!(find_event(&conn, "not-an-id").unwrap().is_none());
    }

    #[test]
    fn dead_pages_follow_the_finished_index() {
        let (_dir, conn) = db();
        // Few distinct times, so a page ends inside a run of equal ones.
        for i in 0..70 {
            insert(&conn, "article.created.v1", "dead", T0 + i / 30, None);
            insert(&conn, "order.placed.v1", "delivered", T0 + i / 30, None);
        }
        let first = dead_page(&conn, None, None).unwrap();
        assert_eq!(first.rows.len(), PAGE);
        let second = dead_page(&conn, None, first.next).unwrap();
        assert_eq!(second.rows.len(), 20);
        assert_eq!(second.next, None);
        let mut seen: Vec<i64> = first
            .rows
            .iter()
            .chain(&second.rows)
            .map(|r| r.id)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 70, "every dead letter once");
        assert!(first.rows[0].finished_at >= second.rows[0].finished_at);
    }

    #[test]
    fn minute_counts_come_from_the_table() {
        let (_dir, conn) = db();
        let since = T0;
        insert(&conn, "a.b.v1", "delivered", T0 - 3_600_000, None); // too old
        insert(&conn, "a.b.v1", "delivered", T0 + 1_000, None);
        insert(&conn, "a.b.v1", "dead", T0 + 61_000, None);
        insert(&conn, "a.b.v1", "pending", T0 + 62_000, None);
        let rows = minute_counts(&conn, since).unwrap();
        let m0 = T0 / 60_000;
        let get = |m: i64| {
            rows.iter()
                .find(|(k, _)| *k == m)
                .map(|(_, c)| *c)
                .unwrap_or_default()
        };
        assert_eq!((get(m0).enqueued, get(m0).delivered), (1, 1));
        assert_eq!((get(m0 + 1).enqueued, get(m0 + 1).dead), (2, 1));
        assert_eq!(enqueued_total(&conn).unwrap(), 4);
    }
}
