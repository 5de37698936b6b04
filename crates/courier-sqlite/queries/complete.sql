-- Completes claimed deliveries of plain handlers whose lease is still held:
-- deletes them. No receipt: only transactional handlers write one, in their
-- effect's transaction (receipts_insert_many.sql); the admin views derive
-- `completed` from a retained message with no open delivery.
-- ?1 is a JSON array of [delivery id, lease token].
-- Touches: deliveries (delete). Locks: one autocommit statement.
-- Fence: the lease token, the running state and an unexpired lease on the
-- database clock; rows that fail it are left alone and missing from the result.
DELETE FROM deliveries
WHERE id IN (
  SELECT d.id
  FROM json_each(?1) AS c
  JOIN deliveries d ON d.id = c.value ->> 0
  WHERE d.lease_token = c.value ->> 1
    AND d.state = 'running'
    AND d.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
)
RETURNING id
