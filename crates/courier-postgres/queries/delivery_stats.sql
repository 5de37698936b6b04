-- Open deliveries per (subscription, topic) by state, with the age in seconds
-- (database clock) of the oldest available or running one's created_at, for
-- tenants $1 (NULL: all). Only (subscription, topic) pairs with a row in
-- deliveries appear: completed work is deleted from deliveries, so a
-- subscription with nothing open has no row (list_subscriptions shows it).
-- Touches: reads deliveries (small: open work and dead letters only).
-- Locks: nothing. Ordered in byte order ("C") to match SQLite's.
SELECT d.subscription, d.topic,
       count(*) FILTER (WHERE d.state = 'available') AS available,
       count(*) FILTER (WHERE d.state = 'running') AS running,
       count(*) FILTER (WHERE d.state = 'dead') AS dead,
       extract(epoch FROM statement_timestamp()
               - min(d.created_at) FILTER (WHERE d.state IN ('available', 'running')))::float8
         AS oldest_pending_age_seconds
FROM {schema}.deliveries d
WHERE $1::text[] IS NULL OR d.tenant = ANY ($1::text[])
GROUP BY d.subscription, d.topic
ORDER BY d.subscription COLLATE "C", d.topic COLLATE "C"
