-- Re-reads up to $7 of consumer $4's own pending entries of group $3 on stream
-- ($1, $2) above id ($5, $6), in id order. Entries still stored are
-- delivered once more (deliveries + 1, delivery time now); trimmed ones come
-- back with `present` false and stay pending, untouched (as Redis does).
-- One row always: `found` is false when the group does not exist.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
mine AS (
  -- One primary-key probe per pending entry (LATERAL with LIMIT 1 is never
  -- folded into a join the planner could hash).
  SELECT p.major, p.minor, e.present IS NOT NULL AS present
  FROM (SELECT q.major, q.minor FROM {schema}.stream_pending q
        WHERE q.tenant = $1 AND q.stream = $2 AND q.grp = $3 AND q.consumer = $4
          AND (q.major, q.minor) > ($5, $6)
        ORDER BY q.major, q.minor
        LIMIT $7) p
  LEFT JOIN LATERAL (
    SELECT true AS present FROM {schema}.stream_entries e
    WHERE e.tenant = $1 AND e.stream = $2 AND e.major = p.major AND e.minor = p.minor
    LIMIT 1
  ) e ON true
),
redelivered AS (
  UPDATE {schema}.stream_pending p
  SET deliveries = p.deliveries + 1, delivered_at = statement_timestamp()
  FROM mine m
  WHERE m.present AND p.tenant = $1 AND p.stream = $2 AND p.grp = $3
    AND p.major = m.major AND p.minor = m.minor AND p.consumer = $4
  RETURNING p.major, p.minor, p.deliveries
),
seen AS (
  UPDATE {schema}.stream_consumers c SET seen_at = statement_timestamp()
  WHERE c.tenant = $1 AND c.stream = $2 AND c.grp = $3 AND c.consumer = $4
)
SELECT EXISTS (SELECT 1 FROM g) AS found, m.major, m.minor, r.deliveries,
       e.payload, e.headers, e.message_id, e.origin_tenant, e.topic, e.schema_version
FROM (SELECT 1) one
LEFT JOIN mine m ON true
LEFT JOIN redelivered r ON r.major = m.major AND r.minor = m.minor
LEFT JOIN LATERAL (
  SELECT x.payload, x.headers, x.message_id, x.origin_tenant, x.topic, x.schema_version
  FROM {schema}.stream_entries x
  WHERE r.major IS NOT NULL AND x.tenant = $1 AND x.stream = $2
    AND x.major = m.major AND x.minor = m.minor
  LIMIT 1
) e ON true
-- A present entry another consumer claimed meanwhile is not redelivered:
-- it is left out.
WHERE m.major IS NULL OR NOT m.present OR r.major IS NOT NULL
ORDER BY m.major, m.minor
