-- Deletes consumer $4 of group $3 on stream ($1, $2) unless entries are
-- pending for it. Pending rows never depend on their consumer's row, so
-- this can drop no entry from pending, whatever runs beside it.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
c AS (
  SELECT 1 FROM {schema}.stream_consumers c
  WHERE c.tenant = $1 AND c.stream = $2 AND c.grp = $3 AND c.consumer = $4
  FOR UPDATE
),
n AS (
  SELECT count(*) AS pending FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3 AND p.consumer = $4
),
gone AS (
  DELETE FROM {schema}.stream_consumers c
  WHERE c.tenant = $1 AND c.stream = $2 AND c.grp = $3 AND c.consumer = $4
    AND (SELECT pending FROM n) = 0
  RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM g) AS found, EXISTS (SELECT 1 FROM c) AS existed,
       (SELECT pending FROM n) AS pending, EXISTS (SELECT 1 FROM gone) AS deleted
