-- Trims stream (?1 tenant, ?2 stream) to the entries with ids at or above
-- ?3. Pending rows stay: their re-reads report the entries deleted.
-- Touches: stream_entries (delete along stream_entries_position). Locks:
-- one autocommit statement.
DELETE FROM stream_entries
WHERE tenant = ?1 AND stream = ?2 AND id < ?3
