-- A page of subscriptions with their topic patterns (a JSON array; the caller
-- sorts it, since SQLite does not promise an aggregate's order), by name,
-- after name ?1 (NULL: from the first), at most ?2.
-- Touches: reads subscriptions (primary key) and subscription_topics.
-- Locks: nothing.
SELECT s.name, s.paused, s.created_at,
       (SELECT json_group_array(t.pattern) FROM subscription_topics t
        WHERE t.subscription = s.name) AS topics
FROM subscriptions s
WHERE ?1 IS NULL OR s.name > ?1
ORDER BY s.name
LIMIT ?2
