-- Retention: deletes up to $2 messages older than $1 ms whose deliveries are all
-- done (no delivery row left: completed ones are deleted, dead letters stay and
-- keep their message), with their discards, and the removed topic patterns
-- that no retained message is older than (they owe nothing any more: see
-- migrations/0014_owed_by_fan_out_time.sql). Scans messages_enqueued
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
),
retired AS (
  DELETE FROM {schema}.removed_topics t
  WHERE t.removed_at < coalesce((SELECT min(m.created_at) FROM {schema}.messages m
                                 WHERE m.id NOT IN (SELECT g.id FROM gone g)), 'infinity')
)
SELECT count(*) FROM gone
