-- Removes the entries whose ids are in the JSON array ?4 from the pending
-- lists of group ?3 on stream (?1 tenant, ?2 stream): an ack, a claim
-- dropping trimmed entries, a dead letter. The caller counts the rows.
-- Touches: stream_pending (delete by primary key). Locks: one autocommit
-- statement (ack) or inside the operation's BEGIN IMMEDIATE.
-- Shape: an id listed twice, or not pending, removes nothing more.
DELETE FROM stream_pending
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
  AND entry_id IN (SELECT value FROM json_each(?4))
