-- Group $3 of stream ($1, $2): whether it exists, its lowest and highest
-- pending ids, and one row per consumer with pending entries (a single row
-- with a NULL consumer when nothing is pending).
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
)
SELECT EXISTS (SELECT 1 FROM g) AS found,
       lo.major AS low_major, lo.minor AS low_minor,
       hi.major AS high_major, hi.minor AS high_minor,
       c.consumer, c.pending
FROM (SELECT 1) one
LEFT JOIN LATERAL (
  SELECT p.major, p.minor FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
  ORDER BY p.major, p.minor LIMIT 1) lo ON true
LEFT JOIN LATERAL (
  SELECT p.major, p.minor FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
  ORDER BY p.major DESC, p.minor DESC LIMIT 1) hi ON true
LEFT JOIN (
  SELECT p.consumer, count(*) AS pending FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
  GROUP BY p.consumer) c ON true
ORDER BY c.consumer
