-- The due marks of subscription $1 (see migrations/0009_claim_marks.sql) whose
-- delivery still waits and is of a route this claimer handles ($2 topics, $3
-- versions; '*' / 0: any): per tenant, the lowest such delivery id, where the
-- caller's floor must go below. Deletes the due marks whose delivery no longer
-- waits (claimed, done, dead or gone). At most 10,000 marks per call.
-- Touches: claim_marks (reads, deletes), reads deliveries by primary key.
WITH due AS (
  SELECT m.delivery_id FROM {schema}.claim_marks m
  WHERE m.subscription = $1 AND m.due_at <= statement_timestamp()
  ORDER BY m.due_at
  LIMIT 10000
),
waiting AS (
  SELECT d.id, d.tenant, d.topic, d.schema_version FROM {schema}.deliveries d
  WHERE d.id IN (SELECT delivery_id FROM due) AND d.state = 'available'
),
spent AS (
  DELETE FROM {schema}.claim_marks m
  WHERE m.subscription = $1
    AND m.delivery_id IN (SELECT delivery_id FROM due)
    AND m.delivery_id NOT IN (SELECT id FROM waiting)
)
SELECT w.tenant, min(w.id) AS low
FROM waiting w
WHERE EXISTS (SELECT 1 FROM unnest($2::text[], $3::int[]) AS r (topic, schema_version)
              WHERE (r.topic = w.topic OR r.topic = '*')
                AND (r.schema_version = w.schema_version OR r.schema_version = 0))
GROUP BY w.tenant
