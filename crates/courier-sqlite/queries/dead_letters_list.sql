-- Lists dead letters after delivery id ?4, filtered by tenant ?1, topic ?2 and
-- subscription ?3 (NULL: any), oldest first, at most ?5.
-- Touches: reads deliveries (deliveries_dead) and messages. Locks: nothing.
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload, d.attempts, d.errors, d.dead_at, m.created_at
FROM deliveries d
JOIN messages m ON m.id = d.message_id
WHERE d.state = 'dead'
  AND (?1 IS NULL OR d.tenant = ?1)
  AND (?2 IS NULL OR d.topic = ?2)
  AND (?3 IS NULL OR d.subscription = ?3)
  AND d.id > ?4
ORDER BY d.id
LIMIT ?5
