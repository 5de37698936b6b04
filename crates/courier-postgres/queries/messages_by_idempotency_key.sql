-- The messages stored under (tenant, idempotency key) pairs ($1 tenants, $2
-- keys, element by element), as operators see them: the API compares a
-- batch's keyed items with them before it stores anything. Touches: reads
-- messages through the messages_idempotency unique index. Locks: nothing.
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload::text AS payload,
       m.headers::text AS headers, m.ordering_key, m.idempotency_key, m.priority,
       m.occurred_at, m.available_at, m.created_at
FROM {schema}.messages m
JOIN unnest($1::text[], $2::text[]) AS k (tenant, idempotency_key)
  ON m.tenant = k.tenant AND m.idempotency_key = k.idempotency_key
