-- Creates group ?3 on stream (?1 tenant, ?2 stream) unless it exists; returns
-- a row when it was created. Its cursor is ?4, or with ?4 NULL the stream's
-- newest entry (0 for an empty stream): it starts at the end.
-- Touches: stream_groups (insert). Locks: one autocommit statement.
-- Shape: DO NOTHING leaves an existing group's cursor where it is.
INSERT INTO stream_groups (tenant, stream, group_name, last_id)
VALUES (?1, ?2, ?3, coalesce(?4, (SELECT max(e.id) FROM stream_entries e
                                  WHERE e.tenant = ?1 AND e.stream = ?2), 0))
ON CONFLICT (tenant, stream, group_name) DO NOTHING
RETURNING 1 AS created
