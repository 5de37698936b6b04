-- One dead letter with its payload and error history.
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload::text AS payload, d.attempts, d.errors::text AS errors, d.dead_at, m.created_at
FROM {schema}.deliveries d
JOIN {schema}.messages m ON m.id = d.message_id
WHERE d.state = 'dead' AND d.id = $1
