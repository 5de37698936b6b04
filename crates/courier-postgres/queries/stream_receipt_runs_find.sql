-- Which of subscription $1's receipts exist: among the entries of stream $2
-- with majors $3 and minors $4 (stored form, migration 0017), which span at
-- most the run span (the caller splits a lookup that spans more), in the
-- runs that may hold them: those whose last major is between $5 and $6 and
-- whose first is at most $7 ($5 the lowest major, $7 the highest, $6 the
-- highest plus the run span); and among the correlation ids $8 in
-- stream_receipts (probed only when one of its receipts sorts between the
-- lowest and highest of $8: transactional subscriptions, receipts older
-- than the runs). An id found in a run comes back as (NULL, its 1-based
-- position in $3), a found correlation id as (it, NULL).
WITH runs AS MATERIALIZED (
  SELECT t.major, t.minor
  FROM {schema}.stream_receipt_runs r
  CROSS JOIN LATERAL unnest(r.majors, r.minors) AS t(major, minor)
  WHERE r.subscription = $1 AND r.stream = $2
    AND r.last_major BETWEEN $5 AND $6 AND r.first_major <= $7
)
SELECT NULL::text AS correlation_id, w.n
FROM unnest($3::bigint[], $4::bigint[]) WITH ORDINALITY AS w(major, minor, n)
WHERE EXISTS (SELECT 1 FROM runs WHERE runs.major = w.major AND runs.minor = w.minor)
UNION ALL
SELECT s.correlation_id, NULL::bigint
FROM {schema}.stream_receipts s
WHERE s.subscription = $1 AND s.correlation_id = ANY ($8::text[])
  AND EXISTS (
    SELECT 1 FROM {schema}.stream_receipts x
    WHERE x.subscription = $1
      AND x.correlation_id >= (SELECT min(c) FROM unnest($8::text[]) AS c)
      AND x.correlation_id <= (SELECT max(c) FROM unnest($8::text[]) AS c)
  )
