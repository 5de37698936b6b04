-- Hands claimed-but-unstarted deliveries back at shutdown, giving back the
-- attempt the claim spent. Fenced by the lease token and the running state.
UPDATE {schema}.deliveries d
SET state = 'available',
    attempts = greatest(d.attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL
FROM unnest($1::bigint[], $2::uuid[]) AS l (id, lease_token)
WHERE d.id = l.id
  AND d.lease_token = l.lease_token
  AND d.state = 'running'
RETURNING d.id
