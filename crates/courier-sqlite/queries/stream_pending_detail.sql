-- Up to ?5 pending entries of group ?3 on stream (?1 tenant, ?2 stream) above
-- id ?4, in id order, with their consumer, idle time (ms, database clock)
-- and deliveries; only consumer ?6's unless ?6 is NULL, only those idle at
-- least ?7 ms unless ?7 is NULL.
-- Touches: stream_pending (read along its primary key). Locks: none.
SELECT entry_id, consumer, deliveries,
       max(0, CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - delivered_at) AS idle
FROM stream_pending
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3 AND entry_id > ?4
  AND (?6 IS NULL OR consumer = ?6)
  AND (?7 IS NULL OR CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - delivered_at >= ?7)
ORDER BY entry_id
LIMIT ?5
