-- Removes message $1 and its deliveries $2 (locked and checked unstarted by
-- message_cancel_lock.sql in the same transaction; only those, and only
-- while still unstarted: the caller rolls back unless all of them went). The next waiting
-- delivery of each of its ordering keys may run now, maybe below other
-- claimers' floors: announce it (see migrations/0009_claim_marks.sql).
-- Returns whether the message existed and how many deliveries went.
-- Touches: deliveries, claim_marks, messages.
WITH gone AS (
  DELETE FROM {schema}.deliveries d
  WHERE d.message_id = $1 AND d.id = ANY ($2::bigint[])
    AND d.state = 'available' AND d.lease_token IS NULL
    AND d.attempts = 0 AND d.snoozes = 0
  RETURNING d.id, d.subscription, d.tenant, d.ordering_key
),
marked AS (
  INSERT INTO {schema}.claim_marks (subscription, delivery_id, tenant, due_at)
  SELECT g.subscription, n.id, g.tenant, clock_timestamp() FROM gone g
  CROSS JOIN LATERAL (
    SELECT e.id FROM {schema}.deliveries e
    WHERE e.subscription = g.subscription AND e.tenant = g.tenant
      AND e.ordering_key = g.ordering_key AND e.id > g.id AND e.state = 'available'
    ORDER BY e.id
    LIMIT 1
  ) n
  WHERE g.ordering_key IS NOT NULL
  ON CONFLICT (subscription, delivery_id) DO UPDATE SET due_at = excluded.due_at
),
message AS (
  DELETE FROM {schema}.messages m WHERE m.id = $1 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM message) AS existed, (SELECT count(*) FROM gone) AS deliveries
