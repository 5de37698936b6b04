-- Makes the entries whose ids are in the JSON array ?5 pending in group ?3
-- of stream (?1 tenant, ?2 stream) for consumer ?4: first delivery, now.
-- Touches: stream_pending (insert). Locks: inside the read's BEGIN IMMEDIATE.
-- Shape: the ids come from above the group's cursor, so none is pending yet;
-- a conflict would mean a corrupt cursor and fails the read.
INSERT INTO stream_pending
  (tenant, stream, group_name, entry_id, consumer, delivered_at, deliveries)
SELECT ?1, ?2, ?3, value, ?4, CAST(round(unixepoch('subsec') * 1000) AS INTEGER), 1
FROM json_each(?5)
