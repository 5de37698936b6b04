-- A new subscription that replays receives its topics from the replay's start
-- (?2 created_at in ms, NULL: every retained message; ?3 id), not from its
-- registration: the admin views count a retained message it received, with
-- no open delivery, as completed. Touches: subscription_topics. Locks: runs
-- in the registering BEGIN IMMEDIATE transaction, after subscription_replay.sql.
UPDATE subscription_topics
SET since = coalesce(?2, -9223372036854775808), since_id = ?3
WHERE subscription = ?1
