-- Lists dead letters after delivery id $4, filtered by tenant $1, topic $2 and
-- subscription $3 (NULL: any), oldest first. Uses the deliveries_dead index.
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload::text AS payload, d.attempts, d.errors::text AS errors, d.dead_at, m.created_at
FROM {schema}.deliveries d
JOIN {schema}.messages m ON m.id = d.message_id
WHERE d.state = 'dead'
  AND ($1::text IS NULL OR d.tenant = $1)
  AND ($2::text IS NULL OR d.topic = $2)
  AND ($3::text IS NULL OR d.subscription = $3)
  AND d.id > $4
ORDER BY d.id
LIMIT $5
