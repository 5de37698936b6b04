-- Every subscription with its topic patterns (a JSON array; the caller sorts
-- it, since SQLite does not promise an aggregate's order), by name.
-- Touches: reads subscriptions and subscription_topics. Locks: nothing.
SELECT s.name, s.paused, s.created_at,
       (SELECT json_group_array(t.pattern) FROM subscription_topics t
        WHERE t.subscription = s.name) AS topics
FROM subscriptions s
ORDER BY s.name
