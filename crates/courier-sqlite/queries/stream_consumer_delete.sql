-- Deletes consumer ?4 of group ?3 on stream (?1 tenant, ?2 stream).
-- Touches: stream_consumers (one row). Locks: inside delete_consumer's
-- BEGIN IMMEDIATE, after stream_consumer_pending.sql found nothing pending.
DELETE FROM stream_consumers
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND consumer = ?4
