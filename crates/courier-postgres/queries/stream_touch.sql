-- Restarts the idle time of ids ($5[i], $6[i]) pending to consumer $4 in
-- group $3 of stream ($1, $2): delivered now, their delivery counts
-- unchanged. Returns how many were pending to that consumer.
-- Touches: stream_pending (update by primary key; no indexed column
-- changes).
WITH touched AS (
  UPDATE {schema}.stream_pending p
  SET delivered_at = statement_timestamp()
  FROM unnest($5::bigint[], $6::bigint[]) AS i(major, minor)
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3 AND p.consumer = $4
    AND p.major = i.major AND p.minor = i.minor
  RETURNING 1
)
SELECT count(*) AS touched FROM touched
