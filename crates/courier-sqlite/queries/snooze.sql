-- Puts snoozed deliveries whose lease is still held (same fence as fail.sql)
-- back after their delay, giving back the attempt the claim spent and counting
-- the snooze. ?1 is a JSON array of [delivery id, lease token, delay in ms,
-- reason, fingerprint of the error a snooze past the bound notes]. A delivery that has already snoozed ?2 times spends the attempt
-- instead, like a failure: the history notes it (newest 20 kept), and when that
-- was its last attempt it is dead-lettered.
-- Touches: deliveries (update). Locks: one autocommit statement.
UPDATE deliveries
SET state = CASE WHEN snoozes >= ?2 AND attempts >= max_attempts THEN 'dead' ELSE 'available' END,
    attempts = CASE WHEN snoozes >= ?2 THEN attempts ELSE max(attempts - 1, 0) END,
    snoozes = snoozes + 1,
    available_at = CASE WHEN snoozes >= ?2 AND attempts >= max_attempts
                        THEN available_at
                        ELSE CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + z.delay_ms END,
    dead_at = CASE WHEN snoozes >= ?2 AND attempts >= max_attempts
                   THEN CAST(round(unixepoch('subsec') * 1000) AS INTEGER) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL,
    errors = CASE WHEN snoozes < ?2 THEN errors
             ELSE json_insert(
               CASE WHEN json_array_length(errors) >= 20 THEN json_remove(errors, '$[0]') ELSE errors END,
               '$[#]',
               json_object('attempt', attempts,
                           'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                           'message', 'snoozed ' || snoozes || ' times already: ' || z.reason))
             END,
    error_fingerprint = CASE WHEN snoozes < ?2 THEN error_fingerprint ELSE z.fingerprint END
FROM (SELECT value ->> 0 AS id, value ->> 1 AS lease_token, value ->> 2 AS delay_ms,
             value ->> 3 AS reason, value ->> 4 AS fingerprint
      FROM json_each(?1)) AS z
WHERE deliveries.id = z.id
  AND deliveries.lease_token = z.lease_token
  AND deliveries.state = 'running'
  AND deliveries.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
RETURNING id, state = 'dead' AS dead
