-- Up to $6 pending entries of group $3 on stream ($1, $2) above id ($4, $5),
-- in id order, only consumer $7's when $7 is not NULL, only those idle at
-- least $8 ms when $8 is not NULL. One row always: `found` says whether the
-- group exists; entry columns are NULL when none matched.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
page AS (
  SELECT p.major, p.minor, p.consumer, p.deliveries,
         (extract(epoch FROM statement_timestamp() - p.delivered_at) * 1000)::bigint AS idle_ms
  FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
    AND (p.major, p.minor) > ($4, $5)
    AND ($7::text IS NULL OR p.consumer = $7)
    AND ($8::bigint IS NULL
         OR p.delivered_at <= statement_timestamp() - $8::bigint * interval '1 millisecond')
  ORDER BY p.major, p.minor
  LIMIT $6
)
SELECT EXISTS (SELECT 1 FROM g) AS found, p.major, p.minor, p.consumer, p.deliveries,
       greatest(p.idle_ms, 0) AS idle_ms
FROM (SELECT 1) one
LEFT JOIN page p ON true
ORDER BY p.major, p.minor
