-- Courier's outbox schema for SQLite, version 9: each delivery keeps the
-- fingerprint of its last failure, so that dead letters group by what broke
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
-- deliveries_dead_fingerprint is partial like deliveries_dead_at and covers
-- every column the group query reads (the id is the rowid): that query reads
-- dead rows only, never open work.
ALTER TABLE deliveries ADD COLUMN error_fingerprint TEXT;
UPDATE deliveries SET error_fingerprint = 'unknown' WHERE state = 'dead';
CREATE INDEX deliveries_dead_fingerprint
  ON deliveries (error_fingerprint, dead_at, tenant, subscription, topic, message_id)
  WHERE state = 'dead';
