-- Returns deliveries whose lease expired (database clock) to the queue after
-- a backoff ($2 ms doubled per attempt spent, capped at $3 ms, jittered to
-- between half and all of that: the crash may have been the message's
-- fault), or dead-letters those that used their last attempt, noting the
-- expiry in the error history (newest 20 kept) and freeing their ordering
-- keys (and any orphaned key rows, see `orphans`). Every expiry has one
-- fingerprint, $4 (whichever worker held the lease). Scans the small
-- deliveries_running index; skips rows a completing worker holds locked.
WITH expired AS (
  SELECT id FROM {schema}.deliveries
  WHERE state = 'running' AND lease_expires_at <= clock_timestamp()
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
),
changed AS (
  UPDATE {schema}.deliveries d
  SET state = CASE WHEN d.attempts >= coalesce(d.max_attempts, 1) THEN 'dead' ELSE 'available' END,
      dead_at = CASE WHEN d.attempts >= coalesce(d.max_attempts, 1) THEN clock_timestamp() END,
      available_at = clock_timestamp()
                     + least($3::double precision,
                             $2::double precision * power(2, least(greatest(d.attempts - 1, 0), 30)))
                       * (0.5 + random() / 2) * interval '1 millisecond',
      errors = (CASE WHEN jsonb_array_length(d.errors) >= 20 THEN d.errors - 0 ELSE d.errors END)
               || jsonb_build_array(jsonb_build_object(
                    'attempt', d.attempts, 'at', clock_timestamp(),
                    'message', 'lease expired (worker ' || coalesce(d.claimed_by, '?') || ')')),
      error_fingerprint = $4,
      lease_token = NULL,
      lease_expires_at = NULL,
      claimed_by = NULL
  FROM expired e
  WHERE d.id = e.id
  RETURNING d.id, d.subscription, d.tenant, d.ordering_key, d.state AS state, d.available_at
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
),
-- Rows whose delivery is no longer running: left by a worker of a version
-- before ordering_locks settling a delivery the 0004 migration had locked,
-- or by a subscription deleted with its deliveries. Each would block its key
-- forever. Safe against claims: a claim commits its row and the running
-- state together, so a snapshot that sees the row sees the delivery running
-- until a settle deletes both at once.
orphans AS (
  DELETE FROM {schema}.ordering_locks o
  WHERE NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                    WHERE d.id = o.delivery_id AND d.state = 'running')
)
SELECT count(*) FROM changed
