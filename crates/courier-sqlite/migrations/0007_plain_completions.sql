-- Courier's outbox schema for SQLite, version 7: a plain (non-transactional)
-- handler's completion only deletes its delivery; receipts are written by
-- transactional handlers alone, in their effect's transaction, where they buy
-- exactly-once. What operators see as `completed` is derived instead: a
-- retained message that a subscription receives, with no open delivery of it
-- for that subscription (and not discarded).
--
-- Which retained messages a subscription receives: those on a topic of one of
-- its patterns enqueued at or after the pattern's `since` (created_at ms, id).
-- A pattern added later receives from when it was added (one writer: a
-- message committed before the registration was enqueued before it, or in
-- the same millisecond); a new subscription that replays receives from the
-- replay's start. Existing patterns receive from their subscription's
-- creation, or from the oldest message it still has an open delivery of (a
-- replay's) if that is older: what they complete from now on must read
-- completed (what they completed before this migration has receipts). A row
-- written without `since` (by hand, or by an older build during a rolling
-- upgrade) receives from when it was written.
ALTER TABLE subscription_topics ADD COLUMN since INTEGER;
ALTER TABLE subscription_topics
  ADD COLUMN since_id TEXT NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
UPDATE subscription_topics
SET since = min(
  (SELECT s.created_at FROM subscriptions s WHERE s.name = subscription_topics.subscription),
  coalesce((SELECT min(m.created_at) FROM deliveries d JOIN messages m ON m.id = d.message_id
            WHERE d.subscription = subscription_topics.subscription),
           (SELECT s.created_at FROM subscriptions s WHERE s.name = subscription_topics.subscription)));
CREATE TRIGGER subscription_topics_since AFTER INSERT ON subscription_topics
WHEN new.since IS NULL
BEGIN
  UPDATE subscription_topics SET since = CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
  WHERE subscription = new.subscription AND pattern = new.pattern;
END;

-- A discarded dead letter is gone from deliveries but was never applied: it
-- is recorded here so that it is not taken for completed, and goes with its
-- message. Only a discard deletes a dead delivery (a cancel refuses one,
-- completions delete running ones), so the trigger is the discard's record.
CREATE TABLE discards (
  message_id   TEXT    NOT NULL,
  subscription TEXT    NOT NULL,
  tenant       TEXT    NOT NULL,
  discarded_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  PRIMARY KEY (message_id, subscription)
) STRICT;
-- Until now every completion wrote a receipt, so a retained message owed to a
-- subscription with neither a delivery nor a receipt was discarded (or its
-- receipt pruned while another dead letter kept the message): record it so.
INSERT INTO discards (message_id, subscription, tenant)
SELECT m.id, t.subscription, m.tenant
FROM messages m
JOIN subscription_topics t
  ON (t.pattern = m.topic
      OR (t.prefix IS NOT NULL AND substr(m.topic, 1, length(t.prefix)) = t.prefix))
 AND (m.created_at, m.id) >= (t.since, t.since_id)
WHERE NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = m.id AND d.subscription = t.subscription)
  AND NOT EXISTS (SELECT 1 FROM receipts r
                  WHERE r.message_id = m.id AND r.subscription = t.subscription)
ON CONFLICT (message_id, subscription) DO NOTHING;
CREATE TRIGGER deliveries_discarded AFTER DELETE ON deliveries
WHEN old.state = 'dead'
BEGIN
  INSERT INTO discards (message_id, subscription, tenant)
  VALUES (old.message_id, old.subscription, old.tenant)
  ON CONFLICT (message_id, subscription) DO UPDATE SET discarded_at = excluded.discarded_at;
END;
CREATE TRIGGER messages_discards_gone AFTER DELETE ON messages
BEGIN
  DELETE FROM discards WHERE message_id = old.id;
END;
