-- The oldest and newest dead_at of message ?1's dead letters (NULLs: none),
-- which bound a dead-letter listing filtered by message id to an index range.
-- Touches: reads deliveries through (message_id, subscription). Locks: nothing.
SELECT min(d.dead_at) AS oldest, max(d.dead_at) AS newest
FROM deliveries d
WHERE d.message_id = ?1 AND d.state = 'dead'
