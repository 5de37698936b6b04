-- A page of open deliveries per (subscription, topic) by state (retrying:
-- waiting after a failed attempt), with the age in seconds (database clock) of the oldest available or running one's
-- created_at, for tenants $1 (NULL: all), after the pair ($2, $3) (NULL:
-- from the first), at most $4 pairs. Only (subscription, topic) pairs with a
-- row in deliveries appear: completed work is deleted from deliveries, so a
-- subscription with nothing open has no row (list_subscriptions shows it).
-- Touches: reads deliveries (small: open work and dead letters only).
-- Locks: nothing. Ordered in byte order ("C") to match SQLite's; names are
-- ASCII, so that is also the order the cursor compares in.
SELECT d.subscription, d.topic,
       count(*) FILTER (WHERE d.state = 'available') AS available,
       count(*) FILTER (WHERE d.state = 'available' AND d.attempts > 0) AS retrying,
       count(*) FILTER (WHERE d.state = 'running') AS running,
       count(*) FILTER (WHERE d.state = 'dead') AS dead,
       extract(epoch FROM statement_timestamp()
               - min(d.created_at) FILTER (WHERE d.state IN ('available', 'running')))::float8
         AS oldest_pending_age_seconds
FROM {schema}.deliveries d
WHERE ($1::text[] IS NULL OR d.tenant = ANY ($1::text[]))
  AND ($2::text IS NULL
       OR d.subscription COLLATE "C" > $2::text
       OR (d.subscription = $2::text AND d.topic COLLATE "C" > $3::text))
GROUP BY d.subscription, d.topic
ORDER BY d.subscription COLLATE "C", d.topic COLLATE "C"
LIMIT $4
