-- Retention: deletes up to $2 messages older than $1 ms whose deliveries are all
-- done (no delivery row left: completed ones are deleted, dead letters stay and
-- keep their message), with their discards. Scans messages_enqueued
-- (created_at, id) from the oldest; returns how many messages went.
WITH gone AS (
  DELETE FROM {schema}.messages
  WHERE id IN (
    SELECT m.id FROM {schema}.messages m
    WHERE m.created_at < now() - $1::bigint * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d WHERE d.message_id = m.id)
    LIMIT $2
  )
  RETURNING id
),
forgotten AS (
  DELETE FROM {schema}.discards x USING gone g WHERE x.message_id = g.id
)
SELECT count(*) FROM gone
