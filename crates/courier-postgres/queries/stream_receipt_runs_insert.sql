-- Writes subscription $1's receipts of one run of stream $2's entries:
-- majors $3, minors $4 (stored form, migration 0017), correlation ids $8,
-- spanning at most the run span, as one row. Entries that already have a
-- receipt (in a run found as stream_receipt_runs_find.sql finds them, with
-- the bounds $5, $6, $7, or a row of stream_receipts, probed only when one
-- sorts between the lowest and highest of $8) are left out; returns how
-- many were new.
WITH had AS MATERIALIZED (
  SELECT t.major, t.minor
  FROM {schema}.stream_receipt_runs r
  CROSS JOIN LATERAL unnest(r.majors, r.minors) AS t(major, minor)
  WHERE r.subscription = $1 AND r.stream = $2
    AND r.last_major BETWEEN $5 AND $6 AND r.first_major <= $7
),
old AS MATERIALIZED (
  SELECT s.correlation_id
  FROM {schema}.stream_receipts s
  WHERE s.subscription = $1 AND s.correlation_id = ANY ($8::text[])
    AND EXISTS (
      SELECT 1 FROM {schema}.stream_receipts x
      WHERE x.subscription = $1
        AND x.correlation_id >= (SELECT min(c) FROM unnest($8::text[]) AS c)
        AND x.correlation_id <= (SELECT max(c) FROM unnest($8::text[]) AS c)
    )
),
fresh AS (
  SELECT i.major, i.minor
  FROM unnest($3::bigint[], $4::bigint[], $8::text[]) AS i(major, minor, correlation_id)
  WHERE NOT EXISTS (SELECT 1 FROM had h WHERE h.major = i.major AND h.minor = i.minor)
    AND NOT EXISTS (SELECT 1 FROM old o WHERE o.correlation_id = i.correlation_id)
),
added AS (
  INSERT INTO {schema}.stream_receipt_runs
    (subscription, stream, first_major, last_major, majors, minors)
  SELECT $1, $2, min(f.major), max(f.major),
    array_agg(f.major ORDER BY f.major, f.minor), array_agg(f.minor ORDER BY f.major, f.minor)
  FROM fresh f
  HAVING count(*) > 0
  RETURNING cardinality(majors) AS n
)
SELECT coalesce(sum(n), 0)::bigint FROM added
