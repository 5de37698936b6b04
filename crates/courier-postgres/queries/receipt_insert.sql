-- Writes a receipt inside a transactional handler's transaction. No row
-- inserted means the effect was already applied by an earlier delivery. A
-- concurrent uncommitted receipt for the same key makes this wait for it.
INSERT INTO {schema}.receipts (tenant, subscription, message_id) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING
