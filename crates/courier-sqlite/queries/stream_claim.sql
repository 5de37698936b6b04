-- Hands the pending entries whose ids are in the JSON array ?5, in group ?3
-- of stream (?1 tenant, ?2 stream), to consumer ?4: one more delivery each,
-- now. Returns their ids and delivery counts.
-- Touches: stream_pending (update by primary key). Locks: inside the
-- claim's BEGIN IMMEDIATE, after stream_claim_pick.sql chose the ids.
UPDATE stream_pending
SET consumer = ?4,
    deliveries = deliveries + 1,
    delivered_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
  AND entry_id IN (SELECT value FROM json_each(?5))
RETURNING entry_id, deliveries
