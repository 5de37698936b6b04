-- Removes the oldest entries of stream ($1, $2) beyond the newest $3;
-- returns how many.
WITH keep AS (
  SELECT e.major, e.minor FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2
  ORDER BY e.major DESC, e.minor DESC
  OFFSET greatest($3::bigint - 1, 0) LIMIT 1
),
gone AS (
  DELETE FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2
    AND ($3::bigint = 0 OR (e.major, e.minor) < (SELECT major, minor FROM keep))
  RETURNING 1
)
SELECT count(*) FROM gone
