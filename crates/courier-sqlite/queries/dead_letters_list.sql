-- A page of dead letters, oldest first by (dead_at, id), above the key (?6
-- dead_at, ?7 id; NULL: from the oldest), at most ?8. The caller passes the
-- cursor or the start of the dead_at range, whichever is higher
-- (DeadLetterFilter::scan_bounds); with a message id it narrows the key and
-- the range's end to that message's dead letters. Filters (NULL: any):
-- tenant ?1, topic ?2, subscription ?3, message id ?4, and the
-- dead_at range's end ?5 in
-- milliseconds, and the fingerprint ?9 of the last failure (`unknown` also
-- matches a dead row without one).
-- Touches: reads deliveries and messages. Locks: nothing.
-- Shape: the key and the range's end are bounds on deliveries_dead_at
-- (dead_at, id) WHERE state = 'dead', written with coalesce so that the
-- planner can seek on them. Every dead letter Courier writes has a dead_at; a row made
-- dead by hand without one is not listed (count, retry and discard by filter
-- still see it).
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload, d.attempts, d.errors, d.dead_at, m.created_at
FROM deliveries d
JOIN messages m ON m.id = d.message_id
WHERE d.state = 'dead'
  AND (?1 IS NULL OR d.tenant = ?1)
  AND (?2 IS NULL OR d.topic = ?2)
  AND (?3 IS NULL OR d.subscription = ?3)
  AND (?4 IS NULL OR d.message_id = ?4)
  AND (?9 IS NULL OR coalesce(d.error_fingerprint, 'unknown') = ?9)
  AND d.dead_at < coalesce(?5, 9223372036854775807)
  AND (d.dead_at, d.id) > (coalesce(?6, -9223372036854775808), coalesce(?7, 0))
ORDER BY d.dead_at, d.id
LIMIT ?8
