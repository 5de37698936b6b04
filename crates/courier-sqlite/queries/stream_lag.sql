-- The lag of group ?3 on stream (?1 tenant, ?2 stream): its entries above
-- the group's cursor, which it has not handed out yet. No row: no such group.
-- Touches: stream_groups (primary key), stream_entries (along
-- stream_entries_position). Locks: none.
SELECT (
  SELECT count(*)
  FROM stream_entries e
  WHERE e.tenant = ?1 AND e.stream = ?2 AND e.id > g.last_id
) AS lag
FROM stream_groups g
WHERE g.tenant = ?1 AND g.stream = ?2 AND g.group_name = ?3
