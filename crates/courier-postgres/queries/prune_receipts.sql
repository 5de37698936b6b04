-- Retention: deletes up to $2 receipts older than $1 ms, in one short statement.
DELETE FROM {schema}.receipts
WHERE ctid IN (
  SELECT ctid FROM {schema}.receipts
  WHERE completed_at < now() - $1::bigint * interval '1 millisecond'
  LIMIT $2
)
