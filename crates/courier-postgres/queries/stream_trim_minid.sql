-- Removes the entries of stream ($1, $2) below id ($3, $4); returns how many.
WITH gone AS (
  DELETE FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2 AND (e.major, e.minor) < ($3, $4)
  RETURNING 1
)
SELECT count(*) FROM gone
