-- Writes subscription $1's receipts of stream $2's entries: run numbers $3,
-- majors $4, minors $5 (stored form, migration 0017), correlation ids $9,
-- one row per run. Entries that already have a receipt (a run found as in
-- stream_receipt_runs_find.sql with bounds $6, $7, $8, or a row of
-- stream_receipts, probed only when one sorts between $10 and $11, the
-- lowest and highest of $9) are left out; returns how many were new.
WITH had AS MATERIALIZED (
  SELECT t.major, t.minor
  FROM {schema}.stream_receipt_runs r
  CROSS JOIN LATERAL unnest(r.majors, r.minors) AS t(major, minor)
  WHERE r.subscription = $1 AND r.stream = $2
    AND r.last_major BETWEEN $6 AND $7 AND r.first_major <= $8
),
old AS MATERIALIZED (
  SELECT s.correlation_id
  FROM {schema}.stream_receipts s
  WHERE s.subscription = $1 AND s.correlation_id = ANY ($9::text[])
    AND EXISTS (
      SELECT 1 FROM {schema}.stream_receipts x
      WHERE x.subscription = $1 AND x.correlation_id BETWEEN $10 AND $11
    )
),
fresh AS (
  SELECT i.run, i.major, i.minor
  FROM unnest($3::int[], $4::bigint[], $5::bigint[], $9::text[])
    AS i(run, major, minor, correlation_id)
  WHERE NOT EXISTS (SELECT 1 FROM had h WHERE h.major = i.major AND h.minor = i.minor)
    AND NOT EXISTS (SELECT 1 FROM old o WHERE o.correlation_id = i.correlation_id)
),
added AS (
  INSERT INTO {schema}.stream_receipt_runs
    (subscription, stream, first_major, last_major, majors, minors)
  SELECT $1, $2, min(f.major), max(f.major),
    array_agg(f.major ORDER BY f.major, f.minor), array_agg(f.minor ORDER BY f.major, f.minor)
  FROM fresh f
  GROUP BY f.run
  RETURNING cardinality(majors) AS n
)
SELECT coalesce(sum(n), 0)::bigint FROM added
