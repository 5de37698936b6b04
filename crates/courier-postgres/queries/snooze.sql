-- Puts snoozed deliveries whose lease is still held (same fence as
-- complete.sql) back after their delay ($3 ms), giving back the attempt the
-- claim spent and counting the snooze, and frees their ordering keys. A
-- delivery that has already snoozed $5 times spends the attempt instead, like
-- a failure with reason $4: the history notes it, and when that was its last
-- attempt it is dead-lettered. The error it notes has the fingerprint $6
-- (computed in Rust from the reason), kept in error_fingerprint.
WITH changed AS (
  UPDATE {schema}.deliveries d
  SET state = CASE WHEN d.snoozes >= $5 AND d.attempts >= d.max_attempts
                   THEN 'dead' ELSE 'available' END,
      attempts = CASE WHEN d.snoozes >= $5 THEN d.attempts ELSE greatest(d.attempts - 1, 0) END,
      snoozes = d.snoozes + 1,
      available_at = CASE WHEN d.snoozes >= $5 AND d.attempts >= d.max_attempts
                          THEN d.available_at
                          ELSE clock_timestamp() + z.delay_ms * interval '1 millisecond' END,
      dead_at = CASE WHEN d.snoozes >= $5 AND d.attempts >= d.max_attempts
                     THEN clock_timestamp() END,
      lease_token = NULL,
      lease_expires_at = NULL,
      claimed_by = NULL,
      errors = CASE WHEN d.snoozes < $5 THEN d.errors
               ELSE (CASE WHEN jsonb_array_length(d.errors) >= 20 THEN d.errors - 0 ELSE d.errors END)
                    || jsonb_build_array(jsonb_build_object(
                         'attempt', d.attempts, 'at', clock_timestamp(),
                         'message', 'snoozed ' || d.snoozes || ' times already: ' || z.reason))
               END,
      error_fingerprint = CASE WHEN d.snoozes < $5 THEN d.error_fingerprint ELSE z.fingerprint END
  FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::text[], $6::text[])
       AS z (id, lease_token, delay_ms, reason, fingerprint)
  WHERE d.id = ANY ($1::bigint[])
    AND d.id = z.id
    AND d.lease_token = z.lease_token
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
