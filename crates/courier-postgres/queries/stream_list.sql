-- A page of streams of tenants $1 (NULL: every tenant) after (tenant $2,
-- stream $3) (NULL: from the first), by (tenant, stream) in byte order
-- ("C", as SQLite and Redis order), at most $4: one row per (stream, group),
-- or one row with NULL group columns for a stream without groups; `more`
-- says whether a stream follows the page.
--
-- There is no table of streams: a stream exists while it has entries or
-- groups. The walk finds them with loose index scans of the primary keys of
-- stream_entries and stream_groups, one index descent per tenant and per
-- stream (of the tenants at or after the cursor's), never reading their
-- entries. It walks in the database's collation and sorts in "C", since
-- the primary keys need not be in byte order; so every page visits every
-- such stream, not only the page's (a "C" index would let it stop early).
--
-- Per stream of the page: its length is a count(*) over its range of the
-- stream_entries primary key, since the schema keeps no count, so it reads
-- the page's streams' entries (index-only where the visibility map allows)
-- and no other stream's; its newest id is one descent of the same key. Per
-- group: consumers and pending entries are counts over a primary-key prefix
-- of stream_consumers and stream_pending, and the lag is stream_lag.sql's
-- count (the entries above its cursor). All in one statement, so a page is
-- summed up as of one snapshot.
-- Touches: stream_entries, stream_groups, stream_consumers, stream_pending
-- (read). Locks: none.
WITH RECURSIVE
entry_tenants AS (
  (SELECT e.tenant FROM {schema}.stream_entries e
   WHERE $1::text[] IS NULL
   ORDER BY e.tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT e.tenant FROM {schema}.stream_entries e
          WHERE e.tenant > t.tenant
          ORDER BY e.tenant LIMIT 1)
  FROM entry_tenants t
  WHERE t.tenant IS NOT NULL
),
group_tenants AS (
  (SELECT g.tenant FROM {schema}.stream_groups g
   WHERE $1::text[] IS NULL
   ORDER BY g.tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT g.tenant FROM {schema}.stream_groups g
          WHERE g.tenant > t.tenant
          ORDER BY g.tenant LIMIT 1)
  FROM group_tenants t
  WHERE t.tenant IS NOT NULL
),
tenants AS (
  SELECT u.tenant
  FROM (SELECT listed.tenant FROM unnest($1::text[]) AS listed(tenant)
        UNION SELECT tenant FROM entry_tenants
        UNION SELECT tenant FROM group_tenants) u
  WHERE u.tenant IS NOT NULL
    AND ($2::text IS NULL OR u.tenant COLLATE "C" >= $2::text)
),
entry_streams AS (
  SELECT t.tenant,
         (SELECT e.stream FROM {schema}.stream_entries e
          WHERE e.tenant = t.tenant
          ORDER BY e.stream LIMIT 1) AS stream
  FROM tenants t
  UNION ALL
  SELECT s.tenant,
         (SELECT e.stream FROM {schema}.stream_entries e
          WHERE e.tenant = s.tenant AND e.stream > s.stream
          ORDER BY e.stream LIMIT 1)
  FROM entry_streams s
  WHERE s.stream IS NOT NULL
),
group_streams AS (
  SELECT t.tenant,
         (SELECT g.stream FROM {schema}.stream_groups g
          WHERE g.tenant = t.tenant
          ORDER BY g.stream LIMIT 1) AS stream
  FROM tenants t
  UNION ALL
  SELECT s.tenant,
         (SELECT g.stream FROM {schema}.stream_groups g
          WHERE g.tenant = s.tenant AND g.stream > s.stream
          ORDER BY g.stream LIMIT 1)
  FROM group_streams s
  WHERE s.stream IS NOT NULL
),
candidates AS (
  SELECT u.tenant, u.stream
  FROM (SELECT tenant, stream FROM entry_streams
        UNION SELECT tenant, stream FROM group_streams) u
  WHERE u.stream IS NOT NULL
    AND ($2::text IS NULL
         OR u.tenant COLLATE "C" > $2::text
         OR (u.tenant = $2::text AND u.stream COLLATE "C" > $3::text))
  ORDER BY u.tenant COLLATE "C", u.stream COLLATE "C"
  LIMIT $4 + 1
),
page AS MATERIALIZED (
  SELECT c.tenant, c.stream,
         (SELECT count(*) FROM {schema}.stream_entries e
          WHERE e.tenant = c.tenant AND e.stream = c.stream) AS length,
         newest.major AS last_major, newest.minor AS last_minor
  FROM (SELECT tenant, stream FROM candidates
        ORDER BY tenant COLLATE "C", stream COLLATE "C"
        LIMIT $4) c
  LEFT JOIN LATERAL (
    SELECT e.major, e.minor FROM {schema}.stream_entries e
    WHERE e.tenant = c.tenant AND e.stream = c.stream
    ORDER BY e.major DESC, e.minor DESC
    LIMIT 1) newest ON true
)
SELECT (SELECT count(*) FROM candidates) > $4 AS more,
       p.tenant, p.stream, p.length, p.last_major, p.last_minor,
       g.grp, g.last_major AS group_major, g.last_minor AS group_minor,
       (SELECT count(*) FROM {schema}.stream_consumers c
        WHERE c.tenant = g.tenant AND c.stream = g.stream AND c.grp = g.grp) AS consumers,
       (SELECT count(*) FROM {schema}.stream_pending n
        WHERE n.tenant = g.tenant AND n.stream = g.stream AND n.grp = g.grp) AS pending,
       (SELECT count(*) FROM {schema}.stream_entries e
        WHERE e.tenant = g.tenant AND e.stream = g.stream
          AND (e.major, e.minor) > (g.last_major, g.last_minor)
          AND (g.start_snapshot IS NULL
               OR NOT pg_visible_in_snapshot(e.major::text::xid8, g.start_snapshot))) AS lag
FROM page p
LEFT JOIN {schema}.stream_groups g ON g.tenant = p.tenant AND g.stream = p.stream
ORDER BY p.tenant COLLATE "C", p.stream COLLATE "C", g.grp COLLATE "C"
