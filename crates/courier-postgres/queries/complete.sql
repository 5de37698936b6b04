-- Completes claimed deliveries of plain handlers whose lease is still held:
-- deletes the delivery and frees its ordering key in one statement. No
-- receipt: only transactional handlers write one, in their effect's
-- transaction (receipts_insert_many.sql); the admin views derive `completed`
-- from a retained message with no open delivery. The fence is
-- the lease token (set only while running) and an unexpired lease on the
-- database clock; rows that fail it are left alone and missing from the result.
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
SELECT id FROM done
