-- The per-subscription state of one message: open deliveries from
-- deliveries; `discarded` from discards; `completed` for every subscription
-- the view `completions` names (it applied the message, a receipt, or
-- received it, and has neither an open delivery nor a discard of it; see
-- migrations/0008_removed_topics.sql): a plain handler's completion deletes
-- the delivery and writes nothing else.
-- Touches: reads deliveries, discards, receipts, messages,
-- subscription_topics and removed_topics through their keys. Locks: nothing.
SELECT d.subscription, d.state, d.attempts, d.errors, d.id AS delivery_id
FROM deliveries d WHERE d.message_id = ?1
UNION ALL
SELECT x.subscription, 'discarded', NULL, '[]', NULL
FROM discards x WHERE x.message_id = ?1
  AND NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = ?1 AND d.subscription = x.subscription)
UNION ALL
SELECT DISTINCT c.subscription, 'completed', NULL, '[]', NULL
FROM completions c WHERE c.message_id = ?1
ORDER BY 1
