-- Courier's outbox schema, version 13: a plain (non-transactional) handler's
-- completion only deletes its delivery; receipts are written by
-- transactional handlers alone, in their effect's transaction, where they
-- buy exactly-once. What operators see as `completed` is derived instead:
-- a retained message that a subscription receives, with no open delivery
-- of it for that subscription (and not discarded).
--
-- Which retained messages a subscription receives: those on a topic of one of
-- its patterns enqueued at or after the pattern's `since` (created_at, id).
-- A pattern added later receives from when it was added (the clock after the
-- fan-out lock is taken, so a message committed before the registration was
-- enqueued before it); a new subscription that replays receives from the
-- replay's start. Existing patterns receive from their subscription's
-- creation (messages they completed before this migration have receipts).
ALTER TABLE {schema}.subscription_topics
  ADD COLUMN since    timestamptz,
  ADD COLUMN since_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
UPDATE {schema}.subscription_topics t SET since = s.created_at
FROM {schema}.subscriptions s WHERE s.name = t.subscription;
ALTER TABLE {schema}.subscription_topics
  ALTER COLUMN since SET DEFAULT clock_timestamp(),
  ALTER COLUMN since SET NOT NULL;

-- A discarded dead letter is gone from deliveries but was never applied: it
-- is recorded here so that it is not taken for completed. Removed with its
-- message by retention.
CREATE TABLE {schema}.discards (
  message_id   uuid        NOT NULL,
  subscription text        NOT NULL,
  tenant       text        NOT NULL,
  discarded_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (message_id, subscription)
);
