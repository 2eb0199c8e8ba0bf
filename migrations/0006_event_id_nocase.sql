-- outboxd schema, version 6: the event-id index compares ids without
-- regard to letter case (NOCASE), so one probe finds every spelling of an
-- id.
--
-- Why. The claim holds a row back while another pending row carrying its
-- event id is earlier or leased (issue 11.4: a foreign producer that wrote
-- one event twice). With the BINARY index of versions 1-5 it had to probe
-- three times per claimed row (the id as written, in upper and in lower
-- case), and the ledger purge twice per entry: measured with callgrind
-- (BENCHMARKS.md, section 2), the three probes were ~11 k of the ~47 k
-- instructions the claim statement spends per row; one NOCASE probe costs
-- ~5.5 k. An extra index of only the pending rows was measured too and not
-- taken: its entry costs every INSERT ~6 k more (+29 %) and every finish
-- (the row leaves 'pending') ~5 k more, which is what it saves the claim.
-- Replacing this index instead costs an INSERT ~1 k (NOCASE comparisons
-- instead of memcmp) and a finish nothing.
--
-- The rules widen with it, to ids in mixed case: the claim now holds a
-- row back for a twin in any letter case, and the purge keeps a ledger
-- entry while a row with its id in any case stays. The ledger key is
-- upper(event_id) for every spelling, so two spellings of one id always
-- shared ledger entries; before, a mixed-case twin could be in delivery
-- beside its original. NOCASE folds ASCII letters only, as upper() does,
-- and a ULID is ASCII.
--
-- Look-ups by event id must compare with NOCASE to use the index
-- (`WHERE event_id = ?1 COLLATE NOCASE`); a plain `event_id = ?1` now
-- reads the whole table (outboxd's own queries all do the former).
--
-- Building the index reads every row of the table once, inside the
-- migration's write transaction: 2.7 s for 1,000,000 rows on a loaded
-- 2-core machine, so a large outbox pauses its producers that long, once.
-- Plain CREATE INDEX, readable and writable by SQLite 3.34 and later.

DROP INDEX event_outbox_event_id;

CREATE INDEX event_outbox_event_id
    ON event_outbox (event_id COLLATE NOCASE) WHERE event_id IS NOT NULL;
