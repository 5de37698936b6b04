-- Heartbeat: extends leases that are still held by ?2 ms from now (database
-- clock). ?1 is a JSON array of [delivery id, lease token]. An expired lease
-- cannot be extended: it may already be someone else's.
-- Touches: deliveries (update). Locks: one autocommit statement.
UPDATE deliveries
SET lease_expires_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?2
WHERE id IN (
  SELECT d.id
  FROM json_each(?1) AS l
  JOIN deliveries d ON d.id = l.value ->> 0
  WHERE d.lease_token = l.value ->> 1
    AND d.state = 'running'
    AND d.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
)
RETURNING id
