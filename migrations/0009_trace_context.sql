-- outboxd schema, version 9: W3C Trace Context beside each event.
--
-- traceparent and tracestate hold the producer's context (W3C Trace
-- Context, version 00: docs/sql-contract.md). Each delivery attempt sends
-- a child of it in its transport metadata (headers, the command's
-- environment, the sql sink's parameters); the envelope does not change.
-- No CHECK: a malformed value must not fail the host's INSERT, so the
-- relay drops it with a warning when it delivers the row, and the event
-- goes out without it. Both NULL for every row written before.
--
-- ALTER TABLE ADD COLUMN of a nullable column without a default changes
-- only the table's definition: no row is rewritten, whatever the size of
-- the outbox.

ALTER TABLE event_outbox ADD COLUMN traceparent TEXT;
ALTER TABLE event_outbox ADD COLUMN tracestate TEXT;
