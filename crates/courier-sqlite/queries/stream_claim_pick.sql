-- The pending entries of group ?3 on stream (?1 tenant, ?2 stream), of any
-- consumer, at or above id ?4 and not delivered for at least ?5 ms (database
-- clock): up to ?6, in id order, each with whether its entry was trimmed.
-- Touches: stream_pending (read along its primary key), stream_entries (by
-- primary key). Locks: inside the claim's BEGIN IMMEDIATE, so nobody else
-- reads, claims or acks them before the claim's update.
SELECT p.entry_id, e.id IS NULL AS trimmed
FROM stream_pending p
LEFT JOIN stream_entries e ON e.id = p.entry_id AND e.tenant = p.tenant AND e.stream = p.stream
WHERE p.tenant = ?1 AND p.stream = ?2 AND p.group_name = ?3 AND p.entry_id >= ?4
  AND CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - p.delivered_at >= ?5
ORDER BY p.entry_id
LIMIT ?6
