-- Returns deliveries whose lease expired (database clock) to the queue, or
-- dead-letters those that used their last attempt, noting the expiry in the
-- error history. Scans the small deliveries_running index; skips rows a
-- completing worker holds locked.
WITH expired AS (
  SELECT id FROM {schema}.deliveries
  WHERE state = 'running' AND lease_expires_at <= clock_timestamp()
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.deliveries d
SET state = CASE WHEN d.attempts >= coalesce(d.max_attempts, 1) THEN 'dead' ELSE 'available' END,
    dead_at = CASE WHEN d.attempts >= coalesce(d.max_attempts, 1) THEN clock_timestamp() END,
    available_at = clock_timestamp(),
    errors = (CASE WHEN jsonb_array_length(d.errors) >= 20 THEN d.errors - 0 ELSE d.errors END)
             || jsonb_build_array(jsonb_build_object(
                  'attempt', d.attempts, 'at', clock_timestamp(),
                  'message', 'lease expired (worker ' || coalesce(d.claimed_by, '?') || ')')),
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL
FROM expired e
WHERE d.id = e.id
