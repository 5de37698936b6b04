-- Hands claimed-but-unstarted deliveries back at shutdown, giving back the
-- attempt the claim spent. Fenced by the lease token (set only while running).
UPDATE {schema}.deliveries d
SET state = 'available',
    attempts = greatest(d.attempts - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL
FROM unnest($1::bigint[], $2::uuid[]) AS l (id, lease_token)
WHERE d.id = ANY ($1::bigint[])
  AND d.id = l.id
  AND d.lease_token = l.lease_token
  -- The token is the running state: only a claim sets one; fail, release and
  -- rescue clear it. (Testing `state = 'running'` as well would let the planner
  -- walk the deliveries_running partial index, whose dead entries a snapshot
  -- held elsewhere keeps; the primary key finds each row directly, through
  -- `d.id = ANY ($1)`: joined only to the unnest, a large batch was planned
  -- as a sequential scan of the table.)
RETURNING d.id
