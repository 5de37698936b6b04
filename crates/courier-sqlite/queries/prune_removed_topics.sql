-- Retention, after prune_messages.sql: removed topic patterns that no
-- retained message is older than owe nothing any more (see
-- migrations/0008_removed_topics.sql). Touches: removed_topics (delete),
-- reads messages_enqueued's first entry. Locks: one autocommit statement.
DELETE FROM removed_topics
WHERE removed_at <= coalesce((SELECT min(created_at) FROM messages), 9223372036854775807)
