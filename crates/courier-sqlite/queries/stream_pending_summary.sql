-- How many entries are pending in group ?3 of stream (?1 tenant, ?2 stream),
-- and the lowest and highest of their ids.
-- Touches: stream_pending (read). Locks: none (inside a read transaction,
-- with stream_pending_per_consumer.sql, so both see one snapshot).
SELECT count(*) AS count, min(entry_id) AS lowest, max(entry_id) AS highest
FROM stream_pending
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
