-- Completes a batch of transactional deliveries inside their shared
-- transaction, fenced like complete.sql (the receipts are already written).
-- Locks the deleted rows until the transaction ends. The caller rolls back
-- unless every delivery passed the fence.
DELETE FROM {schema}.deliveries d
USING unnest($1::bigint[], $2::uuid[]) AS c (id, lease_token)
WHERE d.id = ANY ($1::bigint[])
  AND d.id = c.id
  AND d.lease_token = c.lease_token
  -- The token is the running state: only a claim sets one; fail, release and
  -- rescue clear it. (Testing `state = 'running'` as well would let the planner
  -- walk the deliveries_running partial index, whose dead entries a snapshot
  -- held elsewhere keeps; the primary key finds each row directly, through
  -- `d.id = ANY ($1)`: joined only to the unnest, a large batch was planned
  -- as a sequential scan of the table.)
  AND d.lease_expires_at > clock_timestamp()
