-- Completes claimed deliveries whose lease is still held: deletes them and
-- returns what complete_receipts.sql needs to write their receipts in the same
-- transaction. ?1 is a JSON array of [delivery id, lease token].
-- Touches: deliveries (delete). Locks: runs inside BEGIN IMMEDIATE with
-- complete_receipts.sql, so the deletions and the receipts commit together.
-- Fence: the lease token, the running state and an unexpired lease on the
-- database clock; rows that fail it are left alone and missing from the result.
-- The delete runs first so a receipt is never written for a delivery whose lease
-- expired between two statements.
DELETE FROM deliveries
WHERE id IN (
  SELECT d.id
  FROM json_each(?1) AS c
  JOIN deliveries d ON d.id = c.value ->> 0
  WHERE d.lease_token = c.value ->> 1
    AND d.state = 'running'
    AND d.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
)
RETURNING id, tenant, subscription, message_id
