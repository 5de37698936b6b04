-- A page of open deliveries per (subscription, topic) by state (retrying:
-- waiting after a failed attempt), with the age in seconds (database clock) of the oldest available or running one's
-- created_at, for tenants ?1 as a JSON array of names (NULL: all), after the
-- pair (?2, ?3) (NULL: from the first), at most ?4 pairs. Only (subscription,
-- topic) pairs with a row in deliveries appear: completed work is deleted
-- from deliveries, so a subscription with nothing open has no row
-- (subscriptions_list.sql shows it). Touches: reads deliveries (small: open
-- work and dead letters only). Locks: nothing.
SELECT d.subscription, d.topic,
       sum(d.state = 'available') AS available,
       sum(d.state = 'available' AND d.attempts > 0) AS retrying,
       sum(d.state = 'running') AS running,
       sum(d.state = 'dead') AS dead,
       (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
        - min(CASE WHEN d.state IN ('available', 'running') THEN d.created_at END)) / 1000.0
         AS oldest_pending_age_seconds
FROM deliveries d
WHERE (?1 IS NULL OR d.tenant IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR (d.subscription, d.topic) > (?2, ?3))
GROUP BY d.subscription, d.topic
ORDER BY d.subscription, d.topic
LIMIT ?4
