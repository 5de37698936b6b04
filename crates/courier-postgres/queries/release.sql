-- Hands claimed-but-unstarted deliveries back at shutdown, giving back the
-- attempt the claim spent, and frees their ordering keys. Fenced like
-- complete.sql: the lease token (set only while running) and an unexpired
-- lease on the database clock (an expired claim may be anyone's by now; the
-- rescuer settles it, attempt spent).
WITH changed AS (
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
    AND d.lease_expires_at > clock_timestamp()
  RETURNING d.id, d.subscription, d.tenant, d.ordering_key, d.state AS state, d.available_at
),
marked AS (
  -- Waiting again, maybe below other claimers' floors: announce it (see
  -- migrations/0009_claim_marks.sql).
  INSERT INTO {schema}.claim_marks (subscription, delivery_id, tenant, due_at)
  SELECT s.subscription, s.id, s.tenant, s.available_at FROM changed s
  WHERE s.state = 'available'
  ORDER BY s.subscription, s.id
  ON CONFLICT (subscription, delivery_id) DO UPDATE SET due_at = excluded.due_at
),
unlocked AS (
  -- The key's next delivery may run now (see claim.sql, `keyed`).
  DELETE FROM {schema}.ordering_locks o
  USING changed s
  WHERE s.ordering_key IS NOT NULL
    AND o.subscription = s.subscription AND o.tenant = s.tenant
    AND o.ordering_key = s.ordering_key AND o.delivery_id = s.id
)
SELECT id FROM changed
