-- Finds the messages already stored under (tenant, idempotency key) pairs,
-- given as the JSON array ?1 of [tenant, key] pairs.
-- Touches: reads messages through the messages_idempotency unique index.
-- Locks: nothing beyond the caller's transaction.
SELECT m.tenant, m.idempotency_key, m.id
FROM json_each(?1) AS k
JOIN messages m
  ON m.tenant = k.value ->> 0 AND m.idempotency_key = k.value ->> 1
