-- Which of subscription $1's receipts exist: among the entries of stream $2
-- with majors $3 and minors $4 (stored form, migration 0017) in the runs
-- holding one of the distinct majors $5 (each probed alone: a run holding
-- major m has first_major <= m <= last_major <= m + the run span, $6 being
-- each m + the span), so a lookup reads only the runs that hold one of its
-- majors however far apart they are; and among the correlation ids $7 in
-- stream_receipts (probed only when one of its receipts sorts between the
-- lowest and highest of $7: transactional subscriptions, receipts older
-- than the runs). A found run id comes back as (NULL, major, minor), a
-- found correlation id as (it, NULL, NULL).
WITH runs AS MATERIALIZED (
  SELECT t.major, t.minor
  FROM (
    SELECT DISTINCT ON (r.ctid) r.majors, r.minors
    FROM unnest($5::bigint[], $6::bigint[]) AS p(major, upper)
    JOIN {schema}.stream_receipt_runs r
      ON r.subscription = $1 AND r.stream = $2
     AND r.last_major BETWEEN p.major AND p.upper AND r.first_major <= p.major
    ORDER BY r.ctid
  ) AS found
  CROSS JOIN LATERAL unnest(found.majors, found.minors) AS t(major, minor)
)
SELECT NULL::text AS correlation_id, w.major, w.minor
FROM unnest($3::bigint[], $4::bigint[]) AS w(major, minor)
WHERE EXISTS (SELECT 1 FROM runs WHERE runs.major = w.major AND runs.minor = w.minor)
UNION ALL
SELECT s.correlation_id, NULL::bigint, NULL::bigint
FROM {schema}.stream_receipts s
WHERE s.subscription = $1 AND s.correlation_id = ANY ($7::text[])
  AND EXISTS (
    SELECT 1 FROM {schema}.stream_receipts x
    WHERE x.subscription = $1
      AND x.correlation_id >= (SELECT min(c) FROM unnest($7::text[]) AS c)
      AND x.correlation_id <= (SELECT max(c) FROM unnest($7::text[]) AS c)
  )
