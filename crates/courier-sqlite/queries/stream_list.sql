-- A page of streams of tenants ?1 (a JSON array; NULL: every tenant) after
-- (?2 tenant, ?3 stream) (NULL: from the first), by (tenant, stream) in byte
-- order (BINARY, as PostgreSQL's "C" and Redis order), at most ?4: one row
-- per (stream, group), or one row with NULL group columns for a stream
-- without groups; `more` says whether a stream follows the page.
--
-- There is no table of streams (migration 0005): a stream exists while it
-- has entries or groups. The walk finds them with loose index scans of
-- stream_entries_position and stream_groups' primary key, one index descent
-- per tenant and per stream (of the tenants at or after the cursor's), never
-- reading their entries; it is the PostgreSQL query's walk, which must see
-- every such stream because its indexes need not be in byte order.
--
-- Per stream of the page: its length is a count(*) over its range of
-- stream_entries_position, since the schema keeps no count, so it reads the
-- page's streams' entries (from the index alone) and no other stream's; its
-- newest id is one descent of the same index. Per group: consumers and
-- pending entries are counts over a primary-key prefix of stream_consumers
-- and stream_pending, and the lag is stream_lag.sql's count (the entries
-- above its cursor). One statement: a page is summed up as of one snapshot.
-- Touches: stream_entries, stream_groups, stream_consumers, stream_pending
-- (read). Locks: none (a read; WAL readers do not wait for writers).
WITH RECURSIVE
entry_tenants(tenant) AS (
  SELECT (SELECT e.tenant FROM stream_entries e ORDER BY e.tenant LIMIT 1)
  WHERE ?1 IS NULL
  UNION ALL
  SELECT (SELECT e.tenant FROM stream_entries e
          WHERE e.tenant > t.tenant
          ORDER BY e.tenant LIMIT 1)
  FROM entry_tenants t
  WHERE t.tenant IS NOT NULL
),
group_tenants(tenant) AS (
  SELECT (SELECT g.tenant FROM stream_groups g ORDER BY g.tenant LIMIT 1)
  WHERE ?1 IS NULL
  UNION ALL
  SELECT (SELECT g.tenant FROM stream_groups g
          WHERE g.tenant > t.tenant
          ORDER BY g.tenant LIMIT 1)
  FROM group_tenants t
  WHERE t.tenant IS NOT NULL
),
tenants(tenant) AS (
  SELECT u.tenant
  FROM (SELECT listed.value AS tenant FROM json_each(?1) AS listed
        UNION SELECT tenant FROM entry_tenants
        UNION SELECT tenant FROM group_tenants) u
  WHERE u.tenant IS NOT NULL
    AND (?2 IS NULL OR u.tenant >= ?2)
),
entry_streams(tenant, stream) AS (
  SELECT t.tenant,
         (SELECT e.stream FROM stream_entries e
          WHERE e.tenant = t.tenant
          ORDER BY e.stream LIMIT 1)
  FROM tenants t
  UNION ALL
  SELECT s.tenant,
         (SELECT e.stream FROM stream_entries e
          WHERE e.tenant = s.tenant AND e.stream > s.stream
          ORDER BY e.stream LIMIT 1)
  FROM entry_streams s
  WHERE s.stream IS NOT NULL
),
group_streams(tenant, stream) AS (
  SELECT t.tenant,
         (SELECT g.stream FROM stream_groups g
          WHERE g.tenant = t.tenant
          ORDER BY g.stream LIMIT 1)
  FROM tenants t
  UNION ALL
  SELECT s.tenant,
         (SELECT g.stream FROM stream_groups g
          WHERE g.tenant = s.tenant AND g.stream > s.stream
          ORDER BY g.stream LIMIT 1)
  FROM group_streams s
  WHERE s.stream IS NOT NULL
),
candidates(tenant, stream) AS (
  SELECT u.tenant, u.stream
  FROM (SELECT tenant, stream FROM entry_streams
        UNION SELECT tenant, stream FROM group_streams) u
  WHERE u.stream IS NOT NULL
    AND (?2 IS NULL OR (u.tenant, u.stream) > (?2, ?3))
  ORDER BY u.tenant, u.stream
  LIMIT ?4 + 1
),
page(tenant, stream, length, last_id) AS MATERIALIZED (
  SELECT c.tenant, c.stream,
         (SELECT count(*) FROM stream_entries e
          WHERE e.tenant = c.tenant AND e.stream = c.stream),
         (SELECT max(e.id) FROM stream_entries e
          WHERE e.tenant = c.tenant AND e.stream = c.stream)
  FROM (SELECT tenant, stream FROM candidates ORDER BY tenant, stream LIMIT ?4) c
)
SELECT (SELECT count(*) FROM candidates) > ?4 AS more,
       p.tenant, p.stream, p.length, p.last_id,
       g.group_name, g.last_id AS group_last_id,
       (SELECT count(*) FROM stream_consumers c
        WHERE c.tenant = g.tenant AND c.stream = g.stream
          AND c.group_name = g.group_name) AS consumers,
       (SELECT count(*) FROM stream_pending n
        WHERE n.tenant = g.tenant AND n.stream = g.stream
          AND n.group_name = g.group_name) AS pending,
       (SELECT count(*) FROM stream_entries e
        WHERE e.tenant = g.tenant AND e.stream = g.stream AND e.id > g.last_id) AS lag
FROM page p
LEFT JOIN stream_groups g ON g.tenant = p.tenant AND g.stream = p.stream
ORDER BY p.tenant, p.stream, g.group_name
