-- Consumer $4 takes over pending entries of group $3 on stream ($1, $2)
-- idle at least $7 ms (database clock), scanning in id order from ($5, $6),
-- at most $8. Stored entries move to $4 with one more delivery; trimmed ones
-- leave pending and are reported. Rows: kind 'group' (always one; `found`
-- says whether the group exists), 'claimed' (with the entry), 'deleted',
-- and 'next' (the cursor to continue from, when more idle entries may follow).
-- A row another claim is taking over is skipped: no entry goes to two
-- consumers.
WITH g AS (
  SELECT 1 FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
candidates AS (
  SELECT p.ctid AS tid, p.major, p.minor
  FROM {schema}.stream_pending p
  WHERE p.tenant = $1 AND p.stream = $2 AND p.grp = $3
    AND (p.major, p.minor) >= ($5, $6)
    AND p.delivered_at <= statement_timestamp() - $7::bigint * interval '1 millisecond'
  ORDER BY p.major, p.minor
  LIMIT $8 + 1
  -- Rows another claim is taking over are skipped, not waited for: after
  -- the wait, only the idle filter would be checked again, and with a
  -- small min_idle both claims would pass it.
  FOR UPDATE OF p SKIP LOCKED
),
taken AS (
  -- One primary-key probe per candidate (LATERAL with LIMIT 1 is never
  -- folded into a join the planner could hash).
  SELECT c.tid, c.major, c.minor, e.present IS NOT NULL AS present
  FROM (SELECT tid, major, minor FROM candidates ORDER BY major, minor LIMIT $8) c
  LEFT JOIN LATERAL (
    SELECT true AS present FROM {schema}.stream_entries e
    WHERE e.tenant = $1 AND e.stream = $2 AND e.major = c.major AND e.minor = c.minor
    LIMIT 1
  ) e ON true
),
-- The rows locked above are updated and deleted by their ctid (stable while
-- this statement holds their lock): one TID probe per row. Joined on the key
-- instead, the generic plan (which takes `taken` and the group's pending
-- list for one row each) scanned the group's whole pending list once per
-- taken row: 10,000 pending entries made a claim of 100 take 200 ms. A row
-- that another transaction changed after this statement's snapshot and
-- before its lock is locked in its new version, which this snapshot cannot
-- see: it is neither claimed nor dropped now, and stays pending for the next
-- claim (the cursor moves past it; nothing is lost or given to two).
claimed AS (
  UPDATE {schema}.stream_pending p
  SET consumer = $4, deliveries = p.deliveries + 1, delivered_at = statement_timestamp()
  FROM taken t
  WHERE t.present AND p.ctid = t.tid
  RETURNING p.major, p.minor, p.deliveries
),
dropped AS (
  DELETE FROM {schema}.stream_pending p
  USING taken t
  WHERE NOT t.present AND p.ctid = t.tid
  RETURNING p.major, p.minor
),
seen AS (
  INSERT INTO {schema}.stream_consumers (tenant, stream, grp, consumer, seen_at)
  SELECT $1, $2, $3, $4, statement_timestamp() FROM g
  ON CONFLICT (tenant, stream, grp, consumer) DO UPDATE SET seen_at = excluded.seen_at
)
SELECT 'group' AS kind, EXISTS (SELECT 1 FROM g) AS found, NULL::bigint AS major,
       NULL::bigint AS minor, NULL::int AS deliveries, NULL::jsonb AS payload,
       NULL::jsonb AS headers, NULL::uuid AS message_id, NULL::text AS origin_tenant,
       NULL::text AS topic, NULL::int AS schema_version
UNION ALL
SELECT 'claimed', true, c.major, c.minor, c.deliveries, e.payload, e.headers, e.message_id,
       e.origin_tenant, e.topic, e.schema_version
FROM claimed c
CROSS JOIN LATERAL (
  SELECT x.payload, x.headers, x.message_id, x.origin_tenant, x.topic, x.schema_version
  FROM {schema}.stream_entries x
  WHERE x.tenant = $1 AND x.stream = $2 AND x.major = c.major AND x.minor = c.minor
  LIMIT 1
) e
UNION ALL
SELECT 'deleted', true, d.major, d.minor, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM dropped d
UNION ALL
SELECT 'next', true, n.major, n.minor, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM (SELECT major, minor FROM candidates ORDER BY major, minor OFFSET $8 LIMIT 1) n
