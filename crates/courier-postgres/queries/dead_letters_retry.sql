-- Makes dead letters deliverable now with their attempts reset; the error
-- history is kept. Selected by ids ($1) or, when $1 is NULL, by filter
-- ($2 tenant, $3 topic, $4 subscription; NULL: any).
UPDATE {schema}.deliveries d
SET state = 'available', attempts = 0, available_at = now(), dead_at = NULL
WHERE d.state = 'dead'
  AND (($1::bigint[] IS NOT NULL AND d.id = ANY ($1))
       OR ($1::bigint[] IS NULL
           AND ($2::text IS NULL OR d.tenant = $2)
           AND ($3::text IS NULL OR d.topic = $3)
           AND ($4::text IS NULL OR d.subscription = $4)))
