-- outboxd schema, version 5: the year-9999 bound on available_at becomes a
-- CHECK constraint, and the trigger that enforced it goes.
--
-- Why. Version 4 refused an available_at in microseconds or nanoseconds
-- with a BEFORE INSERT trigger. Any INSERT trigger makes every INSERT into
-- event_outbox expensive, whatever its WHEN clause says: SQLite runs the
-- trigger's program for each row, opens a statement journal for each
-- statement (copying every page the row touches), and buffers a multi-row
-- INSERT in a temporary table before writing it. Measured with callgrind
-- (BENCHMARKS.md, section 1): a fifth of the instructions of each INSERT
-- (28.9 k -> 22.7 k per row), and a batched enqueue_many of 2 KB payloads
-- that was slower than writing the rows one by one. A CHECK costs one
-- comparison.
--
-- The rule is the same: a pending row whose available_at is an INTEGER
-- after the last millisecond of year 9999 (253402300799999) is refused at
-- INSERT, inside the producer's transaction, and the error names the rule
-- and the fix (a constraint's name is its error message: "CHECK constraint
-- failed: event_outbox_times_in_milliseconds: ..."). Text and REAL times
-- still fall to event_outbox_times_are_integers. (The comparison comes
-- first: it settles the CHECK for every due time without calling typeof.)
-- The relay's own UPDATEs now meet the bound too; they take their times
-- from its clock.
--
-- A finished row is exempt: its available_at means nothing any more, and
-- checking it would fail this migration on a row finished long ago.
--
-- Pending rows already past the bound (written before version 4, or by an
-- UPDATE) are moved to the bound first, or the constraint could not be
-- added: they were never going to be due, and still are not before the end
-- of year 9999 (`status` and `doctor` report them as delayed by more than a
-- year, as before). The UPDATE searches event_outbox_due. Adding the
-- constraint reads every row of the table once to check it, as version 4's
-- ADD COLUMNs did; nothing is rewritten.
--
-- ALTER TABLE ... ADD CONSTRAINT needs a recent SQLite: migrations run on
-- outboxd's bundled one (3.54). The table it leaves is an ordinary CREATE
-- TABLE with one more CHECK, which SQLite 3.34 and later read and write.

UPDATE event_outbox SET available_at = 253402300799999
 WHERE status = 'pending' AND available_at > 253402300799999
   AND typeof(available_at) = 'integer';

DROP TRIGGER event_outbox_times_in_milliseconds;

ALTER TABLE event_outbox ADD CONSTRAINT
    "event_outbox_times_in_milliseconds: available_at is after year 9999: write INTEGER milliseconds since the Unix epoch, not microseconds or nanoseconds"
    CHECK (status <> 'pending' OR available_at <= 253402300799999
           OR typeof(available_at) <> 'integer');
