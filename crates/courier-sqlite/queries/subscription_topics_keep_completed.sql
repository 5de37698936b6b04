-- Before patterns ?2 (a JSON array) are removed from subscription ?1: what
-- they received and completed (no open delivery, not discarded) gets a
-- receipt, since the admin views can no longer read it from the pattern.
-- Touches: receipts (reads messages, subscription_topics, deliveries,
-- discards). Locks: in the removal's BEGIN IMMEDIATE transaction. Scans the
-- retained messages once.
INSERT INTO receipts (tenant, subscription, message_id)
SELECT DISTINCT m.tenant, ?1, m.id
FROM messages m
JOIN subscription_topics t
  ON t.subscription = ?1 AND t.pattern IN (SELECT value FROM json_each(?2))
 AND (t.pattern = m.topic
      OR (t.prefix IS NOT NULL AND substr(m.topic, 1, length(t.prefix)) = t.prefix))
 AND (m.created_at, m.id) >= (t.since, t.since_id)
WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND d.subscription = ?1)
  AND NOT EXISTS (SELECT 1 FROM discards x WHERE x.message_id = m.id AND x.subscription = ?1)
ON CONFLICT (message_id, subscription) DO NOTHING
