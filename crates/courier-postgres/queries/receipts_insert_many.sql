-- Writes the receipts of a batch of transactional deliveries inside their
-- shared transaction; returns the (message, subscription) pairs written now.
-- A pair not returned was already applied by an earlier delivery. A concurrent
-- uncommitted receipt for the same pair makes this wait for it.
INSERT INTO {schema}.receipts (tenant, subscription, message_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[])
ON CONFLICT DO NOTHING
RETURNING message_id, subscription
