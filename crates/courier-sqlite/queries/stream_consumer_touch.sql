-- Creates consumer ?4 of group ?3 on stream (?1 tenant, ?2 stream), or marks
-- it seen now: every read and claim runs it.
-- Touches: stream_consumers (one row). Locks: inside the operation's
-- BEGIN IMMEDIATE.
INSERT INTO stream_consumers (tenant, stream, group_name, consumer, seen_at)
VALUES (?1, ?2, ?3, ?4, CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
ON CONFLICT (tenant, stream, group_name, consumer) DO UPDATE SET seen_at = excluded.seen_at
