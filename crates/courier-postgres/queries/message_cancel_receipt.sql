-- The first subscription (by name) that completed message $1, if any.
-- Touches: receipts.
SELECT r.subscription FROM {schema}.receipts r
WHERE r.message_id = $1
ORDER BY r.subscription
LIMIT 1
