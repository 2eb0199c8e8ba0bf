-- outboxd schema, version 4: a replay runs only the consumers it names, and
-- a time in the wrong unit is refused when it is written.
--
-- Replay scope. Version 2 put a replayed row back to pending and let the
-- relay run every consumer without a ledger entry for it: a consumer added
-- since (or whose entry was gone) ran too, and a dead row ran the consumer
-- that had rejected it. A replay now records whom it is for, and what the
-- row was before, so the relay runs those consumers only and then gives the
-- row its status back:
--
--   replay_consumers      NULL: every routed consumer without a ledger entry
--                         (a row as producers write it); otherwise the names
--                         of the consumers the replay asked for, joined by ','
--                         (a character no consumer name may contain).
--   status_before_replay  NULL unless replay_consumers is set: 'delivered' or
--                         'dead', the status the row returns to once they
--                         have it (a dead row stays a dead letter).
--
-- Both are NULL on every row that is not pending. ALTER TABLE cannot add a
-- table CHECK, so the library keeps this rule.

ALTER TABLE event_outbox ADD COLUMN replay_consumers TEXT;
ALTER TABLE event_outbox ADD COLUMN status_before_replay TEXT;

-- Units. Every time column is INTEGER milliseconds since the Unix epoch. A
-- producer that writes available_at in microseconds (or nanoseconds)
-- commits a row due in the year 57,000: never delivered, holding back every
-- later event of its ordering key, and reported healthy. Such a time is
-- refused at INSERT, so the producer gets the error in its own transaction:
-- anything after the last millisecond of year 9999 (253402300799999), the
-- latest time an envelope can carry. (Seconds are not caught: they read as
-- a time in January 1970, which is due at once.)
--
-- A trigger, not a CHECK: ALTER TABLE cannot add a CHECK, and rebuilding the
-- table to add one would rewrite every row of a large file; a CHECK cannot
-- read the clock either. The bound is a constant, so the trigger costs one
-- comparison per INSERT (BENCHMARKS.md); the relay's own UPDATEs, which take
-- their times from its clock, are not checked. A text or REAL time falls to
-- the CHECK event_outbox_times_are_integers instead, with its own message.
-- `status` and `doctor` report events delayed by more than a year, whatever
-- wrote them.
CREATE TRIGGER event_outbox_times_in_milliseconds
BEFORE INSERT ON event_outbox
WHEN NEW.available_at > 253402300799999 AND typeof(NEW.available_at) = 'integer'
BEGIN
    SELECT RAISE(ABORT, 'event_outbox.available_at is after year 9999: write INTEGER milliseconds since the Unix epoch, not microseconds or nanoseconds (event_outbox_times_in_milliseconds)');
END;
