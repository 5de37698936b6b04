-- Courier's outbox schema, version 11: find a stream's entries by the outbox
-- message they relay.
--
-- The daemon's native stream relay appends a message to a stream in the
-- delivery's own transaction, so the append commits with the completion and
-- the receipt and a crash can never leave it behind without them. It still
-- looks, before appending, for an entry of the same message in that stream
-- (a replay of the message to the same stream: an operator's retry of a dead
-- letter that did append, a subscription replaying retained messages), and
-- that look must not scan the stream.
--
-- Not UNIQUE: `StreamStore::append` does not dedupe, and every group that
-- dead-letters a relayed entry appends its own copy (same origin) to
-- `{stream}.dead`. Partial: entries that relay nothing are most of some
-- streams and are never looked up this way.
--
-- Built inside the migration's transaction (CREATE INDEX CONCURRENTLY cannot
-- run in one), so appends to native streams wait while it is built: on a
-- large `stream_entries` plan the upgrade for a quiet moment.
CREATE INDEX stream_entries_origin
  ON {schema}.stream_entries (tenant, stream, message_id)
  WHERE message_id IS NOT NULL;
