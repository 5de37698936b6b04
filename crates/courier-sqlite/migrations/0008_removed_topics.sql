-- Courier's outbox schema for SQLite, version 8: a removed topic pattern keeps
-- what it was owed. Version 7 deleted the pattern (writing receipts for what
-- it had completed), so a delivery still open at the removal read as owed
-- nothing once a plain handler completed it, and a cancel was allowed of a
-- message that handler had applied.
--
-- Removing a pattern now moves it to `removed_topics` with `removed_at`: the
-- millisecond after the one the removal took the write lock in (the removal
-- commits only once the clock has reached it), so every message enqueued
-- before the removal has an earlier created_at and every one after a later
-- or equal one. Retention deletes it once no retained message is older.
--
-- The view `received` names (message, subscription) pairs a subscription
-- applied (a receipt) or received while the message is retained, and
-- `completions` those with neither an open delivery nor a discard: the
-- message view, the `completed` listing and cancel read them. (One writer:
-- created_at is taken under the write lock, so unlike PostgreSQL no separate
-- fan-out time is needed.)
CREATE TABLE removed_topics (
  subscription TEXT    NOT NULL REFERENCES subscriptions (name) ON DELETE CASCADE,
  pattern      TEXT    NOT NULL,
  prefix       TEXT,
  since        INTEGER NOT NULL,
  since_id     TEXT    NOT NULL,
  removed_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX removed_topics_subscription ON removed_topics (subscription);

-- A pair may appear more than once.
CREATE VIEW received AS
SELECT r.message_id, r.subscription FROM receipts r
UNION ALL
SELECT m.id, t.subscription
FROM messages m
JOIN (SELECT subscription, pattern, prefix, since, since_id,
             9223372036854775807 AS removed_at
      FROM subscription_topics
      UNION ALL
      SELECT subscription, pattern, prefix, since, since_id, removed_at
      FROM removed_topics) t
  ON (t.pattern = m.topic
      OR (t.prefix IS NOT NULL AND substr(m.topic, 1, length(t.prefix)) = t.prefix))
 AND (m.created_at, m.id) >= (t.since, t.since_id)
 AND m.created_at < t.removed_at;

CREATE VIEW completions AS
SELECT o.message_id, o.subscription
FROM received o
WHERE NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = o.message_id AND d.subscription = o.subscription)
  AND NOT EXISTS (SELECT 1 FROM discards x
                  WHERE x.message_id = o.message_id AND x.subscription = o.subscription);
