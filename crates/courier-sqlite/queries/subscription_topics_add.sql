-- Adds topic patterns to subscription ?1; existing patterns are kept as they
-- are; returns the patterns added.
-- ?2 is a JSON array of [pattern, prefix] (prefix null for an exact topic, ''
-- for `*`, 'stem.' for `stem.*`). Touches: subscription_topics (insert).
-- Locks: runs in register_subscription's BEGIN IMMEDIATE transaction.
-- A pattern receives messages enqueued from ?3 on (`since`, see
-- migrations/0007_plain_completions.sql): the millisecond after the one this
-- transaction took the write lock in; the registration commits only once
-- the clock has reached it.
-- (`WHERE true` separates the SELECT from the upsert clause for SQLite's parser.)
INSERT INTO subscription_topics (subscription, pattern, prefix, since)
SELECT ?1, value ->> 0, value ->> 1, ?3
FROM json_each(?2) WHERE true
ON CONFLICT (subscription, pattern) DO NOTHING
RETURNING pattern
