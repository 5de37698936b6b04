-- How many dead letters the filter matches: what dead_letters_retry.sql or
-- dead_letters_discard.sql given the same filter would act on now. Filter
-- (NULL: any): tenant ?1, topic ?2, subscription ?3, message id ?4, and the
-- half-open range [?5, ?6) of dead_at in milliseconds, and the fingerprint
-- ?7 of the last failure (`unknown` also matches a dead row without one).
-- Touches: reads deliveries. Locks: nothing.
SELECT count(*)
FROM deliveries d
WHERE d.state = 'dead'
  AND (?1 IS NULL OR d.tenant = ?1)
  AND (?2 IS NULL OR d.topic = ?2)
  AND (?3 IS NULL OR d.subscription = ?3)
  AND (?4 IS NULL OR d.message_id = ?4)
  AND (?5 IS NULL OR d.dead_at >= ?5)
  AND (?6 IS NULL OR d.dead_at < ?6)
  AND (?7 IS NULL OR coalesce(d.error_fingerprint, 'unknown') = ?7)
