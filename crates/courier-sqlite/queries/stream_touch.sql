-- Restarts the idle time of the entries whose ids are in the JSON array ?5
-- that are pending to consumer ?4 in group ?3 of stream (?1 tenant, ?2
-- stream): delivered now, their delivery counts unchanged. The caller counts
-- the rows.
-- Touches: stream_pending (update by primary key). Locks: one autocommit
-- statement under the store's write turn.
UPDATE stream_pending
SET delivered_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND consumer = ?4
  AND entry_id IN (SELECT value FROM json_each(?5))
