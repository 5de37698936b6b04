-- Writes a receipt inside a transactional handler's transaction. No row
-- inserted means the effect was already applied by an earlier delivery.
-- Touches: receipts (insert). Locks: the handler's BEGIN IMMEDIATE transaction
-- holds the write lock, so no concurrent receipt for the same key can interleave.
INSERT INTO receipts (tenant, subscription, message_id) VALUES (?1, ?2, ?3)
ON CONFLICT (message_id, subscription) DO NOTHING
