-- A page of dead letters, oldest first by (dead_at, id), above the key ($6
-- dead_at, $7 id; NULL: from the oldest), at most $8. The caller passes the
-- cursor or the start of the dead_at range, whichever is higher
-- (DeadLetterFilter::scan_bounds); with a message id it narrows the key and
-- the range's end to that message's dead letters. Filters (NULL: any):
-- tenant $1, topic $2, subscription $3, message id $4, and the
-- dead_at range's end $5, the fingerprint $9 of the last failure
-- (`unknown` also matches a dead row without one).
-- Touches: reads deliveries and messages. Locks: nothing.
-- Shape: the key and the range's end are bounds on deliveries_dead_at
-- (dead_at, id) WHERE state = 'dead', written with coalesce so that they stay
-- index bounds in a generic plan: the scan starts at the key. Every dead letter
-- Courier writes has a dead_at; a row made dead by hand without one is not
-- listed (count, retry and discard by filter still see it).
SELECT d.id, d.message_id, d.subscription, d.tenant, d.topic, d.schema_version,
       m.payload::text AS payload, d.attempts, d.errors::text AS errors, d.dead_at, m.created_at
FROM {schema}.deliveries d
JOIN {schema}.messages m ON m.id = d.message_id
WHERE d.state = 'dead'
  AND ($1::text IS NULL OR d.tenant = $1)
  AND ($2::text IS NULL OR d.topic = $2)
  AND ($3::text IS NULL OR d.subscription = $3)
  AND ($4::uuid IS NULL OR d.message_id = $4)
  AND ($9::text IS NULL OR coalesce(d.error_fingerprint, 'unknown') = $9)
  AND d.dead_at < coalesce($5::timestamptz, 'infinity')
  AND (d.dead_at, d.id) > (coalesce($6::timestamptz, '-infinity'), coalesce($7::bigint, 0))
ORDER BY d.dead_at, d.id
LIMIT $8
