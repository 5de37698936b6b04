-- The consumers of group $3 on stream ($1, $2) by name, with their pending
-- counts and how long since each last read or claimed. One row always:
-- `found` says whether the group exists; consumer columns are NULL when it
-- has none.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
)
SELECT EXISTS (SELECT 1 FROM g) AS found, c.consumer,
       (SELECT count(*) FROM {schema}.stream_pending p
        WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3 AND p.consumer = c.consumer)
         AS pending,
       greatest(0, (extract(epoch FROM statement_timestamp() - c.seen_at) * 1000)::bigint)
         AS idle_ms
FROM (SELECT 1) one
LEFT JOIN {schema}.stream_consumers c
  ON c.tenant = $1 AND c.stream = $2 AND c.grp = $3
ORDER BY c.consumer
