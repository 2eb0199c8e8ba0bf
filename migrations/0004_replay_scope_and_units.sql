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
