-- Takes back the latest delivery of ids ($5[i], $6[i]) pending to consumer
-- $4 in group $3 of stream ($1, $2): their delivery counts drop by one (not
-- below 0), delivered_at unchanged. Returns how many were pending to that
-- consumer.
-- Touches: stream_pending (update by primary key; no indexed column
-- changes). The caller sorts the ids, so rows are locked in id order, as
-- ack and touch lock them.
WITH uncounted AS (
  UPDATE {schema}.stream_pending p
  SET deliveries = greatest(p.deliveries - 1, 0)
  FROM unnest($5::bigint[], $6::bigint[]) AS i(major, minor)
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3 AND p.consumer = $4
    AND p.major = i.major AND p.minor = i.minor
  RETURNING 1
)
SELECT count(*) AS uncounted FROM uncounted
