-- How many dead letters the filter matches: what dead_letters_retry.sql or
-- dead_letters_discard.sql given the same filter would act on now. Filter
-- (NULL: any): tenant $1, topic $2, subscription $3, message id $4, and the
-- half-open range [$5, $6) of dead_at, and the fingerprint $7 of the last
-- failure (`unknown` also matches a dead row without one).
-- Touches: reads deliveries. Locks: nothing.
-- Shape: a range can use deliveries_dead_at, a subscription deliveries_dead,
-- a message id the (message_id, subscription) unique index.
SELECT count(*)
FROM {schema}.deliveries d
WHERE d.state = 'dead'
  AND ($1::text IS NULL OR d.tenant = $1)
  AND ($2::text IS NULL OR d.topic = $2)
  AND ($3::text IS NULL OR d.subscription = $3)
  AND ($4::uuid IS NULL OR d.message_id = $4)
  AND ($5::timestamptz IS NULL OR d.dead_at >= $5)
  AND ($6::timestamptz IS NULL OR d.dead_at < $6)
  AND ($7::text IS NULL OR coalesce(d.error_fingerprint, 'unknown') = $7)
