-- A page of subscriptions with their topic patterns, by name in byte order
-- ("C", as SQLite orders), after name $1 (NULL: from the first), at most $2.
-- Touches: reads subscriptions (primary key) and subscription_topics.
-- Locks: nothing.
SELECT s.name, s.paused, s.created_at,
       coalesce((SELECT array_agg(t.pattern ORDER BY t.pattern COLLATE "C")
                 FROM {schema}.subscription_topics t
                 WHERE t.subscription = s.name), '{}'::text[]) AS topics
FROM {schema}.subscriptions s
WHERE $1::text IS NULL OR s.name COLLATE "C" > $1::text
ORDER BY s.name COLLATE "C"
LIMIT $2
