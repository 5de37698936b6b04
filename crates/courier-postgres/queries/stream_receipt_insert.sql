-- Writes subscription $1's receipt for correlation id $2; a row comes back
-- only when it was new. A concurrent writer of the same receipt waits for
-- the first to commit or roll back. When $2 names entry ($4, $5) (stored
-- form, migration 0017) of stream $3, a run holding that entry is a receipt
-- too: then nothing is written ($3 NULL when $2 names no entry).
INSERT INTO {schema}.stream_receipts (subscription, correlation_id)
SELECT $1, $2
WHERE NOT EXISTS (
  SELECT 1
  FROM {schema}.stream_receipt_runs r
  WHERE r.subscription = $1 AND r.stream = $3
    AND r.last_major BETWEEN $4 AND $6 AND r.first_major <= $4
    AND EXISTS (
      SELECT 1 FROM unnest(r.majors, r.minors) AS t(major, minor)
      WHERE t.major = $4 AND t.minor = $5
    )
)
ON CONFLICT DO NOTHING
RETURNING 1
