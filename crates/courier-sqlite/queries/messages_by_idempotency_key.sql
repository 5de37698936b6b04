-- The messages stored under (tenant, idempotency key) pairs, given as the JSON
-- array ?1 of [tenant, key] pairs, as operators see them: the API compares a
-- batch's keyed items with them before it stores anything.
-- Touches: reads messages through the messages_idempotency unique index.
-- Locks: nothing (a WAL reader never blocks the writer).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload, m.headers,
       m.ordering_key, m.idempotency_key, m.priority, m.occurred_at, m.available_at, m.created_at
FROM json_each(?1) AS k
JOIN messages m
  ON m.tenant = k.value ->> 0 AND m.idempotency_key = k.value ->> 1
