-- A new subscription that replays receives its topics from the replay's start
-- ($2 created_at, NULL: every retained message; $3 id), not from its
-- registration: the admin views count a retained message it received, with
-- no open delivery, as completed. Touches: subscription_topics. Runs in the
-- registering transaction, after subscription_replay.sql.
UPDATE {schema}.subscription_topics
SET since = coalesce($2::timestamptz, '-infinity'), since_id = $3::uuid
WHERE subscription = $1
