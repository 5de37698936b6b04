-- After subscription_topics_remove.sql, in its transaction: the moved
-- patterns leave subscription_topics. Touches: subscription_topics (delete).
DELETE FROM subscription_topics
WHERE subscription = ?1 AND pattern IN (SELECT value FROM json_each(?2))
