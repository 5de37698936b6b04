-- The first subscription (by name) that finished message $1, if any, with how:
-- 'discarded' (a discard) or 'completed' (a receipt, or a subscription that
-- receives it, see message_deliveries.sql, with no open delivery of it).
-- Runs after message_cancel_lock.sql in the cancel's transaction, with a
-- snapshot of its own, so it sees a completion committed while that one
-- waited for its locks. Touches: reads receipts, discards, messages,
-- subscription_topics, deliveries.
WITH owed AS (
  SELECT r.subscription FROM {schema}.receipts r WHERE r.message_id = $1
  UNION
  SELECT t.subscription
  FROM {schema}.messages m
  JOIN {schema}.subscription_topics t
    ON (t.pattern = m.topic OR (t.prefix IS NOT NULL AND starts_with(m.topic, t.prefix)))
   AND (m.created_at, m.id) >= (t.since, t.since_id)
  WHERE m.id = $1
)
SELECT subscription, state FROM (
  SELECT x.subscription, 'discarded' AS state
  FROM {schema}.discards x WHERE x.message_id = $1
  UNION ALL
  SELECT o.subscription, 'completed' FROM owed o
  WHERE NOT EXISTS (SELECT 1 FROM {schema}.discards x
                    WHERE x.message_id = $1 AND x.subscription = o.subscription)
) f
WHERE NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = $1 AND d.subscription = f.subscription)
ORDER BY subscription
LIMIT 1
