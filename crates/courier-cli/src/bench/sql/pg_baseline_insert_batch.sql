-- A batch in one statement: arrays in, one row per element.
INSERT INTO {schema}.baseline_queue (tenant, topic, payload)
SELECT u.tenant, u.topic, u.payload::jsonb
FROM unnest($1::text[], $2::text[], $3::text[]) AS u (tenant, topic, payload)
