-- Claims and removes up to $1 rows in enqueue order; rows another connection
-- has locked are skipped, so two connections never wait on each other.
DELETE FROM {schema}.baseline_queue
WHERE id IN (SELECT id FROM {schema}.baseline_queue ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
