-- Hands claimed-but-unstarted deliveries back at shutdown, giving back the
-- attempt the claim spent. ?1 is a JSON array of [delivery id, lease token].
-- Fenced like fail.sql: the lease token, the running state and an unexpired
-- lease on the database clock (an expired claim may be anyone's by now; the
-- rescuer settles it, attempt spent).
-- Touches: deliveries (update). Locks: one autocommit statement.
UPDATE deliveries
SET state = 'available',
    attempts = max(attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL
WHERE id IN (
  SELECT d.id
  FROM json_each(?1) AS l
  JOIN deliveries d ON d.id = l.value ->> 0
  WHERE d.lease_token = l.value ->> 1
    AND d.state = 'running'
    AND d.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
)
RETURNING id
