-- Pending entries per consumer of group ?3 on stream (?1 tenant, ?2 stream);
-- consumers with none have no row.
-- Touches: stream_pending (read along stream_pending_consumer). Locks: none.
SELECT consumer, count(*) AS count
FROM stream_pending
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
GROUP BY consumer
ORDER BY consumer
