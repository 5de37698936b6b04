-- Dead letters grouped by the fingerprint of their last failure: the $8
-- largest groups by count, then fingerprint. Filters (NULL: any): tenant $1,
-- topic $2, subscription $3, message id $4, the half-open range [$5, $6) of
-- dead_at, fingerprint $7 — as in dead_letters_count.sql, so a group's count
-- is what a retry or discard by its fingerprint would act on now. A dead row
-- without a fingerprint (only one made dead by hand) is `unknown`, like the
-- dead letters migration 0015 found.
-- The sample is the last error of the group's newest delivery (highest id).
-- Touches: reads deliveries. Locks: nothing.
-- Shape: every column the grouping reads is in the partial index
-- deliveries_dead_fingerprint (dead rows only): an index-only scan, and open
-- work is never read; the sample is one primary-key lookup per group
-- returned.
WITH groups AS (
  SELECT coalesce(d.error_fingerprint, 'unknown') AS fingerprint,
         count(*) AS dead,
         min(d.dead_at) AS first_seen,
         max(d.dead_at) AS last_seen,
         array_agg(DISTINCT d.subscription ORDER BY d.subscription) AS subscriptions,
         array_agg(DISTINCT d.topic ORDER BY d.topic) AS topics,
         max(d.id) AS sample_id
  FROM {schema}.deliveries d
  WHERE d.state = 'dead'
    AND ($1::text IS NULL OR d.tenant = $1)
    AND ($2::text IS NULL OR d.topic = $2)
    AND ($3::text IS NULL OR d.subscription = $3)
    AND ($4::uuid IS NULL OR d.message_id = $4)
    AND ($5::timestamptz IS NULL OR d.dead_at >= $5)
    AND ($6::timestamptz IS NULL OR d.dead_at < $6)
    AND ($7::text IS NULL OR coalesce(d.error_fingerprint, 'unknown') = $7)
  GROUP BY 1
  ORDER BY dead DESC, fingerprint
  LIMIT $8
)
SELECT g.fingerprint, g.dead, g.first_seen, g.last_seen, g.subscriptions, g.topics,
       coalesce(s.errors -> -1 ->> 'message', '') AS sample_error
FROM groups g
JOIN {schema}.deliveries s ON s.id = g.sample_id
ORDER BY g.dead DESC, g.fingerprint
