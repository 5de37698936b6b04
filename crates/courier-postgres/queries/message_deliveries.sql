-- The per-subscription state of one message: open deliveries from deliveries,
-- completed ones from receipts (which have no delivery id: the delivery row
-- is deleted when it completes).
SELECT d.subscription, d.state, d.attempts, d.errors::text AS errors,
       d.id AS delivery_id
FROM {schema}.deliveries d WHERE d.message_id = $1
UNION ALL
SELECT r.subscription, 'completed', NULL::int, '[]', NULL::bigint
FROM {schema}.receipts r
WHERE r.message_id = $1
  AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = $1 AND d.subscription = r.subscription)
ORDER BY 1
