-- One message by id ?1, as operators see it (its per-subscription state comes
-- from message_deliveries.sql). Touches: reads messages by primary key.
-- Locks: nothing (a WAL reader never blocks the writer).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload, m.headers,
       m.ordering_key, m.idempotency_key, m.priority, m.occurred_at, m.available_at, m.created_at
FROM messages m
WHERE m.id = ?1
