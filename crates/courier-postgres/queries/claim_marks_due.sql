-- For a claimer of subscription $1 handling routes ($2 topics, $3 versions;
-- '*' / 0: any): per tenant with marks (see migrations/0009_claim_marks.sql),
-- the lowest marked delivery that is due, still waits and is of one of the
-- routes: the caller's floor for that tenant must go below it.
-- Also deletes up to 1,000 marks of $1 whose delivery no longer waits
-- (claimed, done, dead or gone) and that came due more than 5 s ago: a mark
-- rewritten meanwhile by a fail or release (a fresh due time) is kept, and
-- rows another statement holds are skipped, so this never waits for one.
-- Touches: claim_marks (reads, deletes), reads deliveries by primary key.
WITH RECURSIVE tenants AS (
  (SELECT m.tenant FROM {schema}.claim_marks m
    WHERE m.subscription = $1 ORDER BY m.tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT m.tenant FROM {schema}.claim_marks m
           WHERE m.subscription = $1 AND m.tenant > t.tenant
           ORDER BY m.tenant LIMIT 1)
  FROM tenants t
  WHERE t.tenant IS NOT NULL
),
lows AS (
  SELECT t.tenant, w.id
  FROM tenants t
  CROSS JOIN LATERAL (
    SELECT d.id
    FROM {schema}.claim_marks m
    JOIN {schema}.deliveries d ON d.id = m.delivery_id
    WHERE m.subscription = $1 AND m.tenant = t.tenant
      AND m.due_at <= statement_timestamp()
      AND d.state = 'available'
      AND EXISTS (SELECT 1 FROM unnest($2::text[], $3::int[]) AS r (topic, schema_version)
                  WHERE (r.topic = d.topic OR r.topic = '*')
                    AND (r.schema_version = d.schema_version OR r.schema_version = 0))
    ORDER BY m.delivery_id
    LIMIT 1
  ) w
  WHERE t.tenant IS NOT NULL
),
spent AS (
  DELETE FROM {schema}.claim_marks m
  WHERE (m.subscription, m.delivery_id) IN (
    SELECT s.subscription, s.delivery_id FROM {schema}.claim_marks s
    WHERE s.subscription = $1
      AND s.due_at < statement_timestamp() - interval '5 seconds'
      AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                      WHERE d.id = s.delivery_id AND d.state = 'available')
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
  )
)
SELECT tenant, id AS low FROM lows
