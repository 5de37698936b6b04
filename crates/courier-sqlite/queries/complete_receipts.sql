-- Writes the receipts of the deliveries complete.sql deleted, in its transaction.
-- ?1 is a JSON array of [tenant, subscription, message id].
-- Touches: receipts (insert). An existing receipt is kept as it is.
-- (`WHERE true` separates the SELECT from the upsert clause for SQLite's parser.)
INSERT INTO receipts (tenant, subscription, message_id)
SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?1) WHERE true
ON CONFLICT (message_id, subscription) DO NOTHING
