-- outboxd schema, version 1.
--
-- Rules for every migration in this folder:
--   * plain SQL, no BEGIN/COMMIT (the migrator wraps each file in its own
--     BEGIN IMMEDIATE transaction) and no PRAGMA (connection settings are code);
--   * readable and writable by SQLite 3.34 and later: no STRICT tables, no
--     functions newer than 3.34 in DEFAULTs or CHECKs (unixepoch() is 3.38);
--   * every timestamp is INTEGER milliseconds since the Unix epoch, UTC;
--   * a CHECK lists allowed values with OR, never IN (...): SQLite builds a
--     temporary B-tree for an IN list on every insert and update it checks
--     (measured: 42% of enqueue's instructions).
--     The DEFAULT expression below computes "now" that way on any SQLite.

-- One row per event. Producers insert; the relay claims, finishes and
-- dead-letters. AUTOINCREMENT so a row id is never reused: ids follow commit
-- order (SQLite has one writer) and a purged id never comes back.
CREATE TABLE event_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- ULID of the event; NULL for a legacy row (delivered, dedup skipped).
    event_id        TEXT,
    -- "<domain>.<verb>.v<N>", validated when the relay claims the row.
    event_type      TEXT    NOT NULL,
    -- NULL means "take it from the type's suffix"; otherwise must agree.
    event_version   INTEGER,
    tenant_id       TEXT,
    idempotency_key TEXT,
    ordering_key    TEXT,
    causation_id    TEXT,
    correlation_id  TEXT,
    -- The business payload as JSON text.
    payload         TEXT    NOT NULL DEFAULT 'null',
    occurred_at     INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    created_at      INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    -- When the row may next be claimed. A claim moves it to the end of the
    -- lease, so "due" is simply available_at <= now: a live lease is never due.
    available_at    INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    status          TEXT    NOT NULL DEFAULT 'pending',
    -- Failed delivery attempts so far (a poison verdict spends none).
    attempts        INTEGER NOT NULL DEFAULT 0,
    -- The fence: set by a claim, required by every write that ends it.
    claim_token     TEXT,
    lease_until     INTEGER,
    last_error      TEXT,
    -- When the row became delivered or dead.
    finished_at     INTEGER,
    CONSTRAINT event_outbox_status_valid
        CHECK (status = 'pending' OR status = 'delivered' OR status = 'dead'),
    CONSTRAINT event_outbox_lease_has_token
        CHECK ((claim_token IS NULL) = (lease_until IS NULL)),
    CONSTRAINT event_outbox_finished_not_leased
        CHECK (status = 'pending' OR claim_token IS NULL),
    CONSTRAINT event_outbox_finished_at_iff_finished
        CHECK ((status = 'pending') = (finished_at IS NULL)),
    CONSTRAINT event_outbox_attempts_non_negative
        CHECK (attempts >= 0),
    CONSTRAINT event_outbox_type_not_empty
        CHECK (length(event_type) > 0),
    -- A foreign producer binding text ('2026-11-30T07:18:00Z') or a float
    -- would otherwise commit a row that is never due (TEXT sorts after every
    -- INTEGER) and cannot be read as a timestamp: refuse it at INSERT time.
    CONSTRAINT event_outbox_times_are_integers
        CHECK (typeof(occurred_at) = 'integer' AND typeof(created_at) = 'integer'
               AND typeof(available_at) = 'integer')
);

-- "Claim the next due rows": a range scan of pending rows in due order that
-- stops after the batch, however many delivered or dead rows the table holds.
CREATE INDEX event_outbox_due
    ON event_outbox (available_at, id) WHERE status = 'pending';

-- Ordering keys: "is an earlier event of this key still pending?"
CREATE INDEX event_outbox_ordering
    ON event_outbox (ordering_key, id) WHERE status = 'pending' AND ordering_key IS NOT NULL;

-- Idempotency keys are unique per scope: one index for tenants, one for the
-- system scope (no tenant). Two columns, never a concatenation, so tenant
-- "a:b" with key "c" and tenant "a" with key "b:c" can never collide.
CREATE UNIQUE INDEX event_outbox_tenant_key
    ON event_outbox (tenant_id, idempotency_key)
    WHERE tenant_id IS NOT NULL AND idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX event_outbox_system_key
    ON event_outbox (idempotency_key)
    WHERE tenant_id IS NULL AND idempotency_key IS NOT NULL;

-- Look-ups by event id (dedup, replay, dead-letter show).
CREATE INDEX event_outbox_event_id ON event_outbox (event_id) WHERE event_id IS NOT NULL;

-- Purge and the dead-letter view walk finished rows by time.
CREATE INDEX event_outbox_finished
    ON event_outbox (status, finished_at) WHERE status <> 'pending';

-- One row per (event, consumer) that succeeded: the per-consumer progress of
-- a row and the dedup ledger. event_key is the event id, or '#<row id>' for a
-- legacy row (a ULID never contains '#', so the two never collide).
CREATE TABLE delivered_events (
    event_key    TEXT    NOT NULL,
    consumer     TEXT    NOT NULL,
    outbox_id    INTEGER NOT NULL,
    delivered_at INTEGER NOT NULL,
    PRIMARY KEY (event_key, consumer)
) WITHOUT ROWID;

CREATE INDEX delivered_events_at ON delivered_events (delivered_at);

-- External writes recorded before they are sent (see the publish intents
-- module). Unique per scope and key, like event_outbox.
CREATE TABLE publish_intents (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id       TEXT,
    idempotency_key TEXT    NOT NULL,
    marker          TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    result          TEXT,
    last_error      TEXT,
    created_at      INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at      INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    completed_at    INTEGER,
    CONSTRAINT publish_intents_status_valid
        CHECK (status = 'pending' OR status = 'failed' OR status = 'completed'),
    CONSTRAINT publish_intents_completed_at_iff_completed
        CHECK ((status = 'completed') = (completed_at IS NOT NULL)),
    CONSTRAINT publish_intents_key_not_empty
        CHECK (length(idempotency_key) > 0)
);

CREATE UNIQUE INDEX publish_intents_tenant_key
    ON publish_intents (tenant_id, idempotency_key) WHERE tenant_id IS NOT NULL;
CREATE UNIQUE INDEX publish_intents_system_key
    ON publish_intents (idempotency_key) WHERE tenant_id IS NULL;
CREATE INDEX publish_intents_open
    ON publish_intents (status, updated_at) WHERE status <> 'completed';
CREATE INDEX publish_intents_completed
    ON publish_intents (completed_at) WHERE status = 'completed';
