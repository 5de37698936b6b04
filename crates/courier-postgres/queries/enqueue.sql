-- Inserts a batch of messages in one statement (the fan-out trigger then owes
-- each matching subscription a delivery). Touches: messages (insert), and via the
-- trigger deliveries. A repeated (tenant, idempotency key) is skipped, not an
-- error; the caller looks up the first message's id for those.
-- available_at: the producer's instant ($10), else the database clock plus a delay ($11 ms).
INSERT INTO {schema}.messages
  (id, tenant, topic, schema_version, payload, headers, ordering_key, idempotency_key,
   occurred_at, available_at, priority)
SELECT u.id, u.tenant, u.topic, u.schema_version, u.payload::jsonb, u.headers::jsonb,
       u.ordering_key, u.idempotency_key, u.occurred_at,
       coalesce(u.available_at, now() + coalesce(u.delay_ms, 0) * interval '1 millisecond'),
       u.priority
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $6::text[], $7::text[],
            $8::text[], $9::timestamptz[], $10::timestamptz[], $11::bigint[], $12::smallint[])
     WITH ORDINALITY AS u (id, tenant, topic, schema_version, payload, headers, ordering_key,
                           idempotency_key, occurred_at, available_at, delay_ms, priority,
                           position)
ORDER BY u.position
ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
