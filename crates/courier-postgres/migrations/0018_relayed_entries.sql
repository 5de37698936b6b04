-- Courier's outbox schema, version 18: the native relay appends a message
-- to a stream once, even when two transactions relay it at once.
--
-- The native relay appends a message to a stream in the delivery's own
-- transaction unless the stream already holds an entry of that message.
-- Schema 11's look reads the statement's snapshot: two transactions
-- relaying one message to one stream at once (two subscriptions relaying a
-- topic into the same stream) each missed the other's uncommitted entry,
-- and both appended. Schema 11's index cannot be UNIQUE (plain appends and
-- dead-letter copies share origins), so the relay's own appends are marked
-- (`relayed`) and unique among themselves: the relay's INSERT ... ON
-- CONFLICT waits for a concurrent insert of the same (tenant, stream,
-- message) and, once that committed, appends nothing. No advisory lock: a
-- transaction relaying thousands of messages would hold thousands of
-- entries of the shared lock table.
--
-- Entries appended before this version are not marked (NULL), so the index
-- starts empty and the upgrade rewrites nothing; the relay's look by schema
-- 11's index still finds them. Built inside the migration's transaction
-- (CREATE INDEX CONCURRENTLY cannot run in one), after the ALTER's ACCESS
-- EXCLUSIVE lock: every read and append of native streams waits while the
-- build scans `stream_entries` (about 0.2 s for a million entries, cached):
-- on a large table plan the upgrade for a quiet moment.
ALTER TABLE {schema}.stream_entries ADD COLUMN relayed boolean;

CREATE UNIQUE INDEX stream_entries_relayed
  ON {schema}.stream_entries (tenant, stream, message_id)
  WHERE relayed;
