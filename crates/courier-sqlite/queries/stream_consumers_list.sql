-- The consumers of group ?3 on stream (?1 tenant, ?2 stream) by name, each
-- with its pending count and how long since its last read or claim (ms,
-- database clock).
-- Touches: stream_consumers, stream_pending (read). Locks: none.
SELECT c.consumer,
       (SELECT count(*) FROM stream_pending p
        WHERE p.tenant = c.tenant AND p.stream = c.stream AND p.group_name = c.group_name
          AND p.consumer = c.consumer) AS pending,
       max(0, CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - c.seen_at) AS idle
FROM stream_consumers c
WHERE c.tenant = ?1 AND c.stream = ?2 AND c.group_name = ?3
ORDER BY c.consumer
