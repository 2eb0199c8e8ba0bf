-- outboxd schema, version 3: change capture (src/capture/).
--
-- `outboxd capture apply` installs triggers on the host's tables that turn
-- its inserts, updates and deletes into events. These tables record what it
-- installed, so drift (a trigger dropped by a host migration that rebuilt its
-- table, or rewritten by an ALTER TABLE) is noticed and reported.

-- One row per captured table: the definition as applied (JSON), and when
-- outboxd last saw every trigger of it installed as recorded.
CREATE TABLE outboxd_capture (
    table_name   TEXT    PRIMARY KEY,
    spec         TEXT    NOT NULL,
    installed_at INTEGER NOT NULL,
    verified_at  INTEGER NOT NULL
);

-- One row per trigger or view outboxd installed, with its SQL exactly as
-- sqlite_master held it right after creation. table_name is the captured
-- table the object belongs to, or '' for the shared view every captured
-- event is written through (outboxd_capture_event) and its trigger.
CREATE TABLE outboxd_capture_object (
    name       TEXT    PRIMARY KEY,
    type       TEXT    NOT NULL,
    table_name TEXT    NOT NULL,
    sql        TEXT    NOT NULL,
    CONSTRAINT outboxd_capture_object_type_valid
        CHECK (type = 'trigger' OR type = 'view')
);

-- A scratch list, empty outside a statement: the delete events of rows an
-- INSERT OR REPLACE (or UPDATE OR REPLACE) is about to replace. SQLite
-- deletes those rows without firing delete triggers (unless the connection
-- set recursive_triggers), so a BEFORE trigger notes them here and the AFTER
-- trigger of the same row marks the ones the write did replace and deletes
-- every note; deleting a marked note writes its event.
CREATE TABLE outboxd_capture_replaced (
    id           INTEGER PRIMARY KEY,
    table_name   TEXT    NOT NULL,
    -- The replaced row's rowid; NULL for a WITHOUT ROWID table.
    row_id       INTEGER,
    -- Its key as JSON, to match the delete trigger's OLD row.
    row_key      TEXT,
    -- 1 when a UNIQUE constraint other than the rowid matched: the write
    -- cannot have succeeded without replacing the row.
    exact        INTEGER,
    -- The delete event. No NOT NULL here: a constraint this table broke
    -- would fail the host's write.
    event_type   TEXT,
    payload      TEXT,
    tenant_id    TEXT,
    ordering_key TEXT,
    -- Set by the AFTER trigger of the write once the row is known to be
    -- replaced: deleting a marked note writes its event (a trigger capture
    -- installs, outboxd_capture_replaced_write).
    emit         INTEGER
);
