-- The lag of group $3 on stream ($1, $2): its entries above the group's
-- cursor, which it has not handed out yet (committed ones, readable or still
-- above the readers' xmin horizon), less those a group created at the end
-- saw committed at its creation (as stream_read_new.sql skips them). No row:
-- no such group.
-- Touches: stream_groups (primary key), stream_entries (range of its primary
-- key). Locks: none.
SELECT (
  SELECT count(*)
  FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2
    AND (e.major, e.minor) > (g.last_major, g.last_minor)
    AND (g.start_snapshot IS NULL
         OR NOT pg_visible_in_snapshot(e.major::text::xid8, g.start_snapshot))
) AS lag
FROM {schema}.stream_groups g
WHERE g.tenant = $1 AND g.stream = $2 AND g.grp = $3
