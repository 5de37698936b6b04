-- Owes the new subscription $1 a delivery for every retained message from
-- (created_at, id) >= ($2, $3) on whose topic it receives, in enqueue order
-- (created_at, then id). Touches: reads messages, subscription_topics;
-- inserts deliveries. Runs under the fan-out lock in the transaction that
-- created the subscription, so no message is both replayed and fanned out,
-- and none committed before the registration is missed.
INSERT INTO {schema}.deliveries
  (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at, priority)
SELECT m.id, $1, m.tenant, m.topic, m.schema_version, m.ordering_key, m.available_at, m.priority
FROM {schema}.messages m
WHERE ($2::timestamptz IS NULL OR (m.created_at, m.id) >= ($2::timestamptz, $3::uuid))
  AND EXISTS (SELECT 1 FROM {schema}.subscription_topics t
              WHERE t.subscription = $1
                AND (t.pattern = m.topic OR (t.prefix IS NOT NULL AND starts_with(m.topic, t.prefix))))
ORDER BY m.created_at, m.id
