-- Removes the topic patterns of JSON array ?2 (exactly as registered) from
-- subscription ?1; returns the patterns removed. Touches: subscription_topics
-- (delete). Locks: a write transaction, so producers commit wholly before or
-- wholly after it; deliveries already owed stay.
DELETE FROM subscription_topics
WHERE subscription = ?1 AND pattern IN (SELECT value FROM json_each(?2))
RETURNING pattern
