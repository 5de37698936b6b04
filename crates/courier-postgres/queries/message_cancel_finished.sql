-- The first subscription (by name) that finished message $1, if any, with how:
-- 'discarded' (a discard) or 'completed' (the view `completions`, as
-- message_deliveries.sql reports it).
-- Runs after message_cancel_lock.sql in the cancel's transaction, with a
-- snapshot of its own, so it sees a completion committed while that one
-- waited for its locks. Touches: reads receipts, discards, messages,
-- subscription_topics, removed_topics, deliveries.
SELECT subscription, state FROM (
  SELECT x.subscription, 'discarded' AS state
  FROM {schema}.discards x WHERE x.message_id = $1
    AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                    WHERE d.message_id = $1 AND d.subscription = x.subscription)
  UNION ALL
  SELECT c.subscription, 'completed' FROM {schema}.completions c WHERE c.message_id = $1
) f
ORDER BY subscription
LIMIT 1
