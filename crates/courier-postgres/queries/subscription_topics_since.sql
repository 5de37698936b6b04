-- A new subscription that replays receives its topics from the replay's start
-- ($2 created_at, NULL: every retained message; $3 id), not from its
-- registration: the admin views count a retained message it received, with
-- no open delivery, as completed. A start later than the registration (a
-- client's clock ahead of the database's) leaves the registration's own.
-- Touches: subscription_topics. Runs in the registering transaction, after
-- subscription_replay.sql.
UPDATE {schema}.subscription_topics
SET since = CASE WHEN $2::timestamptz IS NULL THEN '-infinity'
                 WHEN $2::timestamptz < since THEN $2::timestamptz
                 ELSE since END,
    since_id = CASE WHEN $2::timestamptz IS NULL OR $2::timestamptz < since THEN $3::uuid
                    ELSE since_id END
WHERE subscription = $1
