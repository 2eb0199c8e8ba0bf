-- outboxd schema, version 8: captures get names (several per table), a
-- lasting record of the windows they lost, and snapshots.
--
-- A capture was keyed by its table; it is now keyed by its name, which is
-- the table's for every capture recorded so far, so the triggers of an
-- existing capture keep their names and drift checks see no change.
-- outboxd_capture_object's owner column names the capture, not the table
-- (the same text for every row written so far). outboxd_capture_replaced
-- keeps its column name `table_name` (the triggers' SQL names it), but new
-- captures write their own name there, so two captures of one table keep
-- their REPLACE notes apart.

CREATE TABLE outboxd_capture_named (
    name         TEXT    NOT NULL PRIMARY KEY COLLATE NOCASE,
    table_name   TEXT    NOT NULL,
    spec         TEXT    NOT NULL,
    installed_at INTEGER NOT NULL,
    verified_at  INTEGER NOT NULL
);
INSERT INTO outboxd_capture_named (name, table_name, spec, installed_at, verified_at)
    SELECT table_name, table_name, spec, installed_at, verified_at FROM outboxd_capture;
DROP TABLE outboxd_capture;
ALTER TABLE outboxd_capture_named RENAME TO outboxd_capture;

ALTER TABLE outboxd_capture_object RENAME COLUMN table_name TO capture_name;

-- One row per window in which a capture's triggers were missing, recorded
-- when `capture apply` (ended_by 'apply') or `run`'s auto_repair ('repair')
-- reinstalled them. Writes made in (lost_after, lost_until] may not have
-- been captured: lost_after is the last time outboxd saw the triggers
-- intact, so the window is an upper bound. It stays open (a health
-- problem) until a later complete snapshot of the capture covers it
-- (resolved_by 'snapshot <id>') or an operator acknowledges it ('ack').
CREATE TABLE outboxd_capture_gap (
    id          INTEGER PRIMARY KEY,
    capture     TEXT    NOT NULL,
    table_name  TEXT    NOT NULL,
    lost_after  INTEGER NOT NULL,
    lost_until  INTEGER NOT NULL,
    ended_by    TEXT    NOT NULL,
    resolved_at INTEGER,
    resolved_by TEXT,
    CONSTRAINT outboxd_capture_gap_ended_by_valid
        CHECK (ended_by = 'apply' OR ended_by = 'repair')
);
CREATE INDEX outboxd_capture_gap_open ON outboxd_capture_gap (capture)
    WHERE resolved_at IS NULL;

-- One row per snapshot: one `r` event per existing row of a captured
-- table, read in chunks, each chunk's events and the cursor written in one
-- short transaction, so a snapshot resumes where it stopped.
CREATE TABLE outboxd_capture_snapshot (
    id           TEXT    NOT NULL PRIMARY KEY,
    capture      TEXT    NOT NULL,
    table_name   TEXT    NOT NULL,
    -- The operator's --where, if any (a filtered snapshot covers no gap).
    filter       TEXT,
    -- running, completed, cancelled or failed.
    state        TEXT    NOT NULL,
    -- Who started it: cli, auto, console or library.
    origin       TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    -- The capture's installed_at when it started: a capture reinstalled
    -- meanwhile (its table rebuilt) stops it.
    installed_at INTEGER NOT NULL,
    -- The key of the last row read (JSON), NULL before the first chunk.
    cursor       TEXT,
    -- The table's last key when it started (JSON; NULL: it was empty):
    -- rows inserted after it are sent by their live events.
    last_key     TEXT,
    scanned      INTEGER NOT NULL DEFAULT 0,
    rows         INTEGER NOT NULL DEFAULT 0,
    -- The table's row count when it started, for progress.
    total        INTEGER,
    message      TEXT,
    CONSTRAINT outboxd_capture_snapshot_state_valid
        CHECK (state IN ('running', 'completed', 'cancelled', 'failed'))
);
CREATE INDEX outboxd_capture_snapshot_capture ON outboxd_capture_snapshot (capture, started_at);
