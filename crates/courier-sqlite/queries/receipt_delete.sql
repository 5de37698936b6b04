-- Takes back the receipt of a group member whose handler failed, after its
-- savepoint rolled its writes back (receipts_insert_many.sql wrote it before
-- the savepoint). Touches: receipts (delete), inside the group's transaction.
DELETE FROM receipts
WHERE message_id = ?1
  AND subscription = ?2
