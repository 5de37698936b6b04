-- Owes the new subscription ?1 a delivery for every retained message from
-- (created_at, id) >= (?2, ?3) on (?2 NULL: all) whose topic it receives, in
-- enqueue order (created_at, then id). Touches: reads messages,
-- subscription_topics; inserts deliveries. Locks: runs in the BEGIN IMMEDIATE
-- transaction that created the subscription, so no message is both replayed
-- and fanned out.
INSERT INTO deliveries
  (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at, priority)
SELECT m.id, ?1, m.tenant, m.topic, m.schema_version, m.ordering_key, m.available_at, m.priority
FROM messages m
WHERE (?2 IS NULL OR (m.created_at, m.id) >= (?2, ?3))
  AND EXISTS (SELECT 1 FROM subscription_topics t
              WHERE t.subscription = ?1
                AND (t.pattern = m.topic
                     OR (t.prefix IS NOT NULL AND substr(m.topic, 1, length(t.prefix)) = t.prefix)))
ORDER BY m.created_at, m.id
