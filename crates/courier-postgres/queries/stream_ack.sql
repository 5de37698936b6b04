-- Acks ids ($4[i], $5[i]) in group $3 of stream ($1, $2): they leave pending.
-- Returns whether the group exists and how many were pending.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
acked AS (
  DELETE FROM {schema}.stream_pending p
  USING unnest($4::bigint[], $5::bigint[]) AS i(major, minor)
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
    AND p.major = i.major AND p.minor = i.minor
  RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM g) AS found, (SELECT count(*) FROM acked) AS acked
