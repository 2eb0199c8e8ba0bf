//! The SQL over `publish_intents`: recording, reading, claiming, completing,
//! failing and purging intents. Every statement on the table is here.

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::intent::{Intent, IntentStatus};
use super::key::IntentKey;
use super::settings::Intents;
use super::{IntentError, IntentResult};
use crate::clock::Timestamp;
use crate::error::{Error, Setting, SettingError};

impl Intents {
    /// See [`record`](super::record).
    pub fn record(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Intent> {
        let tx = begin(conn, "record an intent")?;
        let intent = insert_or_get(&tx, key, self.clock.now())?;
        tx.commit().map_err(Error::db("commit an intent"))?;
        Ok(intent)
    }

    /// See [`get`](super::get).
    pub fn get(&self, conn: &Connection, key: &IntentKey) -> IntentResult<Option<Intent>> {
        Ok(select(conn, key)?)
    }

    /// See [`list_open`](super::list_open).
    pub fn list_open(&self, conn: &Connection) -> IntentResult<Vec<Intent>> {
        let mut stmt = conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE status <> 'completed' ORDER BY updated_at, id"
            ))
            .map_err(Error::db("list open intents"))?;
        let rows = stmt
            .query_map([], read_intent)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(Error::db("list open intents"))?;
        Ok(rows)
    }

    /// See [`purge_completed`](super::purge_completed).
    pub fn purge_completed(
        &self,
        conn: &Connection,
        older_than: Timestamp,
        batch: usize,
    ) -> IntentResult<usize> {
        if batch == 0 {
            return Err(Error::from(SettingError::new(
                Setting::IntentPurgeBatch,
                "0 rows per batch would never finish; give 1 or more (100 to 1000 keeps \
                 each write short)",
            ))
            .into());
        }
        let mut total = 0;
        loop {
            let n = purge_completed_batch(conn, older_than, batch)
                .map_err(Error::db("purge completed intents"))?;
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
    }
}

/// The columns [`read_intent`] reads, in its order.
const SELECT_COLUMNS: &str = "SELECT id, tenant_id, idempotency_key, marker, status, attempts, \
     result, last_error, created_at, updated_at, completed_at, lease_until FROM publish_intents";

pub(super) fn begin<'c>(conn: &'c Connection, op: &'static str) -> IntentResult<Transaction<'c>> {
    if !conn.is_autocommit() {
        return Err(IntentError::InTransaction { op });
    }
    Ok(Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(Error::db(op))?)
}

pub(super) fn insert_or_get(
    conn: &Connection,
    key: &IntentKey,
    now: Timestamp,
) -> IntentResult<Intent> {
    // ON CONFLICT DO NOTHING: the scope's unique index decides, atomically.
    conn.prepare_cached(
        "INSERT INTO publish_intents (tenant_id, idempotency_key, marker, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![key.tenant, key.key, key.marker(), now.as_millis()]))
    .map_err(Error::db("record an intent"))?;
    Ok(select(conn, key)?.ok_or_else(|| Error::Invariant {
        what: format!("{key} is gone right after recording it"),
    })?)
}

/// Reads the row for a key; the SQL differs by scope so each query uses its
/// partial unique index.
pub(super) fn select(conn: &Connection, key: &IntentKey) -> crate::Result<Option<Intent>> {
    match &key.tenant {
        Some(t) => conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE tenant_id = ?1 AND idempotency_key = ?2"
            ))
            .and_then(|mut s| s.query_row(params![t, key.key], read_intent).optional()),
        None => conn
            .prepare_cached(&format!(
                "{SELECT_COLUMNS} WHERE tenant_id IS NULL AND idempotency_key = ?1"
            ))
            .and_then(|mut s| s.query_row(params![key.key], read_intent).optional()),
    }
    .map_err(Error::db("read an intent"))
}

fn read_intent(r: &rusqlite::Row<'_>) -> rusqlite::Result<Intent> {
    let status: String = r.get(4)?;
    let status = IntentStatus::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown intent status {status:?}; expected pending, failed or completed")
                .into(),
        )
    })?;
    Ok(Intent {
        id: r.get(0)?,
        key: IntentKey {
            tenant: r.get(1)?,
            key: r.get(2)?,
        },
        marker: r.get(3)?,
        status,
        attempts: r.get(5)?,
        result: r.get(6)?,
        last_error: r.get(7)?,
        created_at: Timestamp::from_millis(r.get(8)?),
        updated_at: Timestamp::from_millis(r.get(9)?),
        completed_at: r.get::<_, Option<i64>>(10)?.map(Timestamp::from_millis),
        lease_until: r.get::<_, Option<i64>>(11)?.map(Timestamp::from_millis),
    })
}

/// Claims intent row `intent` for attempt `attempt`: stamps the claim's
/// `token` and its end, `until`. Returns the rows changed (1, or 0 if the
/// intent changed since it was read).
pub(super) fn set_claim(
    conn: &Connection,
    intent: &Intent,
    attempt: u32,
    token: &str,
    now: Timestamp,
    until: Timestamp,
) -> crate::Result<usize> {
    // Compare-and-set on the attempt number: under BEGIN IMMEDIATE
    // nobody else writes, but it keeps the claim honest on its own.
    conn.execute(
        "UPDATE publish_intents
            SET status = 'pending', attempts = ?1, updated_at = ?2,
                claim_token = ?3, lease_until = ?4
          WHERE id = ?5 AND attempts = ?6 AND status <> 'completed'",
        params![
            attempt,
            now.as_millis(),
            token,
            until.as_millis(),
            intent.id,
            intent.attempts
        ],
    )
    .map_err(Error::db("claim an intent"))
}

/// True while a pending intent's claim names liveness member `owner`
/// ([`crate::liveness`]): its lock file is kept for the senders that judge
/// that claim.
pub(crate) fn claimed_by(conn: &Connection, owner: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM publish_intents
                         WHERE status = 'pending' AND substr(claim_token, 1, 27) = ?1 || ':')",
    )?
    .query_row([owner], |r| r.get(0))
}

/// The claim token on intent row `id`, if any.
pub(super) fn claim_token(conn: &Connection, id: i64) -> crate::Result<Option<String>> {
    conn.prepare_cached("SELECT claim_token FROM publish_intents WHERE id = ?1")
        .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
        .map(Option::flatten)
        .map_err(Error::db("read an intent's claim"))
}

/// Moves the end of the claim `token` on row `id` to `until`. Returns the
/// rows changed: 0 when the claim no longer stands.
pub(super) fn extend_claim(
    conn: &Connection,
    id: i64,
    token: &str,
    until: Timestamp,
) -> crate::Result<usize> {
    conn.prepare_cached(
        "UPDATE publish_intents SET lease_until = ?1
          WHERE id = ?2 AND claim_token = ?3 AND status = 'pending'",
    )
    .and_then(|mut s| s.execute(params![until.as_millis(), id, token]))
    .map_err(Error::db("extend an intent's claim"))
}

/// Records `result` on row `id` unless the intent is completed already
/// (the first recorded result wins), and ends any claim.
pub(super) fn set_completed(
    conn: &Connection,
    id: i64,
    result: &str,
    now: Timestamp,
) -> crate::Result<()> {
    let now = now.as_millis();
    conn.execute(
        "UPDATE publish_intents
         SET status = 'completed', result = ?1, completed_at = ?2, updated_at = ?2,
             claim_token = NULL, lease_until = NULL
         WHERE id = ?3 AND status <> 'completed'",
        params![result, now, id],
    )
    .map_err(Error::db("complete an intent"))?;
    Ok(())
}

/// The fenced "failed" write: only while the claim `token` on row `id`
/// stands.
pub(super) fn release(
    conn: &Connection,
    id: i64,
    token: &str,
    reason: &str,
    now: Timestamp,
) -> crate::Result<()> {
    conn.execute(
        "UPDATE publish_intents
            SET status = 'failed', last_error = ?1, updated_at = ?2,
                claim_token = NULL, lease_until = NULL
          WHERE id = ?3 AND claim_token = ?4 AND status = 'pending'",
        params![reason, now.as_millis(), id, token],
    )
    .map_err(Error::db("mark an intent failed"))?;
    Ok(())
}

/// One bounded delete of completed intents older than `older_than`; the
/// relay's housekeeping runs it inside its purge transaction.
pub(crate) fn purge_completed_batch(
    conn: &Connection,
    older_than: Timestamp,
    batch: usize,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM publish_intents WHERE id IN (
             SELECT id FROM publish_intents
             WHERE status = 'completed' AND completed_at < ?1
             ORDER BY completed_at LIMIT ?2)",
    )?
    .execute(params![
        older_than.as_millis(),
        i64::try_from(batch).unwrap_or(i64::MAX)
    ])
}

/// How many completed intents completed before `older_than` (what a purge
/// with that cutoff would delete).
pub(crate) fn count_completed_before(
    conn: &Connection,
    older_than: Timestamp,
) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT count(*) FROM publish_intents WHERE status = 'completed' AND completed_at < ?1",
        [older_than.as_millis()],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::Timestamp;
    use crate::intents::{get, IntentKey, Intents, DEFAULT_INTENT_LEASE};

    /// A claim made under schema version 1 (no lease column) keeps the end
    /// version 1 gave it once the database is migrated: its start plus the
    /// default lease, so no second sender posts while it may be running.
    #[test]
    fn a_claim_made_before_the_lease_columns_keeps_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::connection::open(dir.path().join("v1.db")).unwrap();
        crate::schema::migrate_up_to(&mut conn, 1).unwrap();
        conn.execute_batch(
            "INSERT INTO publish_intents (idempotency_key, marker, status, attempts, updated_at)
                  VALUES ('claimed', 'm1', 'pending', 2, 1000000),
                         ('recorded', 'm2', 'pending', 0, 1000000),
                         ('failed', 'm3', 'failed', 1, 1000000)",
        )
        .unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        let get = |k: &str| get(&conn, &IntentKey::system(k).unwrap()).unwrap().unwrap();
        let start = Timestamp::from_millis(1_000_000);
        assert_eq!(
            get("claimed").claimed_until(),
            Some(start.plus(DEFAULT_INTENT_LEASE))
        );
        assert_eq!(get("recorded").claimed_until(), None);
        assert_eq!(get("failed").claimed_until(), None);
        let clock = crate::ManualClock::new(start.plus(Duration::from_secs(60)));
        let e = Intents::new()
            .clock(clock)
            .send(
                &conn,
                &IntentKey::system("claimed").unwrap(),
                |_| Ok::<_, String>(None),
                |_| Ok("posted".to_string()),
            )
            .unwrap_err();
        assert!(e.is_in_flight(), "{e}");
    }
}
