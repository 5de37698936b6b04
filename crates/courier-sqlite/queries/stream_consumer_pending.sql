-- How many entries are pending for consumer ?4 of group ?3 on stream
-- (?1 tenant, ?2 stream).
-- Touches: stream_pending (read along stream_pending_consumer). Locks:
-- inside delete_consumer's BEGIN IMMEDIATE, so no read can add one before
-- the delete.
SELECT count(*) FROM stream_pending
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND consumer = ?4
