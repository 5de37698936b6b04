-- The cursor of group ?3 on stream (?1 tenant, ?2 stream); no row: no such
-- group. Every group operation starts here, inside its transaction.
-- Touches: stream_groups (read by primary key). Locks: none of its own.
SELECT last_id FROM stream_groups
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
