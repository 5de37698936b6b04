-- Whether group ?3 of stream (?1 tenant, ?2 stream) has entries above its
-- cursor: the read-only check a blocked read polls before it takes the
-- write lock to read them.
-- Touches: stream_groups, stream_entries (read). Locks: none.
SELECT EXISTS (
  SELECT 1
  FROM stream_groups g
  JOIN stream_entries e ON e.tenant = g.tenant AND e.stream = g.stream AND e.id > g.last_id
  WHERE g.tenant = ?1 AND g.stream = ?2 AND g.group_name = ?3
) AS ready
