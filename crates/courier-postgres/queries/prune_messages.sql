-- Retention: deletes up to $2 messages older than $1 ms whose deliveries are all
-- done (no delivery row left: completed ones are deleted, dead letters stay and
-- keep their message). Scans messages_enqueued (created_at, id) from the oldest.
DELETE FROM {schema}.messages
WHERE id IN (
  SELECT m.id FROM {schema}.messages m
  WHERE m.created_at < now() - $1::bigint * interval '1 millisecond'
    AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d WHERE d.message_id = m.id)
  LIMIT $2
)
