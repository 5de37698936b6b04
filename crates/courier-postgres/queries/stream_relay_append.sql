-- The native relay's append: entry $3.. of outbox message $5 to stream ($1,
-- $2) unless the stream already holds an entry of that message; the look and
-- the append in one round trip. Returns the appended entry's id (duplicate
-- false), or the lowest existing entry's (duplicate true), or no row when
-- a transaction that relayed the same message at the same time committed
-- its entry after this statement began (the caller then reads that entry
-- with stream_relayed_entry).
-- Touches: stream_entries (read by stream_entries_origin, insert into
-- stream_entries_relayed too), stream_waiters (read), the minor sequence.
-- Locks: none beyond the insert; ON CONFLICT waits for a concurrent insert
-- of the same (tenant, stream, message) to end (migration 0018).
-- Shape: `found` reads the statement's snapshot, plain MVCC visibility and
-- not the readers' xmin horizon: the relay asks "did an append of this
-- message commit?", and an entry of a committed transaction above the
-- horizon counts, as do the caller's own earlier appends. OFFSET 0 keeps
-- the ORDER BY ... LIMIT 1 out of the inner query's plan: with it, the
-- generic plan walked the stream in id order (its primary key) filtering on
-- message_id, a scan of the whole stream per relayed message.
WITH found AS (
  SELECT o.major, o.minor
  FROM (
    SELECT e.major, e.minor
    FROM {schema}.stream_entries e
    WHERE e.tenant = $1 AND e.stream = $2 AND e.message_id = $5
    OFFSET 0
  ) o
  ORDER BY o.major, o.minor
  LIMIT 1
),
woken AS (
  -- As in stream_append: only the stream's readers wake, at commit.
  SELECT pg_notify('{schema}.streams', $1 || chr(10) || $2)
  FROM {schema}.stream_waiters w
  WHERE w.tenant = $1 AND w.stream = $2 AND w.until > statement_timestamp()
    AND NOT EXISTS (SELECT 1 FROM found)
),
appended AS (
  INSERT INTO {schema}.stream_entries
    (tenant, stream, major, minor, payload, headers, message_id, origin_tenant, topic,
     schema_version, relayed)
  SELECT $1, $2, pg_current_xact_id()::text::bigint, nextval('{schema}.stream_entry_minor'),
         $3::jsonb, $4::jsonb, $5, $6, $7, $8, true
  WHERE NOT EXISTS (SELECT 1 FROM found) AND (SELECT count(*) FROM woken) >= 0
  ON CONFLICT (tenant, stream, message_id) WHERE relayed DO NOTHING
  RETURNING major, minor
)
SELECT major, minor, false AS duplicate FROM appended
UNION ALL
SELECT major, minor, true AS duplicate FROM found
