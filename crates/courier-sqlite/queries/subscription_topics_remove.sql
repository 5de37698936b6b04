-- Removes the topic patterns of JSON array ?2 (exactly as registered) from
-- subscription ?1, moving them to removed_topics with removed_at ?3 (see
-- migrations/0008_removed_topics.sql); returns the patterns removed.
-- Touches: subscription_topics (delete), removed_topics (insert). Locks: a
-- write transaction, so producers commit wholly before or wholly after it;
-- deliveries already owed stay.
INSERT INTO removed_topics (subscription, pattern, prefix, since, since_id, removed_at)
SELECT subscription, pattern, prefix, since, since_id, ?3
FROM subscription_topics
WHERE subscription = ?1 AND pattern IN (SELECT value FROM json_each(?2))
RETURNING pattern
