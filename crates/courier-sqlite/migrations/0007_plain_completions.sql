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
-- replay's start. Existing patterns receive from their subscription's creation
-- (messages they completed before this migration have receipts). A row
-- written without `since` receives nothing by this rule.
ALTER TABLE subscription_topics ADD COLUMN since INTEGER;
ALTER TABLE subscription_topics
  ADD COLUMN since_id TEXT NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
UPDATE subscription_topics
SET since = (SELECT s.created_at FROM subscriptions s WHERE s.name = subscription_topics.subscription);

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
