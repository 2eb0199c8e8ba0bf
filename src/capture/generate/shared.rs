//! The objects every capture shares: the event view and its trigger (which
//! mints the ULID and writes the `event_outbox` row), the fix trigger for
//! payloads that are not plain printable ASCII, and the trigger that writes
//! the delete events of the rows a REPLACE deleted.

use super::utf8::{
    chain, common_utf8, control_escapes, utf8_steps, CHAIN, NON_ASCII, OTHER_CONTROL,
};
use super::{SqlObject, INSERT_EVENT, REPLACED_TABLE};

/// The view every captured event is inserted into; its `INSTEAD OF`
/// trigger ([`EVENT_TRIGGER`]) writes the `event_outbox` row.
pub(crate) const EVENT_VIEW: &str = "outboxd_capture_event";

/// The `INSTEAD OF INSERT` trigger of [`EVENT_VIEW`].
pub(crate) const EVENT_TRIGGER: &str = "outboxd_capture_event_write";

/// "now" in milliseconds on any SQLite (`unixepoch()` needs 3.38). `'now'`
/// is one instant within a statement, so every event of a statement and its
/// ULID's time agree.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// The characters of a ULID, as an expression over the columns of
/// [`ulid_source`]: the 48-bit millisecond time `t` in ten Crockford base32
/// characters, then 80 random bits in sixteen: sixty from `r` and twenty
/// from `s`, two 64-bit values of SQLite's `random()` (a CSPRNG). Only
/// `substr` and integer operators: valid on any SQLite.
const ULID_CHARS: &str = "substr(a,(t>>45&31)+1,1)||substr(a,(t>>40&31)+1,1)||substr(a,(t>>35&31)+1,1)||\
substr(a,(t>>30&31)+1,1)||substr(a,(t>>25&31)+1,1)||substr(a,(t>>20&31)+1,1)||substr(a,(t>>15&31)+1,1)||\
substr(a,(t>>10&31)+1,1)||substr(a,(t>>5&31)+1,1)||substr(a,(t&31)+1,1)||\
substr(a,(r>>55&31)+1,1)||substr(a,(r>>50&31)+1,1)||substr(a,(r>>45&31)+1,1)||substr(a,(r>>40&31)+1,1)||\
substr(a,(r>>35&31)+1,1)||substr(a,(r>>30&31)+1,1)||substr(a,(r>>25&31)+1,1)||substr(a,(r>>20&31)+1,1)||\
substr(a,(r>>15&31)+1,1)||substr(a,(r>>10&31)+1,1)||substr(a,(r>>5&31)+1,1)||substr(a,(r&31)+1,1)||\
substr(a,(s>>15&31)+1,1)||substr(a,(s>>10&31)+1,1)||substr(a,(s>>5&31)+1,1)||substr(a,(s&31)+1,1)";

/// The one-row source [`ULID_CHARS`] reads: the alphabet, the time and two
/// random numbers. A subquery without FROM is never flattened into the
/// query using it, so each column is computed once (random() called twice,
/// not once per character; SQLite's random() is slow enough to matter).
fn ulid_source(t_ms: &str) -> String {
    format!(
        "(SELECT '0123456789ABCDEFGHJKMNPQRSTVWXYZ' AS a, ({t_ms})&281474976710655 AS t, \
         random() AS r, random() AS s)"
    )
}

/// A fresh ULID for the millisecond time `t_ms`, as a scalar subquery (the
/// event view's trigger inlines the same expression).
#[cfg(test)]
fn ulid_sql(t_ms: &str) -> String {
    format!("(SELECT {ULID_CHARS} FROM {})", ulid_source(t_ms))
}

/// A pattern matching text with a character outside printable ASCII
/// (space to `~`): a control character, DEL, or any byte of 0x80 or more
/// (GLOB decodes UTF-8, and such bytes never decode below 0x80).
const NOT_PRINTABLE: &str = "'*[^ -~]*'";

/// The trigger on `event_outbox` that finishes a captured event whose
/// payload is not plain printable ASCII.
pub(crate) const FIX_TRIGGER: &str = "outboxd_capture_fix";

/// The `AFTER DELETE` trigger on outboxd_capture_replaced that writes the
/// delete events of the rows a REPLACE deleted.
pub(crate) const REPLACED_TRIGGER: &str = "outboxd_capture_replaced_write";

/// The mark a captured event whose payload needs finishing carries in
/// `causation_id` (capture sets no causation) until the event view's trigger
/// clears it, which fires [`FIX_TRIGGER`].
const MARK_FIX: &str = "'outboxd:capture:fix'";

/// What the fix trigger keeps in `last_error` (a new row has none; it is
/// cleared again) when the change must be sent as hex, and when the text
/// is known to be UTF-8.
const MARK_HEX: &str = "'outboxd:capture:hex'";
const MARK_UTF8: &str = "'outboxd:capture:utf8'";

/// The objects every capture shares (see the module doc):
/// - [`EVENT_VIEW`] and its `INSTEAD OF` trigger [`EVENT_TRIGGER`]: capture
///   triggers insert events here; the trigger skips a NULL payload (a
///   condition said no) and writes the `event_outbox` row with a fresh ULID.
///   A payload that is not plain printable ASCII is marked (in
///   `causation_id`), and clearing the mark fires:
/// - [`FIX_TRIGGER`], `AFTER UPDATE OF causation_id` on `event_outbox`:
///   text holding NUL, or a control character other than tab, line feed,
///   carriage return, backspace and form feed, is sent as hex; those five
///   are escaped; then a copy of the payload, kept in `last_error`, is
///   reduced by [`common_utf8`] and, if anything above 0x7F is left, by
///   [`utf8_steps`]: if anything is still left, the text was not UTF-8 and
///   the change is sent as hex. SQLite allocates a trigger's registers each
///   time it fires, even when its WHEN is false, so this large program must
///   not fire for ordinary events: an UPDATE that matches no row fires
///   nothing.
/// - [`REPLACED_TRIGGER`] on outboxd_capture_replaced: writes the events of
///   the notes a capture trigger marked, as it deletes them.
pub(crate) fn event_objects() -> [SqlObject; 4] {
    // The change as hex, keeping `{"op":…,"table":…,` (ASCII and outboxd's
    // own UTF-8) readable in front.
    let hex_form = |p: &str| {
        format!(
            "CASE WHEN instr({p},',\"key\":')>0 THEN substr({p},1,instr({p},',\"key\":')) ELSE '{{' END\
             ||'\"payload_hex\":\"'||hex({p})||'\"}}'"
        )
    };
    let event = format!(
        "CREATE TRIGGER {EVENT_TRIGGER} INSTEAD OF INSERT ON {EVENT_VIEW} WHEN NEW.payload IS NOT NULL\nBEGIN\n\
         INSERT INTO event_outbox (event_id, event_type, payload, tenant_id, ordering_key, occurred_at, causation_id)\n\
         SELECT {ULID_CHARS},\n  \
         NEW.event_type, NEW.payload, NEW.tenant_id, NEW.ordering_key, t,\n  \
         CASE WHEN instr(NEW.payload,char(0))>0 OR NEW.payload GLOB {NOT_PRINTABLE} THEN {MARK_FIX} END\n\
         FROM {};\n\
         UPDATE event_outbox SET causation_id = NULL WHERE id = last_insert_rowid() AND causation_id = {MARK_FIX};\nEND",
        ulid_source(NOW_MS)
    );
    let this = "id = NEW.id";
    let mut stmts = vec![
        format!(
            "UPDATE event_outbox SET last_error = {MARK_HEX}\nWHERE {this} AND (instr(payload,char(0))>0 OR payload GLOB {OTHER_CONTROL});"
        ),
        format!(
            "UPDATE event_outbox SET payload = {}\nWHERE {this} AND last_error IS NULL;",
            chain("payload", &control_escapes())
        ),
    ];
    for (i, steps) in common_utf8().chunks(CHAIN).enumerate() {
        stmts.push(if i == 0 {
            format!(
                "UPDATE event_outbox SET last_error = {}\nWHERE {this} AND last_error IS NULL;",
                chain("payload", steps)
            )
        } else {
            format!(
                "UPDATE event_outbox SET last_error = {}\nWHERE {this} AND last_error <> {MARK_HEX};",
                chain("last_error", steps)
            )
        });
    }
    // Only text that still holds bytes above 0x7F goes through every step
    // (tested once: GLOB costs as much as a few replaces).
    stmts.push(format!(
        "UPDATE event_outbox SET last_error = {MARK_UTF8}\nWHERE {this} AND last_error <> {MARK_HEX} AND NOT last_error GLOB {NON_ASCII};"
    ));
    for steps in utf8_steps().chunks(CHAIN) {
        stmts.push(format!(
            "UPDATE event_outbox SET last_error = {}\nWHERE {this} AND last_error <> {MARK_HEX} AND last_error <> {MARK_UTF8};",
            chain("last_error", steps)
        ));
    }
    stmts.push(format!(
        "UPDATE event_outbox SET payload = CASE WHEN last_error = {MARK_HEX} OR (last_error <> {MARK_UTF8} AND last_error GLOB {NON_ASCII})\n  \
         THEN {} ELSE payload END, last_error = NULL\nWHERE {this};",
        hex_form("payload")
    ));
    let fix = format!(
        "CREATE TRIGGER {FIX_TRIGGER} AFTER UPDATE OF causation_id ON event_outbox WHEN OLD.causation_id = {MARK_FIX}\nBEGIN\n{}\nEND",
        stmts.join("\n")
    );
    let replaced = format!(
        "CREATE TRIGGER {REPLACED_TRIGGER} AFTER DELETE ON {REPLACED_TABLE} WHEN OLD.emit\nBEGIN\n\
         {INSERT_EVENT}\nVALUES (OLD.event_type, OLD.payload, OLD.tenant_id, OLD.ordering_key);\nEND"
    );
    let shared = |name: &str, kind: &'static str, sql: String| SqlObject {
        name: name.to_string(),
        kind,
        table: String::new(),
        sql,
    };
    [
        shared(
            EVENT_VIEW,
            "view",
            format!("CREATE VIEW {EVENT_VIEW} AS\nSELECT event_type, payload, tenant_id, ordering_key FROM event_outbox WHERE 0"),
        ),
        shared(EVENT_TRIGGER, "trigger", event),
        shared(FIX_TRIGGER, "trigger", fix),
        shared(REPLACED_TRIGGER, "trigger", replaced),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_valid_and_carry_the_time() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for t in [0i64, 1, 1_764_487_080_123, (1 << 48) - 1] {
            let s: String = conn
                .query_row(&format!("SELECT {}", ulid_sql(&t.to_string())), [], |r| {
                    r.get(0)
                })
                .unwrap();
            let id = crate::EventId::parse(&s).unwrap();
            assert_eq!(id.to_string(), s, "canonical upper case");
            assert_eq!(id.ulid().timestamp_ms(), t as u64);
        }
        let a: String = conn
            .query_row(&format!("SELECT {}", ulid_sql("0")), [], |r| r.get(0))
            .unwrap();
        let b: String = conn
            .query_row(&format!("SELECT {}", ulid_sql("0")), [], |r| r.get(0))
            .unwrap();
        assert_ne!(a, b, "80 random bits differ");
    }
}
