-- Adds topic patterns to subscription ?1; existing patterns are kept as they
-- are; returns the patterns added.
-- ?2 is a JSON array of [pattern, prefix] (prefix null for an exact topic, ''
-- for `*`, 'stem.' for `stem.*`). Touches: subscription_topics (insert).
-- Locks: runs in register_subscription's BEGIN IMMEDIATE transaction.
-- (`WHERE true` separates the SELECT from the upsert clause for SQLite's parser.)
INSERT INTO subscription_topics (subscription, pattern, prefix)
SELECT ?1, value ->> 0, value ->> 1 FROM json_each(?2) WHERE true
ON CONFLICT (subscription, pattern) DO NOTHING
RETURNING pattern
