-- Makes dead letters deliverable now with their attempts reset; the error
-- history is kept. Selected by ids (?1, a JSON array) or, when ?1 is NULL, by
-- filter (?2 tenant, ?3 topic, ?4 subscription, ?6 message id, [?7, ?8) the
-- half-open range of dead_at in milliseconds, ?9 the fingerprint of the last
-- failure; NULL: any). ?5, when not
-- NULL (a JSON array), keeps only these tenants' rows: a tenant-scoped retry by
-- ids is this one statement, and another tenant's id is left alone.
-- Touches: deliveries (update). Locks: one autocommit statement.
UPDATE deliveries
SET state = 'available',
    attempts = 0,
    available_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER),
    dead_at = NULL
WHERE state = 'dead'
  AND (?5 IS NULL OR tenant IN (SELECT value FROM json_each(?5)))
  AND ((?1 IS NOT NULL AND id IN (SELECT value FROM json_each(?1)))
       OR (?1 IS NULL
           AND (?2 IS NULL OR tenant = ?2)
           AND (?3 IS NULL OR topic = ?3)
           AND (?4 IS NULL OR subscription = ?4)
           AND (?6 IS NULL OR message_id = ?6)
           AND (?7 IS NULL OR dead_at >= ?7)
           AND (?8 IS NULL OR dead_at < ?8)
           AND (?9 IS NULL OR coalesce(error_fingerprint, 'unknown') = ?9)))
