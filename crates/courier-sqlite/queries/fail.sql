-- Records failed attempts on deliveries whose lease is still held (same fence
-- as complete.sql). ?1 is a JSON array of [delivery id, lease token, error,
-- delay in ms or null, fingerprint of the error (computed in Rust:
-- courier_core::error_fingerprint), kept in error_fingerprint]. A delivery goes back to `available` after its delay or,
-- when the delay is null or its attempts are spent, to `dead`. The error history
-- keeps the newest 20 entries; `at` is RFC 3339 text, as PostgreSQL's jsonb gives.
-- Touches: deliveries (update). Locks: one autocommit statement takes the write
-- lock for its own duration only.
UPDATE deliveries
SET state = CASE WHEN f.delay_ms IS NULL OR attempts >= max_attempts
                 THEN 'dead' ELSE 'available' END,
    available_at = CASE WHEN f.delay_ms IS NULL OR attempts >= max_attempts
                        THEN available_at
                        ELSE CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + f.delay_ms END,
    dead_at = CASE WHEN f.delay_ms IS NULL OR attempts >= max_attempts
                   THEN CAST(round(unixepoch('subsec') * 1000) AS INTEGER) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL,
    errors = json_insert(
      CASE WHEN json_array_length(errors) >= 20 THEN json_remove(errors, '$[0]') ELSE errors END,
      '$[#]',
      json_object('attempt', attempts,
                  'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                  'message', f.error)),
    error_fingerprint = f.fingerprint
FROM (SELECT value ->> 0 AS id, value ->> 1 AS lease_token, value ->> 2 AS error,
             value ->> 3 AS delay_ms, value ->> 4 AS fingerprint
      FROM json_each(?1)) AS f
WHERE deliveries.id = f.id
  AND deliveries.lease_token = f.lease_token
  AND deliveries.state = 'running'
  AND deliveries.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
RETURNING id, state = 'dead' AS dead
