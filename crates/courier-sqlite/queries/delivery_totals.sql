-- Open deliveries by state (retrying: waiting after a failed attempt) summed
-- over every (subscription, topic) of tenants ?1 as a JSON array of names
-- (NULL: all), or of subscription ?2 only, with the age in seconds (database
-- clock) of the oldest available or running one: the totals of every row
-- delivery_stats.sql pages through.
-- Touches: reads deliveries (small: open work and dead letters only).
-- Locks: nothing.
SELECT coalesce(sum(d.state = 'available'), 0) AS available,
       coalesce(sum(d.state = 'available' AND d.attempts > 0), 0) AS retrying,
       coalesce(sum(d.state = 'running'), 0) AS running,
       coalesce(sum(d.state = 'dead'), 0) AS dead,
       (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
        - min(CASE WHEN d.state IN ('available', 'running') THEN d.created_at END)) / 1000.0
         AS oldest_pending_age_seconds
FROM deliveries d
WHERE (?1 IS NULL OR d.tenant IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR d.subscription = ?2)
