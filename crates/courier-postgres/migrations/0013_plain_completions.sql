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
-- creation, or from the oldest message it still has an open delivery of (a
-- replay's, or a producer's whose transaction began before the
-- registration) if that is older: what they complete from now on must read
-- completed (what they completed before this migration has receipts).
ALTER TABLE {schema}.subscription_topics
  ADD COLUMN since    timestamptz,
  ADD COLUMN since_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
UPDATE {schema}.subscription_topics t
SET since = least(s.created_at,
                  (SELECT min(m.created_at) FROM {schema}.deliveries d
                   JOIN {schema}.messages m ON m.id = d.message_id
                   WHERE d.subscription = t.subscription))
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
-- Until now every completion wrote a receipt, so a retained message owed to a
-- subscription with neither a delivery nor a receipt was discarded (or its
-- receipt pruned while another dead letter kept the message): record it so.
INSERT INTO {schema}.discards (message_id, subscription, tenant)
SELECT m.id, t.subscription, m.tenant
FROM {schema}.messages m
JOIN {schema}.subscription_topics t
  ON (t.pattern = m.topic OR (t.prefix IS NOT NULL AND starts_with(m.topic, t.prefix)))
 AND (m.created_at, m.id) >= (t.since, t.since_id)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = m.id AND d.subscription = t.subscription)
  AND NOT EXISTS (SELECT 1 FROM {schema}.receipts r
                  WHERE r.message_id = m.id AND r.subscription = t.subscription)
ON CONFLICT (message_id, subscription) DO NOTHING;
