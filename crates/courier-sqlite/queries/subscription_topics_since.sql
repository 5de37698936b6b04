-- A new subscription that replays receives its topics from the replay's start
-- (?2 created_at in ms, NULL: every retained message; ?3 id), not from its
-- registration: the admin views count a retained message it received, with
-- no open delivery, as completed. A start later than the registration (a
-- client's clock ahead of the database's) leaves the registration's own.
-- Touches: subscription_topics. Locks: runs in the registering BEGIN
-- IMMEDIATE transaction, after subscription_replay.sql.
UPDATE subscription_topics
SET since = CASE WHEN ?2 IS NULL THEN -9223372036854775808
                 WHEN ?2 < since THEN ?2
                 ELSE since END,
    since_id = CASE WHEN ?2 IS NULL OR ?2 < since THEN ?3 ELSE since_id END
WHERE subscription = ?1
