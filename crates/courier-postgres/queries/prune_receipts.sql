-- Retention: deletes up to $2 outbox receipts, up to $2 stream receipts and
-- up to $2 runs of stream receipts older than $1 ms, in one short
-- statement; returns how many receipts (a run counts its entries).
WITH outbox AS (
  DELETE FROM {schema}.receipts
  WHERE ctid IN (
    SELECT ctid FROM {schema}.receipts
    WHERE completed_at < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
  )
  RETURNING 1
),
streams AS (
  DELETE FROM {schema}.stream_receipts
  WHERE ctid IN (
    SELECT ctid FROM {schema}.stream_receipts
    WHERE created_at < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
  )
  RETURNING 1
),
runs AS (
  DELETE FROM {schema}.stream_receipt_runs
  WHERE ctid IN (
    SELECT ctid FROM {schema}.stream_receipt_runs
    WHERE created_at < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
  )
  RETURNING cardinality(majors) AS n
)
SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM streams)
  + (SELECT coalesce(sum(n), 0) FROM runs)
