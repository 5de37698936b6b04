-- Moves group ?3's cursor on stream (?1 tenant, ?2 stream) up to ?4, the
-- highest entry id a read just handed out.
-- Touches: stream_groups (one row). Locks: inside the read's BEGIN IMMEDIATE.
-- Shape: the guard keeps a cursor from ever moving back.
UPDATE stream_groups SET last_id = ?4
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND last_id < ?4
