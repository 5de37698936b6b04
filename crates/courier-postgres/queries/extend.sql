-- Heartbeat: extends leases that are still held by $3 ms from now (database
-- clock). An expired lease cannot be extended: it may already be someone else's.
UPDATE {schema}.deliveries d
SET lease_expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
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
  AND d.lease_expires_at > clock_timestamp()
RETURNING d.id
