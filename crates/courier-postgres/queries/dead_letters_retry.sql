-- Makes dead letters deliverable now with their attempts reset; the error
-- history is kept; returns how many. Selected by ids ($1) or, when $1 is NULL,
-- by filter ($2 tenant, $3 topic, $4 subscription, $6 message id, [$7, $8)
-- the half-open range of dead_at, $9 the fingerprint of the last failure;
-- NULL: any). $5, when not
-- NULL, keeps only these tenants' rows: a tenant-scoped retry by ids is this
-- one statement, and another tenant's id is left alone.
-- Touches: deliveries, claim_marks (each retried delivery is announced to
-- every claimer, see migrations/0009_claim_marks.sql).
WITH changed AS (
  UPDATE {schema}.deliveries d
  SET state = 'available', attempts = 0, available_at = now(), dead_at = NULL
  WHERE d.state = 'dead'
    AND ($5::text[] IS NULL OR d.tenant = ANY ($5))
    AND (($1::bigint[] IS NOT NULL AND d.id = ANY ($1))
         OR ($1::bigint[] IS NULL
             AND ($2::text IS NULL OR d.tenant = $2)
             AND ($3::text IS NULL OR d.topic = $3)
             AND ($4::text IS NULL OR d.subscription = $4)
             AND ($6::uuid IS NULL OR d.message_id = $6)
             AND ($7::timestamptz IS NULL OR d.dead_at >= $7)
             AND ($8::timestamptz IS NULL OR d.dead_at < $8)
             AND ($9::text IS NULL OR coalesce(d.error_fingerprint, 'unknown') = $9)))
  RETURNING d.id, d.subscription, d.tenant, d.available_at
),
marked AS (
  INSERT INTO {schema}.claim_marks (subscription, delivery_id, tenant, due_at)
  SELECT s.subscription, s.id, s.tenant, s.available_at FROM changed s
  ORDER BY s.subscription, s.id
  ON CONFLICT (subscription, delivery_id) DO UPDATE SET due_at = excluded.due_at
)
SELECT count(*) FROM changed
