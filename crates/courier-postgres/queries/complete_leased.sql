-- Completes a batch of transactional deliveries inside their shared
-- transaction, fenced like complete.sql (the receipts are already written).
-- Locks the deleted rows until the transaction ends; frees their ordering keys.
-- Returns how many passed the fence; the caller rolls back unless all did.
WITH done AS (
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
  RETURNING d.id, d.tenant, d.subscription, d.ordering_key
),
unlocked AS (
  -- The key's next delivery may run now (see claim.sql, `keyed`).
  DELETE FROM {schema}.ordering_locks o
  USING done s
  WHERE s.ordering_key IS NOT NULL
    AND o.subscription = s.subscription AND o.tenant = s.tenant
    AND o.ordering_key = s.ordering_key AND o.delivery_id = s.id
)
SELECT count(*) FROM done
