-- Acks entry ($4, $5) in group $3 of stream ($1, $2) and, if it was pending,
-- appends its dead letter ($7 payload, $8 headers, $9..$12 origin) to stream
-- ($1, $6) in the same statement. Returns whether the group exists and
-- whether the entry was pending.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
acked AS (
  DELETE FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3 AND p.major = $4 AND p.minor = $5
  RETURNING 1
),
dead AS (
  INSERT INTO {schema}.stream_entries
    (tenant, stream, major, minor, payload, headers, message_id, origin_tenant, topic,
     schema_version)
  SELECT $1, $6, pg_current_xact_id()::text::bigint, nextval('{schema}.stream_entry_minor'),
         $7::text::jsonb, $8::text::jsonb, $9, $10, $11, $12
  FROM acked
  RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM g) AS found, EXISTS (SELECT 1 FROM dead) AS dead_lettered
