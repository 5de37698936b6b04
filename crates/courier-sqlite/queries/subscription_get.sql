-- One subscription with its topic patterns (a JSON array; the caller sorts
-- it), by name.
-- Touches: reads subscriptions (primary key) and subscription_topics.
-- Locks: nothing.
SELECT s.name, s.paused, s.created_at,
       (SELECT json_group_array(t.pattern) FROM subscription_topics t
        WHERE t.subscription = s.name) AS topics
FROM subscriptions s
WHERE s.name = ?1
