-- Claims and removes up to ?1 rows in enqueue order. SQLite has one writer
-- at a time, so there is nothing to skip: the statement is its own lock.
DELETE FROM baseline_queue
WHERE id IN (SELECT id FROM baseline_queue ORDER BY id LIMIT ?1)
RETURNING id, payload
