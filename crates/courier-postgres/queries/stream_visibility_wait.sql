-- How long (ms) the oldest committed entry of stream ($1, $2) that readers
-- cannot have yet has waited since its append; NULL when none waits.
-- Readers hand out only entries of transactions below their snapshot's xmin
-- (see stream_read_new.sql); an entry this statement can see at or above
-- that horizon is committed and held back by an older open transaction.
-- Touches: stream_entries (range of its primary key from the horizon: the
-- entries of transactions still open, which it cannot see, and at most the
-- first 1,000 it can). Locks: none.
SELECT (extract(epoch FROM statement_timestamp() - min(w.appended_at)) * 1000)::bigint
FROM (
  SELECT e.appended_at
  FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2
    AND e.major >= pg_snapshot_xmin(pg_current_snapshot())::text::bigint
  ORDER BY e.major, e.minor
  LIMIT 1000
) w
