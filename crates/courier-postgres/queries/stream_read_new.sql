-- Hands consumer $4 of group $3 on stream ($1, $2) up to $5 entries the group
-- has not handed out, in id order: they become pending for it (1 delivery)
-- and the group's cursor moves to the last. Only entries of transactions
-- below this snapshot's xmin are handed out (see the 0010 migration), so the
-- cursor never passes an entry that could still commit.
-- The group row is locked first: consumers of one group take turns, and a
-- consumer that waited reads the cursor its predecessor left.
-- One row always: `found` is false when the group does not exist; entry
-- columns are NULL when nothing was ready.
WITH g AS (
  SELECT s.last_major, s.last_minor, s.start_snapshot
  FROM {schema}.stream_groups s
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
  FOR UPDATE
),
horizon AS (
  SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin
),
picked AS (
  -- The cursor and the horizon are scalar subqueries (computed once, then
  -- bound like parameters), so the scan starts at the cursor in the primary
  -- key instead of filtering every entry the group has already read.
  SELECT e.major, e.minor, e.payload, e.headers, e.message_id, e.origin_tenant, e.topic,
         e.schema_version
  FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2
    AND (e.major, e.minor) > ((SELECT last_major FROM g), (SELECT last_minor FROM g))
    AND e.major < (SELECT xmin FROM horizon)
    AND ((SELECT start_snapshot FROM g) IS NULL
         OR NOT pg_visible_in_snapshot(e.major::text::xid8, (SELECT start_snapshot FROM g)))
  ORDER BY e.major, e.minor
  LIMIT $5
),
moved AS (
  UPDATE {schema}.stream_groups s
  SET last_major = l.major, last_minor = l.minor,
      -- Once the cursor is past every transaction the creation snapshot
      -- could call earlier, the snapshot decides nothing more.
      start_snapshot = CASE WHEN l.major >= pg_snapshot_xmax(s.start_snapshot)::text::bigint
                            THEN NULL ELSE s.start_snapshot END
  FROM (SELECT major, minor FROM picked ORDER BY major DESC, minor DESC LIMIT 1) l
  WHERE s.tenant = $1 AND s.stream = $2 AND s.grp = $3
),
pending AS (
  INSERT INTO {schema}.stream_pending
    (tenant, stream, grp, major, minor, consumer, delivered_at, deliveries)
  SELECT $1, $2, $3, p.major, p.minor, $4, statement_timestamp(), 1
  FROM picked p
),
seen AS (
  INSERT INTO {schema}.stream_consumers (tenant, stream, grp, consumer, seen_at)
  SELECT $1, $2, $3, $4, statement_timestamp() FROM g
  ON CONFLICT (tenant, stream, grp, consumer) DO UPDATE SET seen_at = excluded.seen_at
)
SELECT EXISTS (SELECT 1 FROM g) AS found,
       p.major, p.minor, p.payload, p.headers, p.message_id, p.origin_tenant, p.topic,
       p.schema_version
FROM (SELECT 1) one
LEFT JOIN picked p ON true
ORDER BY p.major, p.minor
