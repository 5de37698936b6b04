-- One subscription with its topic patterns, by name.
-- Touches: reads subscriptions (primary key) and subscription_topics.
-- Locks: nothing.
SELECT s.name, s.paused, s.created_at,
       coalesce((SELECT array_agg(t.pattern ORDER BY t.pattern COLLATE "C")
                 FROM {schema}.subscription_topics t
                 WHERE t.subscription = s.name), '{}'::text[]) AS topics
FROM {schema}.subscriptions s
WHERE s.name = $1
