-- Courier's outbox schema, version 15: each delivery keeps the fingerprint
-- of its last failure, so that dead letters group by what broke
-- (DeadLetterStore::dead_letter_groups) and retry, discard and list take a
-- fingerprint as a filter.
--
-- The fingerprint is computed in Rust (courier_core::error_fingerprint: a
-- stable hash of the failure's kind and its normalised message) and written
-- by fail.sql, snooze.sql (once a snooze spends its attempt) and rescue.sql
-- with the error it belongs to.
--
-- Dead letters from before this version have no fingerprint that SQL could
-- compute (the normalisation is Rust's): they are marked `unknown`, one group
-- an operator can list, retry or discard like any other. A live delivery with
-- earlier failures gets its fingerprint at its next failure, which is the
-- one that may dead-letter it.
--
-- deliveries_dead_fingerprint is partial like deliveries_dead_at: the group
-- query reads dead rows only, never open work, and every column it groups
-- and filters on is in the index, so it is an index-only scan (on 200,000
-- deliveries of which 4,000 dead: 5 ms, against 15 ms through
-- deliveries_dead_at and the heap). Built inside the migration's transaction
-- (CREATE INDEX CONCURRENTLY cannot run in one); it holds dead rows only.
ALTER TABLE {schema}.deliveries ADD COLUMN error_fingerprint text;
UPDATE {schema}.deliveries SET error_fingerprint = 'unknown' WHERE state = 'dead';
CREATE INDEX deliveries_dead_fingerprint ON {schema}.deliveries (error_fingerprint, dead_at)
  INCLUDE (tenant, subscription, topic, message_id, id) WHERE state = 'dead';
