-- Returns up to ?1 deliveries whose lease expired (database clock) to the queue
-- after a backoff (?2 ms doubled per attempt spent, capped at ?3 ms, jittered
-- to between half and all of that: the crash may have been the message's
-- fault), or dead-letters those that used their last attempt, noting the
-- expiry in the error history (newest 20 kept) with the one fingerprint of
-- every expiry, ?4 (whichever worker held the lease).
-- Touches: deliveries (update). Locks: one autocommit statement; SQLite's single
-- writer means a completing worker either finished before this or finds its
-- lease gone. Shape: INDEXED BY keeps the scan on the small deliveries_running
-- index; without statistics the planner would rather walk every delivery in id
-- order to avoid sorting the few expired ones.
UPDATE deliveries
SET state = CASE WHEN attempts >= coalesce(max_attempts, 1) THEN 'dead' ELSE 'available' END,
    dead_at = CASE WHEN attempts >= coalesce(max_attempts, 1)
                   THEN CAST(round(unixepoch('subsec') * 1000) AS INTEGER) END,
    available_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
                   + CAST(min(?3, ?2 * (1 << min(max(attempts - 1, 0), 30)))
                          * (0.5 + (random() & 1048575) / 2097152.0) AS INTEGER),
    errors = json_insert(
      CASE WHEN json_array_length(errors) >= 20 THEN json_remove(errors, '$[0]') ELSE errors END,
      '$[#]',
      json_object('attempt', attempts,
                  'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                  'message', 'lease expired (worker ' || coalesce(claimed_by, '?') || ')')),
    error_fingerprint = ?4,
    lease_token = NULL,
    lease_expires_at = NULL,
    claimed_by = NULL
WHERE id IN (
  SELECT id FROM deliveries INDEXED BY deliveries_running
  WHERE state = 'running'
    AND lease_expires_at <= CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
  ORDER BY id
  LIMIT ?1
)
