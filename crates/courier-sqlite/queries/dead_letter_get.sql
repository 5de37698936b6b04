-- One dead letter with its payload and error history.
-- Touches: reads deliveries by primary key and messages. Locks: nothing.
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload, d.attempts, d.errors, d.dead_at, m.created_at
FROM deliveries d
JOIN messages m ON m.id = d.message_id
WHERE d.state = 'dead' AND d.id = ?1
