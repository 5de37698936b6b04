-- Hands claimed-but-unstarted deliveries back at shutdown, giving back the
-- attempt the claim spent. ?1 is a JSON array of [delivery id, lease token].
-- Fenced by the lease token and the running state (as in PostgreSQL, an expired
-- lease may still be released: nobody else holds a running row's token).
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
)
RETURNING id
