-- Open deliveries by state (retrying: waiting after a failed attempt) summed
-- over every (subscription, topic) of tenants $1 (NULL: all), or of
-- subscription $2 only, with the age in seconds (database clock) of the
-- oldest available or running one: the totals of every row
-- delivery_stats.sql pages through.
-- Touches: reads deliveries (small: open work and dead letters only).
-- Locks: nothing.
SELECT count(*) FILTER (WHERE d.state = 'available') AS available,
       count(*) FILTER (WHERE d.state = 'available' AND d.attempts > 0) AS retrying,
       count(*) FILTER (WHERE d.state = 'running') AS running,
       count(*) FILTER (WHERE d.state = 'dead') AS dead,
       extract(epoch FROM statement_timestamp()
               - min(d.created_at) FILTER (WHERE d.state IN ('available', 'running')))::float8
         AS oldest_pending_age_seconds
FROM {schema}.deliveries d
WHERE ($1::text[] IS NULL OR d.tenant = ANY ($1::text[]))
  AND ($2::text IS NULL OR d.subscription = $2::text)
