-- One message by id, as operators see it (its per-subscription state comes from
-- message_deliveries.sql). Touches: reads messages by primary key. Locks: nothing.
-- Payload and headers come back as JSON text, decoded the way the claim decodes them.
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload::text AS payload,
       m.headers::text AS headers, m.ordering_key, m.idempotency_key, m.priority,
       m.occurred_at, m.available_at, m.created_at
FROM {schema}.messages m
WHERE m.id = $1
