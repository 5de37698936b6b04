-- Takes back the latest delivery of the entries whose ids are in the JSON
-- array ?5 that are pending to consumer ?4 in group ?3 of stream (?1
-- tenant, ?2 stream): their delivery counts drop by one (not below 0),
-- delivered_at unchanged. The caller counts the rows.
-- Touches: stream_pending (update by primary key). Locks: one autocommit
-- statement under the store's write turn.
UPDATE stream_pending
SET deliveries = max(deliveries - 1, 0)
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND consumer = ?4
  AND entry_id IN (SELECT value FROM json_each(?5))
