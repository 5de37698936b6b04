-- Appends entries $3.. to stream ($1, $2) in input order: id (this
-- transaction's id, a sequence value), with sequence values sorted so that
-- ids follow the input order. Returns the ids; sorted, they are in input order.
-- Notifies the stream's blocked readers (see stream_waiters) at commit.
WITH input AS (
  SELECT i.payload, i.headers, i.message_id, i.origin_tenant, i.topic, i.schema_version, i.ord
  FROM unnest($3::text[], $4::text[], $5::uuid[], $6::text[], $7::text[], $8::int[])
       WITH ORDINALITY AS i(payload, headers, message_id, origin_tenant, topic, schema_version, ord)
),
minors AS (
  SELECT array_agg(v ORDER BY v) AS v
  FROM (SELECT nextval('{schema}.stream_entry_minor') AS v FROM input) s
),
woken AS (
  -- The payload names the stream, so only its readers wake (see streams.rs).
  SELECT pg_notify('{schema}.streams', $1 || chr(10) || $2)
  FROM {schema}.stream_waiters w
  WHERE w.tenant = $1 AND w.stream = $2 AND w.until > statement_timestamp()
)
INSERT INTO {schema}.stream_entries
  (tenant, stream, major, minor, payload, headers, message_id, origin_tenant, topic, schema_version)
SELECT $1, $2, pg_current_xact_id()::text::bigint, m.v[i.ord], i.payload::jsonb, i.headers::jsonb,
       i.message_id, i.origin_tenant, i.topic, i.schema_version
FROM input i, minors m
WHERE (SELECT count(*) FROM woken) >= 0
ORDER BY i.ord
RETURNING major, minor
