-- The per-subscription state of one message: open deliveries from deliveries,
-- completed ones from receipts (which have no delivery id: the delivery row is
-- deleted when it completes). Touches: reads deliveries and receipts through
-- their (message_id, subscription) keys. Locks: nothing.
SELECT d.subscription, d.state, d.attempts, d.errors, d.id AS delivery_id
FROM deliveries d WHERE d.message_id = ?1
UNION ALL
SELECT r.subscription, 'completed', NULL, '[]', NULL
FROM receipts r
WHERE r.message_id = ?1
  AND NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = ?1 AND d.subscription = r.subscription)
ORDER BY 1
