-- Finds the messages already stored under (tenant, idempotency key) pairs.
-- Reads messages through the messages_idempotency unique index; locks nothing.
SELECT m.tenant, m.idempotency_key, m.id
FROM {schema}.messages m
JOIN unnest($1::text[], $2::text[]) AS k (tenant, idempotency_key)
  ON m.tenant = k.tenant AND m.idempotency_key = k.idempotency_key
