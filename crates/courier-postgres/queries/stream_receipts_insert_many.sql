-- Writes subscription $1's receipts for the correlation ids $2; returns how
-- many were new.
WITH added AS (
  INSERT INTO {schema}.stream_receipts (subscription, correlation_id)
  SELECT $1, c FROM unnest($2::text[]) AS c
  ORDER BY c
  ON CONFLICT DO NOTHING
  RETURNING 1
)
SELECT count(*) FROM added
