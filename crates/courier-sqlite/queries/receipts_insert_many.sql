-- Writes a transactional group's receipts inside its transaction, before any
-- handler runs. ?1 is a JSON array of [tenant, subscription, message id].
-- Returns the receipts inserted: a missing one means that message's effect
-- was already applied by an earlier delivery, and its handler is skipped.
-- Touches: receipts (insert). Locks: the group's BEGIN IMMEDIATE transaction
-- holds the write lock, so no concurrent receipt for the same key can
-- interleave. (`WHERE true` lets SQLite parse the upsert after a SELECT.)
INSERT INTO receipts (tenant, subscription, message_id)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2
FROM json_each(?1) AS r
WHERE true
ON CONFLICT (message_id, subscription) DO NOTHING
RETURNING message_id, subscription
