-- Writes subscription $1's receipt for correlation id $2; a row comes back
-- only when it was new. A concurrent writer of the same receipt waits for
-- the first to commit or roll back.
INSERT INTO {schema}.stream_receipts (subscription, correlation_id)
VALUES ($1, $2)
ON CONFLICT DO NOTHING
RETURNING 1
