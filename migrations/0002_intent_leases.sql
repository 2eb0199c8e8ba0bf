-- outboxd schema, version 2: publish intents get a claim token and a lease.
--
-- Version 1 kept a send's claim in `attempts` (the fence) and `updated_at`
-- (its start), and a sender that found a claim judged it by its own lease:
-- two senders configured with different leases disagreed on whether a claim
-- was still live. A claim now records its own end, and a long post can move
-- it (the publish intents module's IntentLease::extend).
--
-- While status = 'pending', claim_token and lease_until are both set (a send
-- holds the intent, until lease_until) or both NULL (recorded, not claimed);
-- in any other status both are NULL. ALTER TABLE cannot add a table CHECK, so
-- the library keeps this rule: every write that sets one sets the other.

ALTER TABLE publish_intents ADD COLUMN claim_token TEXT;
ALTER TABLE publish_intents ADD COLUMN lease_until INTEGER;

-- Claims made under version 1 keep the end that version gave them: their
-- start plus the default lease (5 minutes).
UPDATE publish_intents
   SET claim_token = 'v1-' || attempts, lease_until = updated_at + 300000
 WHERE status = 'pending' AND attempts > 0;
