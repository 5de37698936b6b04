-- Courier's outbox schema, version 14: which retained messages a subscription
-- received is read from when each message was fanned out, not from when its
-- producer's transaction began, and a removed pattern keeps what it was owed.
--
-- Version 13 read "received" as a pattern whose `since` is at or before the
-- message's (created_at, id). created_at is the producer transaction's start,
-- so a producer that began before a registration and committed after it was
-- fanned out to the new subscription yet read as enqueued before it; and a
-- pattern's removal forgot the deliveries it still had open, so once a plain
-- handler completed one the message read as owed nothing. Either way a cancel
-- was allowed of a message a plain handler had already applied.
--
-- Now:
-- - `messages.fanned_at` is the clock when the row was inserted, after the
--   statement took the fan-out lock (shared, to commit): a registration or
--   removal that holds the lock exclusively was either committed before it or
--   takes the lock after the producer commits. Rows from before this version
--   have none and read created_at.
-- - `subscription_topics.added_at` is the clock when the pattern was added,
--   under the fan-out lock; `since`/`since_id` stay the (created_at, id) bound
--   of what a replay owes it.
-- - Removing a pattern moves it to `removed_topics` with `removed_at`, the
--   clock under the fan-out lock: it still owes what was fanned out before.
--   Retention deletes it once no retained message is older.
-- - The view `received` names (message, subscription) pairs a subscription
--   applied (a receipt) or received, and `completions` those of them with
--   neither an open delivery nor a discard: the message view, the `completed`
--   listing and cancel all read them.
--
-- Adding fanned_at without a default and setting the default afterwards
-- leaves existing rows as they are (no table rewrite).
ALTER TABLE {schema}.messages ADD COLUMN fanned_at timestamptz;
ALTER TABLE {schema}.messages ALTER COLUMN fanned_at SET DEFAULT clock_timestamp();

-- Before any row of the statement is built, so fanned_at is read after the
-- lock is held. fan_out() takes it again after the rows (a no-op then).
CREATE FUNCTION {schema}.fan_out_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema}:fan-out', 0));
  RETURN NULL;
END $$;
CREATE TRIGGER messages_fan_out_lock BEFORE INSERT ON {schema}.messages
  FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fan_out_lock();

ALTER TABLE {schema}.subscription_topics ADD COLUMN added_at timestamptz;
UPDATE {schema}.subscription_topics SET added_at = since;
ALTER TABLE {schema}.subscription_topics
  ALTER COLUMN added_at SET DEFAULT clock_timestamp(),
  ALTER COLUMN added_at SET NOT NULL;

CREATE TABLE {schema}.removed_topics (
  subscription text        NOT NULL REFERENCES {schema}.subscriptions (name) ON DELETE CASCADE,
  pattern      text        NOT NULL,
  prefix       text,
  since        timestamptz NOT NULL,
  since_id     uuid        NOT NULL,
  added_at     timestamptz NOT NULL,
  removed_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX removed_topics_subscription ON {schema}.removed_topics (subscription);

-- Every (message, subscription) the subscription applied or received while
-- the message is retained; a pair may appear more than once.
CREATE VIEW {schema}.received AS
SELECT r.message_id, r.subscription FROM {schema}.receipts r
UNION ALL
SELECT m.id, t.subscription
FROM {schema}.messages m
JOIN (SELECT subscription, pattern, prefix, since, since_id, added_at,
             'infinity'::timestamptz AS removed_at
      FROM {schema}.subscription_topics
      UNION ALL
      SELECT subscription, pattern, prefix, since, since_id, added_at, removed_at
      FROM {schema}.removed_topics) t
  ON (t.pattern = m.topic OR (t.prefix IS NOT NULL AND starts_with(m.topic, t.prefix)))
 AND (coalesce(m.fanned_at, m.created_at) >= t.added_at
      OR (m.created_at, m.id) >= (t.since, t.since_id))
 AND coalesce(m.fanned_at, m.created_at) < t.removed_at;

-- What reads `completed`: received, with no open delivery and no discard.
CREATE VIEW {schema}.completions AS
SELECT o.message_id, o.subscription
FROM {schema}.received o
WHERE NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = o.message_id AND d.subscription = o.subscription)
  AND NOT EXISTS (SELECT 1 FROM {schema}.discards x
                  WHERE x.message_id = o.message_id AND x.subscription = o.subscription);
