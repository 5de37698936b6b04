-- Retention: deletes up to ?2 messages older than ?1 ms whose deliveries are all
-- done (no delivery row left: completed ones are deleted, dead letters stay and
-- keep their message). Scans messages_enqueued; the delivery check uses the
-- (message_id, subscription) unique index.
-- Touches: messages (delete); the messages_discards_gone trigger removes
-- their discards. Locks: one short autocommit statement.
DELETE FROM messages
WHERE id IN (
  SELECT m.id FROM messages m
  WHERE m.created_at < CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - ?1
    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id)
  LIMIT ?2
)
