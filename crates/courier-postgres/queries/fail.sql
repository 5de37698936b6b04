-- Records failed attempts on deliveries whose lease is still held (same fence
-- as complete.sql). A delivery goes back to `available` after its delay ($4 ms)
-- or, when the delay is NULL or the attempts are spent, to `dead`. The error
-- history keeps the newest 20 entries; error_fingerprint is the newest
-- error's ($5, computed in Rust: courier_core::error_fingerprint).
WITH changed AS (
  UPDATE {schema}.deliveries d
  SET state = CASE WHEN f.delay_ms IS NULL OR d.attempts >= d.max_attempts
                   THEN 'dead' ELSE 'available' END,
      available_at = CASE WHEN f.delay_ms IS NULL OR d.attempts >= d.max_attempts
                          THEN d.available_at
                          ELSE clock_timestamp() + f.delay_ms * interval '1 millisecond' END,
      dead_at = CASE WHEN f.delay_ms IS NULL OR d.attempts >= d.max_attempts
                     THEN clock_timestamp() END,
      lease_token = NULL,
      lease_expires_at = NULL,
      claimed_by = NULL,
      errors = (CASE WHEN jsonb_array_length(d.errors) >= 20 THEN d.errors - 0 ELSE d.errors END)
               || jsonb_build_array(jsonb_build_object(
                    'attempt', d.attempts, 'at', clock_timestamp(), 'message', f.error)),
      error_fingerprint = f.fingerprint
  FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], $5::text[])
       AS f (id, lease_token, error, delay_ms, fingerprint)
  WHERE d.id = ANY ($1::bigint[])
    AND d.id = f.id
    AND d.lease_token = f.lease_token
    -- The token is the running state: only a claim sets one; fail, release and
    -- rescue clear it. (Testing `state = 'running'` as well would let the planner
    -- walk the deliveries_running partial index, whose dead entries a snapshot
    -- held elsewhere keeps; the primary key finds each row directly, through
    -- `d.id = ANY ($1)`: joined only to the unnest, a large batch was planned
    -- as a sequential scan of the table.)
    AND d.lease_expires_at > clock_timestamp()
  RETURNING d.id, d.state = 'dead' AS dead, d.subscription, d.tenant, d.ordering_key, d.state AS state, d.available_at
),
marked AS (
  -- Waiting again, maybe below other claimers' floors: announce it (see
  -- migrations/0009_claim_marks.sql).
  -- A dead-lettered head of an ordering key lets the key's next delivery
  -- run: announce that one.
  INSERT INTO {schema}.claim_marks (subscription, delivery_id, tenant, due_at)
  SELECT DISTINCT ON (w.subscription, w.id) w.subscription, w.id, w.tenant, w.due_at FROM (
    SELECT s.subscription, s.id, s.tenant, s.available_at AS due_at FROM changed s
    WHERE s.state = 'available'
    UNION ALL
    SELECT s.subscription, n.id, s.tenant, clock_timestamp() FROM changed s
    CROSS JOIN LATERAL (
      SELECT e.id FROM {schema}.deliveries e
      WHERE e.subscription = s.subscription AND e.tenant = s.tenant
        AND e.ordering_key = s.ordering_key AND e.id > s.id AND e.state = 'available'
      ORDER BY e.id
      LIMIT 1
    ) n
    WHERE s.state = 'dead' AND s.ordering_key IS NOT NULL
  ) w
  ORDER BY w.subscription, w.id, w.due_at
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
SELECT id, dead FROM changed
