-- outboxd schema, version 7: the three CHECKs on event_outbox that called
-- SQL functions (length, typeof) say the same with comparisons and CAST.
--
-- Why. A statement that may write several rows and may stop half-way
-- needs a statement journal: SQLite copies every page it touches so it can
-- undo the rows written before the stop. An INSERT of several rows (how
-- enqueue_many writes keyless events) is such a statement as soon as any
-- expression in it calls a function, whatever the conflict clause says:
-- SQLite assumes a function may fail. With no function in any CHECK, the
-- library's batched INSERT OR FAIL (whose rows it has checked against
-- every CHECK beforehand) runs without a journal. Measured with callgrind
-- (BENCHMARKS.md, section 1): 1.5 k instructions per event of a 100-event
-- enqueue_many, and 0.6 k for a one-event INSERT (five function calls a
-- row fewer). Foreign producers' INSERTs and the relay's UPDATEs get the
-- cheaper checks too.
--
-- The rules, their names (a constraint's name is its error message) and
-- their order are those of versions 1 and 5:
--
--   event_outbox_type_not_empty       length(event_type) > 0 becomes
--     event_type > '' AND event_type <> x'': every non-empty text sorts
--     after '', every BLOB after every text, and the empty BLOB is the one
--     BLOB that fails (event_type has TEXT affinity: a number is stored as
--     its text).
--   event_outbox_times_are_integers   typeof(t) = 'integer' becomes
--     t = CAST(t AS INTEGER) AND (t >= -9223372036854775807
--     OR CAST(t AS TEXT) = '-9223372036854775808'): a text or a BLOB never
--     equals an integer, and a REAL equals its CAST only when it is a whole
--     number; INTEGER affinity has already stored every whole REAL in
--     range as an INTEGER except -2^63, which compares equal to the
--     INTEGER -2^63 and is told apart by its text ('-9.22337203685478e+18').
--     The same verdict as typeof for every value (a test compares the two
--     schemas row by row), so no existing row can fail the new CHECK.
--   event_outbox_times_in_milliseconds   the year-9999 bound of version 5,
--     with CAST in place of typeof in the clause that lets a non-integer
--     through to the CHECK above.
--
-- Dropping and adding a CHECK rewrites only the table's definition, not
-- its rows; adding one reads every row to check it (version 5 did the same).
-- ALTER TABLE ... DROP/ADD CONSTRAINT needs a recent SQLite: migrations run
-- on outboxd's bundled one (3.54). The table it leaves is an ordinary
-- CREATE TABLE, which SQLite 3.34 and later read and write.

ALTER TABLE event_outbox DROP CONSTRAINT event_outbox_type_not_empty;
ALTER TABLE event_outbox DROP CONSTRAINT event_outbox_times_are_integers;
ALTER TABLE event_outbox DROP CONSTRAINT
    "event_outbox_times_in_milliseconds: available_at is after year 9999: write INTEGER milliseconds since the Unix epoch, not microseconds or nanoseconds";

ALTER TABLE event_outbox ADD CONSTRAINT event_outbox_type_not_empty
    CHECK (event_type > '' AND event_type <> x'');
ALTER TABLE event_outbox ADD CONSTRAINT event_outbox_times_are_integers
    CHECK (occurred_at = CAST(occurred_at AS INTEGER)
           AND (occurred_at >= -9223372036854775807 OR CAST(occurred_at AS TEXT) = '-9223372036854775808')
           AND created_at = CAST(created_at AS INTEGER)
           AND (created_at >= -9223372036854775807 OR CAST(created_at AS TEXT) = '-9223372036854775808')
           AND available_at = CAST(available_at AS INTEGER)
           AND (available_at >= -9223372036854775807 OR CAST(available_at AS TEXT) = '-9223372036854775808'));
ALTER TABLE event_outbox ADD CONSTRAINT
    "event_outbox_times_in_milliseconds: available_at is after year 9999: write INTEGER milliseconds since the Unix epoch, not microseconds or nanoseconds"
    CHECK (status <> 'pending' OR available_at <= 253402300799999
           OR available_at <> CAST(available_at AS INTEGER));
